"""SwitchGNN's Graph-Aware Multicast Reordering (GAMR) and its slot-level switch model.

Each boundary vertex sends its row once to the switch, which adds it into the
aggregators of the vertex's neighbours; an aggregator's result leaves the switch
when the last row it needs has arrived. The send order decides how bursty those
completions are. ``gamr_order`` is the paper's priority-based BFS (PB, §3.2.2):
a BFS whose frontier is one global max-heap on degree, so high-degree vertices go
first and vertices sharing a neighbour go close together. ``random_order`` is the
strawman's order (RO). ``slot_model`` scores an order with the paper's
discrete-slot model (Eq. 3-6), which gives z = n for PB on a star of n vertices
and z = n + 2 for PB on a ring of n >= 4 (the best ring order gives n + 1).

Example::

    src = np.array([0, 1, 0, 2, 0, 3])  # a star, both directions
    dst = np.array([1, 0, 2, 0, 3, 0])
    order = gamr_order(src, dst)        # [0, 1, 2, 3]: the hub first
    slot_model(order, src, dst).z       # 4

Shapes (E directed edges, n distinct vertices of src and dst):
    src, dst   int64 [E]    global node IDs; u -> v: v's aggregator needs u's row
    order      int64 [n]    a send order, every vertex once
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass

import numpy as np

from graphwire.partition._depgraph import (
    check_edges,
    compact,
    symmetric_csr,
    undirected_pairs,
)

__all__ = ["SlotResult", "gamr_order", "random_order", "slot_model"]


def gamr_order(src: np.ndarray, dst: np.ndarray) -> np.ndarray:
    """The priority-based BFS send order of the dependency graph's vertices.

    Works on the undirected graph of the edges; a vertex's degree is its number
    of distinct neighbours (loops and repeats ignored). A max-heap holds the
    frontier keyed by degree, ties going to the vertex enqueued first (FIFO);
    each vertex is enqueued once, when first seen, and the dequeue order is the
    send order. Neighbours are enqueued in ascending ID order.

    The paper starts "from a randomly selected vertex", but its star analysis
    roots the BFS at the hub; we root at the unvisited vertex of highest degree
    (ties: smallest ID), so the order is deterministic. A disconnected graph
    restarts the same way at the next such vertex. O(E log E + V log V).

    Args:
        src, dst: int64 [E] edges ``u -> v`` (non-negative node IDs).

    Returns:
        int64 [n]: every vertex of ``src`` and ``dst`` exactly once.

    Raises:
        ValueError: ``src`` and ``dst`` are not equal-length arrays of
            non-negative integers.
    """
    src, dst = check_edges(src, dst)
    vertices, s, d = compact(src, dst)
    num_vertices = vertices.shape[0]
    _, lo, hi = undirected_pairs(s, d, num_vertices)
    indptr, indices = symmetric_csr(lo, hi, num_vertices)
    degree = np.diff(indptr)

    # Python lists: the heap loop touches one vertex at a time.
    starts, nbrs, deg = indptr.tolist(), indices.tolist(), degree.tolist()
    roots = np.lexsort((np.arange(num_vertices), -degree)).tolist()
    visited = bytearray(num_vertices)
    order: list[int] = []
    seq = 0
    for root in roots:
        if visited[root]:
            continue
        visited[root] = 1
        heap = [(-deg[root], seq, root)]
        seq += 1
        while heap:
            _, _, v = heapq.heappop(heap)
            order.append(v)
            for u in nbrs[starts[v] : starts[v + 1]]:
                if not visited[u]:
                    visited[u] = 1
                    heapq.heappush(heap, (-deg[u], seq, u))
                    seq += 1
    return vertices[np.asarray(order, dtype=np.int64)]


def random_order(src: np.ndarray, dst: np.ndarray, seed: int) -> np.ndarray:
    """The vertices of ``src`` and ``dst`` in a seeded random order (the strawman's).

    Returns:
        int64 [n]: ``np.random.default_rng(seed).permutation`` of the sorted IDs.
    """
    src, dst = check_edges(src, dst)
    vertices = np.unique(np.concatenate([src, dst]))
    return np.random.default_rng(seed).permutation(vertices)


@dataclass(frozen=True, slots=True)
class SlotResult:
    """The discrete-slot switch model's outcome for one send order (Eq. 3-6).

    Attributes:
        z: Job completion time in slots, ``T + ceil(Q(T) / k)`` with
            ``T = ceil(n / k)``.
        queue: int64 [T], ``Q(t)`` for t = 1..T: result packets waiting at the
            switch's output after slot t.
        completions: int64 [T], ``f(t)`` for t = 1..T: aggregators completed in
            slot t.
    """

    z: int
    queue: np.ndarray
    completions: np.ndarray


def slot_model(
    order: np.ndarray, src: np.ndarray, dst: np.ndarray, k: int = 1
) -> SlotResult:
    """Score a send order with the paper's discrete-slot switch model (Eq. 3-6).

    Vertices arrive ``k`` per slot in ``order`` (slot t holds positions
    ``(t-1)k .. tk-1``). The aggregator of each destination ``v`` (a vertex with
    an edge ``u -> v``) completes in the slot in which the last of its distinct
    sources arrives; f(t) counts completions in slot t. At most ``k`` results
    leave per slot: ``Q(t) = max(f(t) + Q(t-1) - k, 0)``, ``Q(0) = 0``, and
    ``z = ceil(n/k) + ceil(Q(ceil(n/k)) / k)``. A loop ``v -> v`` makes ``v`` a
    source of its own aggregator, as the model reads literally.

    Args:
        order: int64 [n] send order; must hold every vertex of ``src`` and
            ``dst`` once (it may add vertices without edges).
        src, dst: int64 [E] edges ``u -> v``.
        k: Packets in and out of the switch per slot (>= 1).

    Returns:
        The :class:`SlotResult` (z, Q(t), f(t)).

    Raises:
        ValueError: bad edges, ``k`` < 1, a vertex repeated in ``order`` or one
            missing from it.
    """
    src, dst = check_edges(src, dst)
    if isinstance(k, bool) or not isinstance(k, int | np.integer) or k < 1:
        raise ValueError(f"k: expected an int >= 1 (packets per slot), found {k!r}")
    k = int(k)
    order = np.asarray(order)
    if order.ndim != 1 or (order.size and not np.issubdtype(order.dtype, np.integer)):
        raise ValueError(
            f"order: expected a 1-D integer array of node IDs, found shape "
            f"{order.shape} and dtype {order.dtype}"
        )
    order = order.astype(np.int64, copy=False)
    by_id = np.argsort(order, kind="stable")
    sorted_ids = order[by_id]
    if sorted_ids.size and bool((sorted_ids[1:] == sorted_ids[:-1]).any()):
        repeats = np.unique(sorted_ids[1:][sorted_ids[1:] == sorted_ids[:-1]])
        raise ValueError(
            f"order: expected every vertex once, found {repeats.size} repeated "
            f"(first {int(repeats[0])})"
        )
    ends = np.concatenate([src, dst])
    pos = np.searchsorted(sorted_ids, ends)
    missing = pos >= sorted_ids.size
    missing[~missing] = sorted_ids[pos[~missing]] != ends[~missing]
    if missing.any():
        absent = np.unique(ends[missing])
        raise ValueError(
            f"order: expected every vertex of src and dst, found {absent.size} "
            f"missing (first {int(absent[0])})"
        )

    num_slots = -(-order.size // k)
    # Slot in which each vertex arrives, indexed by its position in sorted_ids.
    arrival = by_id // k + 1
    src_slot = arrival[pos[: src.size]]
    done = np.zeros(order.size, dtype=np.int64)
    np.maximum.at(done, pos[src.size :], src_slot)
    is_dst = np.zeros(order.size, dtype=bool)
    is_dst[pos[src.size :]] = True
    completions = np.bincount(done[is_dst], minlength=num_slots + 1)[1:]

    # Lindley's recursion in closed form: Q(t) = S(t) - min_{0 <= j <= t} S(j)
    # with S(t) = sum_{i <= t} (f(i) - k) and S(0) = 0.
    walk = np.concatenate([[0], np.cumsum(completions - k)])
    queue = (walk - np.minimum.accumulate(walk))[1:]
    backlog = int(queue[-1]) if num_slots else 0
    return SlotResult(
        z=num_slots + -(-backlog // k),
        queue=queue.astype(np.int64, copy=False),
        completions=completions.astype(np.int64, copy=False),
    )
