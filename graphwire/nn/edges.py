"""Per-edge operations on a :class:`~graphwire.nn.base.MessageGraph`.

The dot products of each edge's two ends, and a softmax over each destination's
in-edges.

Edges are in the graph's CSR order (E edges, H heads, F features).
"""

from __future__ import annotations

import torch

from graphwire.nn.base import MessageGraph

__all__ = ["edge_dots", "edge_softmax"]

# Edges per block of the gathered fallback of edge_dots (a block's two gathers
# are 2 x block x H x F values: 64 MiB at H x F = 512, float32).
_DOTS_BLOCK = 1 << 14


def edge_dots(mg: MessageGraph, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Per edge ``e`` of ``mg`` (CSR order), ``<a[dst(e)], b[src(e)]>``.

    Per head for 3-D rows: the gradient of an aggregation's edge weights (a
    sampled dense-dense product).

    float32 and float64 on CPU go through ``torch.sparse.sampled_addmm`` on
    ``mg``'s pattern, one head at a time, on strided views (no copy of the
    rows); anything else (another dtype or device, where that kernel is
    untested here, or more edges than ``num_dst * num_src``, repeated edges
    the kernel refuses) gathers both ends' rows a block of edges at a time,
    so that no [E, H, F] tensor is ever held.

    Args:
        mg: message graph with E edges.
        a: float [num_dst, F] or [num_dst, H, F] (the output's gradient).
        b: float [num_src, F] or [num_src, H, F], same dtype and heads.

    Returns:
        float [E] for 2-D rows, [E, H] for 3-D.
    """
    if a.dim() == 2:  # one head
        return edge_dots(mg, a.unsqueeze(1), b.unsqueeze(1)).squeeze(1)
    num_edges = mg.indices.shape[0]
    out = a.new_empty((num_edges, a.shape[1]))
    sampled = a.dtype in (torch.float32, torch.float64) and a.device.type == "cpu"
    # sampled_addmm refuses a pattern with more entries than its shape has
    # places ("only sparse compressed tensors with the same number of
    # specified elements"): a multigraph's repeated edges can make one.
    sampled = sampled and num_edges <= mg.num_dst * mg.num_src
    if sampled and num_edges:
        pattern = mg.adjacency(a.new_zeros(num_edges))
        for k in range(a.shape[1]):
            dots = torch.sparse.sampled_addmm(pattern, a[:, k], b[:, k].t(), beta=0.0)
            out[:, k].copy_(dots.values())
        return out
    dst, src = mg.dst_of_edges, mg.indices
    for start in range(0, num_edges, _DOTS_BLOCK):
        end = min(start + _DOTS_BLOCK, num_edges)
        block = a[dst[start:end]].mul_(b[src[start:end]])
        torch.sum(block, dim=-1, out=out[start:end])
    return out


def edge_softmax(mg: MessageGraph, scores: torch.Tensor) -> torch.Tensor:
    """Softmax of edge scores over each destination's in-edges.

    Subtracts the per-destination maximum first (``scatter_reduce`` amax), so large
    scores do not overflow; the maximum is a constant shift and is detached.

    Args:
        mg: the message graph.
        scores: float [E] or [E, H].

    Returns:
        float, same shape as ``scores``; sums to one over each destination's edges.
    """
    dst = mg.dst_of_edges
    index = dst.view(-1, *([1] * (scores.dim() - 1))).expand_as(scores)
    shape = (mg.num_dst, *scores.shape[1:])
    peak = torch.full(shape, float("-inf"), dtype=scores.dtype)
    peak = peak.scatter_reduce(0, index, scores.detach(), "amax", include_self=True)
    exp = (scores - peak[dst]).exp()
    denom = torch.zeros(shape, dtype=scores.dtype).index_add(0, dst, exp)
    return exp / denom[dst]
