"""Weighted sums and means of source rows into destinations, differentiable.

Both run as a sparse-CSR times dense product inside one
``torch.autograd.Function``. Its backward multiplies by the transposed CSR,
which the :class:`~graphwire.nn.base.MessageGraph` builds once and caches, as
it caches the permuted copy of its own constant weights; plain
``torch.sparse.mm`` under autograd would re-transpose the matrix every
backward.

Shapes (S = num_src, D = num_dst, E edges, H heads, F features):
    h_src   float [S, F] or [S, H, F]
    weight  float [E] (every head) or [E, H] (one per head)
    out     float [D, F] or [D, H, F]
"""

from __future__ import annotations

from typing import Any

import torch

from graphwire.nn.base import MessageGraph
from graphwire.nn.edges import edge_dots
from graphwire.nn.sparse import spmm

__all__ = ["spmm_mean", "spmm_sum"]


class _CSRSpMM(torch.autograd.Function):
    """``out[d] = sum_e w[e] * h[src[e]]`` over in-edges ``e`` of ``d``.

    ``weight`` is [E] for h [S, F] or [E, H] for h [S, H, F]; ``weight_t`` is
    ``weight[perm]`` when the caller has it cached (else it is gathered here).
    Gradients flow to ``h`` and, when it requires them, to ``weight``.

    Per-head weights take one product over every head, forward and backward
    (:meth:`MessageGraph.heads_adjacency`), rather than one product per head
    over a copy of its strided rows. Its index costs 8 bytes per edge and
    head and direction, kept with the graph.
    """

    @staticmethod
    def forward(  # type: ignore[override]
        ctx: Any,
        mg: MessageGraph,
        weight: torch.Tensor,
        weight_t: torch.Tensor | None,
        h: torch.Tensor,
    ) -> torch.Tensor:
        ctx.mg = mg
        ctx.weight_t = weight_t
        ctx.save_for_backward(weight, h if ctx.needs_input_grad[1] else None)
        if h.dim() == 2:
            return spmm(mg.adjacency(weight), h)
        num_src, heads, width = h.shape
        product = spmm(mg.heads_adjacency(weight), h.reshape(num_src * heads, width))
        return product.view(mg.num_dst, heads, width)

    @staticmethod
    def backward(  # type: ignore[override]
        ctx: Any, grad_out: torch.Tensor
    ) -> tuple[None, torch.Tensor | None, None, torch.Tensor | None]:
        mg: MessageGraph = ctx.mg
        weight, h = ctx.saved_tensors
        grad_out = grad_out.contiguous()
        grad_h = grad_w = None
        if ctx.needs_input_grad[3]:
            weight_t = ctx.weight_t
            if weight_t is None:
                weight_t = weight[mg._transpose[2]]
            if grad_out.dim() == 2:
                grad_h = spmm(mg.adjacency_t(weight_t), grad_out)
            else:
                num_dst, heads, width = grad_out.shape
                adjacency_t = mg.heads_adjacency(weight_t, transposed=True)
                rows = grad_out.view(num_dst * heads, width)
                grad_h = spmm(adjacency_t, rows).view(mg.num_src, heads, width)
        if ctx.needs_input_grad[1]:
            # Sampled dense-dense product: <grad_out[dst(e)], h[src(e)]> per edge.
            grad_w = edge_dots(mg, grad_out, h)
        return None, grad_w, None, grad_h


def spmm_sum(
    mg: MessageGraph, h_src: torch.Tensor, weight: torch.Tensor | None = None
) -> torch.Tensor:
    """Weighted sum of source rows into each destination.

    Args:
        mg: the message graph.
        h_src: float [num_src, F], or [num_src, H, F].
        weight: optional per-edge weights: [E], shared by every head of a 3-D
            ``h_src``, or [E, H] (one per head, 3-D ``h_src`` only); ``None``
            means all ones. May require grad (GAT attention).

    Returns:
        float [num_dst, F] (or [num_dst, H, F]) in ``h_src``'s dtype.
    """
    if h_src.shape[0] != mg.num_src:
        raise ValueError(
            f"h_src: expected {mg.num_src} rows (num_src), found {h_src.shape[0]}"
        )
    if h_src.dim() == 3 and (weight is None or weight.dim() == 1):
        # One weight per edge for every head: the heads' features are columns
        # of one [S, H * F] product (one sparse product, not H).
        num_src, heads, width = h_src.shape
        flat = spmm_sum(mg, h_src.reshape(num_src, heads * width), weight)
        return flat.view(mg.num_dst, heads, width)
    if weight is not None and weight.dim() != h_src.dim() - 1:
        raise ValueError(
            f"weight: expected [E] or, with h_src [S, H, F], [E, H]; found "
            f"{list(weight.shape)} with h_src {list(h_src.shape)}"
        )
    if weight is not None and weight.dim() == 2 and weight.shape[1] != h_src.shape[1]:
        raise ValueError(
            f"weight: expected one column per head of h_src ({h_src.shape[1]}), "
            f"found {weight.shape[1]}"
        )
    weight_t: torch.Tensor | None = None
    if weight is None:
        # All-ones values: the transpose needs no permutation.
        weight = torch.ones(mg.num_edges, dtype=h_src.dtype)
        weight_t = weight
    else:
        name = mg.own_weight_name(weight)
        if name is not None:
            weight_t = mg.transposed(name, weight).to(h_src.dtype)
        weight = weight.to(h_src.dtype)
    out: torch.Tensor = _CSRSpMM.apply(mg, weight, weight_t, h_src)
    return out


def spmm_mean(mg: MessageGraph, h_src: torch.Tensor) -> torch.Tensor:
    """Mean of source rows over each destination's in-edges (0 where there are none).

    Args:
        mg: the message graph.
        h_src: float [num_src, F] or [num_src, H, F].

    Returns:
        float [num_dst, F] (or [num_dst, H, F]).
    """
    return spmm_sum(mg, h_src, mg.mean_weight)
