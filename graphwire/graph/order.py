"""Orders and index dtypes: counting sorts, int32 indices, locality node orders.

`stable_order`: a stable sort of small non-negative integer keys in linear time;
`index_dtype`: the narrowest index dtype (int32 or int64) that holds given bounds;
`locality_order`: a node order that puts neighbours near each other in memory.

Grouping edges by source (a CSR's transpose), halo rows by owner or nodes by
part are all the same step: the permutation that sorts integer keys stably.
``torch.sort(keys, stable=True)`` and ``np.argsort(kind="stable")`` compare
keys, O(E log E); keys below a bound that is not much larger than their count
sort by counting instead. scipy's CSR-to-CSC conversion is that counting
sort, written in C: each position ``i`` is row ``i`` of a matrix with one
entry, in column ``keys[i]``, and the CSC form lists each column's rows in
ascending order (scipy marks it ``has_sorted_indices``), that is the
positions, key by key, in their original order.

Index arrays (CSR row pointers and columns, positions) are int32 wherever
their values fit: MKL's sparse kernels run faster on them, and random
access into a table of int32 moves half the bytes. `index_dtype` is
that one decision, made the same way everywhere.
"""

from __future__ import annotations

import numpy as np
import torch

__all__ = ["NODE_ORDERS", "index_dtype", "locality_order", "stable_order"]

# Keys spread wider than this many times their count (plus a constant, for
# short inputs) sort by comparison: counting would allocate one slot per value.
_SPREAD = 4
_SMALL = 1024
_INT32_MAX = int(torch.iinfo(torch.int32).max)


def index_dtype(*bounds: int) -> torch.dtype:
    """``torch.int32`` when every bound fits in int32, else ``torch.int64``.

    A bound is a count, or the largest value an index array will hold.
    """
    return torch.int32 if max(bounds, default=0) <= _INT32_MAX else torch.int64


def stable_order(keys: torch.Tensor) -> torch.Tensor:
    """int64 [n]: the permutation that sorts ``keys`` stably.

    Equal to ``torch.sort(keys, stable=True).indices``.

    Args:
        keys: 1-D integer tensor of values >= 0.

    Raises:
        ValueError: ``keys`` is not a 1-D integer tensor, or holds a negative
            value.
    """
    if keys.dim() != 1 or keys.dtype.is_floating_point or keys.dtype == torch.bool:
        raise ValueError(
            f"stable_order: expected 1-D integer keys, got {keys.dtype} "
            f"{list(keys.shape)}"
        )
    n = keys.numel()
    if n == 0:
        return torch.empty(0, dtype=torch.int64, device=keys.device)
    low, high = int(keys.min()), int(keys.max())
    if low < 0:
        raise ValueError(f"stable_order: keys must be >= 0, found {low}")
    if keys.device.type != "cpu" or high > _SPREAD * n + _SMALL:
        return torch.sort(keys, stable=True).indices
    import scipy.sparse  # here: a slow import that most commands never need

    dtype = np.int32 if index_dtype(n, high + 1) == torch.int32 else np.int64
    rows = scipy.sparse.csr_matrix(
        (
            np.ones(n, dtype=np.int8),
            keys.numpy().astype(dtype, copy=False),
            np.arange(n + 1, dtype=dtype),
        ),
        shape=(n, high + 1),
    )
    return torch.from_numpy(rows.tocsc().indices).to(torch.int64)


# How a graph's nodes are laid out in memory: ``id`` keeps the given IDs'
# order, ``rcm`` is :func:`locality_order`'s.
NODE_ORDERS = ("rcm", "id")


def locality_order(
    indptr: torch.Tensor,
    indices: torch.Tensor,
    group: torch.Tensor | None = None,
) -> torch.Tensor:
    """int64 [N]: the nodes of the in-CSR in reverse Cuthill-McKee order.

    The order is that of the undirected form of ``(indptr, indices)`` (scipy's
    ``reverse_cuthill_mckee``): a breadth-first order that keeps each node's
    neighbours within a narrow band of positions, so a sparse product over
    rows laid out in it reads its source rows from a small moving window of
    memory instead of from all over the table (DGL's ``reorder_graph`` with
    ``rcmk``).

    Args:
        indptr: int64 [N + 1].
        indices: int64 [E], sources in ``[0, N)``.
        group: optional int64 [N] (a part per node): only edges within a group
            count, so each group's nodes come out in an order of their own
            (sort the result stably by group to lay the groups out one after
            another).
    """
    import scipy.sparse
    from scipy.sparse.csgraph import reverse_cuthill_mckee

    num_nodes = indptr.numel() - 1
    if num_nodes == 0:  # (scipy's reduction has no identity for no nodes)
        return torch.empty(0, dtype=torch.int64)
    src = indices.numpy()
    dst = np.repeat(np.arange(num_nodes), np.diff(indptr.numpy()))
    if group is not None:
        keep = (group[indices] == group[torch.from_numpy(dst)]).numpy()
        src, dst = src[keep], dst[keep]
    ones = np.ones(src.size, dtype=np.int32)  # (int8 sums of parallel edges wrap)
    adjacency = scipy.sparse.csr_matrix(
        (ones, (dst, src)), shape=(num_nodes, num_nodes)
    )
    undirected = (adjacency + adjacency.T).tocsr()
    order = reverse_cuthill_mckee(undirected, symmetric_mode=True)
    return torch.from_numpy(order.astype(np.int64))
