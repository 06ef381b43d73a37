"""`GCNConv`: the graph convolution of Kipf & Welling (ICLR 2017).

``h' = Â (h W) + b`` where ``Â`` holds one weight per edge:

- ``mg.edge_weight`` when the MessageGraph carries it. Full-graph training attaches
  ``Graph.gcn_norm`` of the self-looped graph (``D^-1/2 (A + I) D^-1/2``);
  distributed engines attach the same weights computed from *global* degrees, so
  a partition's owned+halo MessageGraph gives exactly the single-process result.
- otherwise the symmetric normalisation of the MessageGraph's own degrees,
  ``1/sqrt(out_deg(src) * in_deg(dst))`` (DGL ``GraphConv(norm="both")`` on a
  block).

Shapes: ``h_src`` float [num_src, in_dim] -> float [num_dst, out_dim].
"""

from __future__ import annotations

import torch
from torch import nn

from graphwire.nn.base import MessageGraph, spmm_sum

__all__ = ["GCNConv"]


class GCNConv(nn.Module):
    """One GCN layer.

    Args:
        in_dim: input feature width.
        out_dim: output feature width.
        bias: add a learnable bias after aggregation.
    """

    def __init__(self, in_dim: int, out_dim: int, bias: bool = True) -> None:
        super().__init__()
        self.in_dim = in_dim
        self.out_dim = out_dim
        self.weight = nn.Parameter(torch.empty(in_dim, out_dim))
        self.bias = nn.Parameter(torch.empty(out_dim)) if bias else None
        self.reset_parameters()

    def reset_parameters(self) -> None:
        nn.init.xavier_uniform_(self.weight)
        if self.bias is not None:
            nn.init.zeros_(self.bias)

    def forward(self, mg: MessageGraph, h_src: torch.Tensor) -> torch.Tensor:
        """Aggregate normalised neighbour messages.

        Args:
            mg: message graph; ``mg.edge_weight`` (float32 [E]) is used if set.
            h_src: float [num_src, in_dim].

        Returns:
            float [num_dst, out_dim].
        """
        norm = mg.edge_weight if mg.edge_weight is not None else mg.sym_norm
        if self.in_dim > self.out_dim:
            # Â(hW) == (Âh)W: multiply first so the sparse product moves fewer
            # columns.
            out = spmm_sum(mg, h_src @ self.weight, norm)
        else:
            out = spmm_sum(mg, h_src, norm) @ self.weight
        if self.bias is not None:
            out = out + self.bias
        return out

    def extra_repr(self) -> str:
        return f"{self.in_dim}, {self.out_dim}, bias={self.bias is not None}"
