"""The boundary dependency graph's arrays, shared by GAMR and multi-level blocks.

An edge ``u -> v`` of the dependency graph says that destination ``v``'s
aggregator needs ``u``'s row. Node IDs are arbitrary non-negative integers, so
the helpers here compact them to ``0..V-1`` and build the undirected, simple
graph that ordering and partitioning work on.

Shapes (E directed edges, V distinct vertices, P distinct undirected pairs):
    src, dst       int64 [E]     global node IDs
    vertices       int64 [V]     sorted distinct IDs of src and dst
    s, d           int64 [E]     positions of src and dst in ``vertices``
    pair_of_edge   int64 [E]     the undirected pair each edge belongs to
    lo, hi         int64 [P]     the pair's endpoints, lo <= hi (lo == hi: a loop)
    indptr         int64 [V + 1] symmetric CSR without loops; rows sorted
    indices        int64 [2 * (P - loops)]
"""

from __future__ import annotations

import numpy as np

__all__ = ["check_edges", "compact", "symmetric_csr", "undirected_pairs"]


def check_edges(src: object, dst: object) -> tuple[np.ndarray, np.ndarray]:
    """``src`` and ``dst`` as int64 [E] arrays, or a ValueError saying what is wrong."""
    src_a, dst_a = np.asarray(src), np.asarray(dst)
    if src_a.ndim != 1 or src_a.shape != dst_a.shape:
        raise ValueError(
            f"src and dst: expected two 1-D arrays of the same length [E], found "
            f"shapes {src_a.shape} and {dst_a.shape}"
        )
    for name, array in (("src", src_a), ("dst", dst_a)):
        if array.size and not np.issubdtype(array.dtype, np.integer):
            raise ValueError(f"{name}: expected integer node IDs, found {array.dtype}")
        if array.size and int(array.min()) < 0:
            raise ValueError(
                f"{name}: expected non-negative node IDs, found {int(array.min())}"
            )
    return src_a.astype(np.int64, copy=False), dst_a.astype(np.int64, copy=False)


def compact(
    src: np.ndarray, dst: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(vertices, s, d)``: the distinct IDs, and both ends as positions in them."""
    vertices, inverse = np.unique(np.concatenate([src, dst]), return_inverse=True)
    inverse = inverse.astype(np.int64, copy=False)
    return vertices, inverse[: src.shape[0]], inverse[src.shape[0] :]


def undirected_pairs(
    s: np.ndarray, d: np.ndarray, num_vertices: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(pair_of_edge, lo, hi)``: each edge's undirected pair; pairs sorted.

    ``u -> v``, ``v -> u`` and repeats of either map to one pair; a loop
    ``u -> u`` is the pair ``(u, u)``.
    """
    lo, hi = np.minimum(s, d), np.maximum(s, d)
    keys, pair_of_edge = np.unique(lo * num_vertices + hi, return_inverse=True)
    return (
        pair_of_edge.astype(np.int64, copy=False),
        keys // max(num_vertices, 1),
        keys % max(num_vertices, 1),
    )


def symmetric_csr(
    lo: np.ndarray, hi: np.ndarray, num_vertices: int
) -> tuple[np.ndarray, np.ndarray]:
    """``(indptr, indices)`` of the distinct pairs in both directions, loops dropped.

    Each row's neighbours are in ascending order. The pairs must be distinct.
    """
    keep = lo != hi
    rows = np.concatenate([lo[keep], hi[keep]])
    cols = np.concatenate([hi[keep], lo[keep]])
    order = np.lexsort((cols, rows))
    indptr = np.zeros(num_vertices + 1, dtype=np.int64)
    np.cumsum(np.bincount(rows, minlength=num_vertices), out=indptr[1:])
    return indptr, cols[order]
