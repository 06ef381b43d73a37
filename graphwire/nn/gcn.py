"""`GCNConv`: the graph convolution of Kipf & Welling (ICLR 2017).

``h' = Â (h W) + b`` where ``Â`` holds one weight per edge:

- ``mg.edge_weight`` when the MessageGraph carries it. Full-graph training attaches
  ``Graph.gcn_norm`` of the self-looped graph: edge ``src -> dst`` weighs
  ``1/sqrt(out_deg(src) * in_deg(dst))``, degrees counted in ``A + I``, i.e.
  ``Â = D_in^-1/2 (A + I) D_out^-1/2`` with ``A[dst, src]`` = 1 per edge,
  ``D_in`` its row sums and ``D_out`` its column sums (DGL's
  ``GraphConv(norm="both")``); distributed engines attach the same weights
  computed from *global* degrees, so a partition's owned+halo MessageGraph
  gives exactly the single-process result.
- otherwise the same normalisation from the MessageGraph's own degrees,
  ``1/sqrt(out_deg(src) * in_deg(dst))`` (DGL ``GraphConv(norm="both")`` on a
  block).

On a symmetric graph ``D_in = D_out = D`` and this is Kipf & Welling's
``D^-1/2 (A + I) D^-1/2``. On a directed graph it differs from PyTorch
Geometric's ``gcn_norm``, which uses the in-degree at both ends
(``1/sqrt(in_deg(src) * in_deg(dst))``); symmetrise the graph first to get
the same weights from both.

Shapes: ``h_src`` float [num_src, in_dim] -> float [num_dst, out_dim].
"""

from __future__ import annotations

import torch
from torch import nn

from graphwire.nn.aggregate import spmm_sum
from graphwire.nn.base import MessageGraph
from graphwire.nn.layer import ProjectsToOutput, check_size

__all__ = ["GCNConv"]


class GCNConv(ProjectsToOutput, nn.Module):
    """One GCN layer.

    Args:
        in_dim: input feature width.
        out_dim: output feature width.
        bias: add a learnable bias after aggregation.
    """

    def __init__(self, in_dim: int, out_dim: int, bias: bool = True) -> None:
        super().__init__()
        self.in_dim = check_size(in_dim, "GCNConv in_dim")
        self.out_dim = check_size(out_dim, "GCNConv out_dim")
        # float32 as Graph.x is, whatever torch's default dtype.
        f32 = torch.float32
        self.weight = nn.Parameter(torch.empty(in_dim, out_dim, dtype=f32))
        self.bias = nn.Parameter(torch.empty(out_dim, dtype=f32)) if bias else None
        self.reset_parameters()

    def reset_parameters(self) -> None:
        nn.init.xavier_uniform_(self.weight)
        if self.bias is not None:
            nn.init.zeros_(self.bias)

    # propagate() reads no destination input rows (no root term).
    reads_dst_rows = False

    def project(self, h: torch.Tensor) -> torch.Tensor:
        """Row-wise part a row's owner can apply: float [n, in] -> [n, out]."""
        return h @ self.weight

    def propagate(
        self, mg: MessageGraph, m_src: torch.Tensor, h_dst: torch.Tensor | None
    ) -> torch.Tensor:
        """The layer on projected source rows: ``Â m_src + b``.

        Args:
            mg: message graph.
            m_src: float [num_src, out_dim], :meth:`project` of the source rows.
            h_dst: the destinations' input rows (unused, may be None: GCN has
                no root term).
        """
        return self.finish(spmm_sum(mg, m_src, self.edge_weights(mg)), h_dst)

    # propagate() is finish() of a weighted sum of its source rows: the sum
    # splits over any grouping of the sources (graphwire.nn.models.SumsSources).
    sums_sources = True

    def edge_weights(self, mg: MessageGraph) -> torch.Tensor:
        """float32 [E]: ``Â``'s entry of every edge of ``mg``, in CSR order."""
        return mg.edge_weight if mg.edge_weight is not None else mg.sym_norm

    def finish(self, agg: torch.Tensor, h_dst: torch.Tensor | None) -> torch.Tensor:
        """What propagate() applies to the weighted sum: the bias.

        ``h_dst`` is unused."""
        return agg + self.bias if self.bias is not None else agg

    def forward(self, mg: MessageGraph, h_src: torch.Tensor) -> torch.Tensor:
        """Aggregate normalised neighbour messages.

        Args:
            mg: message graph; ``mg.edge_weight`` (float32 [E]) is used if set.
            h_src: float [num_src, in_dim].

        Returns:
            float [num_dst, out_dim].
        """
        if self.projects_first:
            return self.propagate(mg, self.project(h_src), mg.dst_rows(h_src))
        agg = spmm_sum(mg, h_src, self.edge_weights(mg))
        if self.bias is None:
            return agg @ self.weight
        # One BLAS call adds the bias as it writes the product: no second
        # pass over the [num_dst, out_dim] result (finish's ``+ bias``).
        return torch.addmm(self.bias, agg, self.weight)

    def extra_repr(self) -> str:
        return f"{self.in_dim}, {self.out_dim}, bias={self.bias is not None}"
