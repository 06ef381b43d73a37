"""`SAGEConv`: GraphSAGE with the mean aggregator (Hamilton et al., NeurIPS 2017).

``h'_d = W_self h_d + W_neigh mean_{s -> d} h_s + b``, as PyG ``SAGEConv`` and DGL
``SAGEConv(aggregator_type="mean")``. The destination's own row is
``mg.dst_rows(h_src)`` (the first source rows, unless the MessageGraph names
them with ``dst_index``); a destination
without in-edges gets a zero neighbour mean.

Shapes: ``h_src`` float [num_src, in_dim] -> float [num_dst, out_dim].
"""

from __future__ import annotations

import torch
from torch import nn

from graphwire.nn.aggregate import spmm_mean
from graphwire.nn.base import MessageGraph
from graphwire.nn.layer import ProjectsToOutput, check_size

__all__ = ["SAGEConv"]


class SAGEConv(ProjectsToOutput, nn.Module):
    """One GraphSAGE-mean layer.

    Args:
        in_dim: input feature width.
        out_dim: output feature width.
        bias: add a learnable bias.
    """

    def __init__(self, in_dim: int, out_dim: int, bias: bool = True) -> None:
        super().__init__()
        self.in_dim = check_size(in_dim, "SAGEConv in_dim")
        self.out_dim = check_size(out_dim, "SAGEConv out_dim")
        # float32 as Graph.x is, whatever torch's default dtype.
        f32 = torch.float32
        self.lin_self = nn.Linear(in_dim, out_dim, bias=False, dtype=f32)
        self.lin_neigh = nn.Linear(in_dim, out_dim, bias=False, dtype=f32)
        self.bias = nn.Parameter(torch.empty(out_dim, dtype=f32)) if bias else None
        self.reset_parameters()

    def reset_parameters(self) -> None:
        nn.init.xavier_uniform_(self.lin_self.weight)
        nn.init.xavier_uniform_(self.lin_neigh.weight)
        if self.bias is not None:
            nn.init.zeros_(self.bias)

    # propagate() reads the destinations' own input rows (the root term).
    reads_dst_rows = True

    def project(self, h: torch.Tensor) -> torch.Tensor:
        """Row-wise part a row's owner can apply: float [n, in] -> [n, out]."""
        out: torch.Tensor = self.lin_neigh(h)
        return out

    def propagate(
        self, mg: MessageGraph, m_src: torch.Tensor, h_dst: torch.Tensor | None
    ) -> torch.Tensor:
        """The layer on projected source rows.

        Args:
            mg: message graph.
            m_src: float [num_src, out_dim], :meth:`project` of the source rows.
            h_dst: float [num_dst, in_dim], the destinations' own input rows.
        """
        return self.finish(spmm_mean(mg, m_src), h_dst)

    # propagate() is finish() of a weighted sum (the mean) of its source rows:
    # the sum splits over any grouping of the sources
    # (graphwire.nn.models.SumsSources).
    sums_sources = True

    def edge_weights(self, mg: MessageGraph) -> torch.Tensor:
        """float32 [E]: the mean's weight of every edge of ``mg``, in CSR order.

        The weight is ``1 / in_degree(dst)``."""
        return mg.mean_weight

    def finish(self, agg: torch.Tensor, h_dst: torch.Tensor | None) -> torch.Tensor:
        """What propagate() applies to the neighbour mean: the root term and bias.

        ``agg`` [num_dst, out_dim] is the mean; the root term is of ``h_dst``
        [num_dst, in_dim]."""
        if h_dst is None:
            raise ValueError("SAGEConv.propagate: needs h_dst, the root term's rows")
        return self._combine(h_dst, agg)

    def forward(self, mg: MessageGraph, h_src: torch.Tensor) -> torch.Tensor:
        """Combine each destination's own row with the mean of its neighbours.

        Args:
            mg: message graph (``edge_weight`` is ignored).
            h_src: float [num_src, in_dim].

        Returns:
            float [num_dst, out_dim].
        """
        if self.projects_first:
            return self.propagate(mg, self.project(h_src), mg.dst_rows(h_src))
        neigh = self.lin_neigh(spmm_mean(mg, h_src))
        return self._combine(mg.dst_rows(h_src), neigh)

    def _combine(self, h_dst: torch.Tensor, neigh: torch.Tensor) -> torch.Tensor:
        """``lin_self(h_dst) + neigh + bias`` with one new [num_dst, out_dim]
        tensor: addmm writes the root term's product onto a copy of ``neigh``,
        and the bias is added to that in place (addmm's backward needs its
        inputs, not its result; ``neigh`` itself, which may be a leaf that
        needs a gradient, is only read)."""
        out = torch.addmm(neigh, h_dst, self.lin_self.weight.t())
        return out.add_(self.bias) if self.bias is not None else out

    def extra_repr(self) -> str:
        return f"{self.in_dim}, {self.out_dim}, aggregator=mean"
