"""SwitchGNN's multi-level partitioning of the boundary dependency graph into blocks.

The switch holds one aggregator per destination vertex in flight, so the
vertices that exchange rows at one time must fit its capacity ``cap``. Blocks
are sent one after another; a block is a set of inter-worker edges whose
vertices number at most ``cap``. Every edge lies in exactly one block, so the
host can add a vertex's partial aggregates from all its blocks and propagation
stays exact; a vertex in several blocks sends (and receives) once per block.

How the blocks are found (paper §3.3, with the packing and the fallback ours):

1. Take each pending edge set H (at first, all edges) and split it into the
   connected components of its undirected graph.
2. Components of at most ``cap`` vertices are kept as items.
3. A larger component is cut by METIS into ``ceil(|V| / (0.9 cap))`` parts, each
   allowed to grow to ``cap``. Each part's internal edges and the cut edges (ends
   in different parts: the next level's graph) go back to pending, to be split
   and cut again until they fit; so does a part that METIS, whose balance is
   approximate, left too large. If METIS makes no progress (one piece keeps
   every edge), the component is split greedily instead: its edges, in order,
   are cut into runs whose vertices number at most ``cap``.
4. At the end all items are packed into blocks by first-fit decreasing on their
   vertex count. Items may share vertices (a part and the cut graph do), so a
   block's vertex count is at most the sum of its items' counts.

Edges are handled as undirected pairs: ``u -> v``, ``v -> u`` and repeats of
either always share a block.

Example::

    blocks = multilevel_blocks(src, dst, cap=4096, seed=0)
    for block in blocks:                  # one synchronised round each
        nodes = block_vertices(src, dst, block)   # <= 4096 aggregators

Shapes (E directed inter-worker edges, B blocks):
    src, dst   int64 [E]          global node IDs, u -> v
    blocks     B x int64 [E_b]    edge indices into src/dst, ascending

Determinism: METIS is deterministic for the same input and seed
(``METIS_OPTION_SEED``, mapped from ``seed`` as in ``partition/metis.py``), and
everything else here is ordered by vertex and edge IDs.
"""

from __future__ import annotations

import numpy as np
import scipy.sparse as sp
from scipy.sparse.csgraph import connected_components

from graphwire.partition import _metislib
from graphwire.partition._depgraph import (
    check_edges,
    compact,
    symmetric_csr,
    undirected_pairs,
)

__all__ = ["block_vertices", "multilevel_blocks", "single_block"]

# Aim METIS's parts below cap: its balance constraint is only approximate.
_HEADROOM = 0.9


def single_block(num_edges: int) -> list[np.ndarray]:
    """All edges in one block (``[arange(E)]``; ``[]`` without edges).

    The blocking of ``--switch-blocks none``: the switch is assumed large enough.
    """
    if isinstance(num_edges, bool) or not isinstance(num_edges, int | np.integer):
        raise ValueError(f"num_edges: expected an int >= 0, found {num_edges!r}")
    if num_edges < 0:
        raise ValueError(f"num_edges: expected an int >= 0, found {num_edges}")
    return [np.arange(num_edges, dtype=np.int64)] if num_edges else []


def block_vertices(src: np.ndarray, dst: np.ndarray, block: np.ndarray) -> np.ndarray:
    """The sorted distinct node IDs of a block's edges, int64 [V_b]."""
    return np.unique(np.concatenate([src[block], dst[block]])).astype(np.int64)


def multilevel_blocks(
    src: np.ndarray, dst: np.ndarray, cap: int, *, seed: int = 0
) -> list[np.ndarray]:
    """Split the edges into blocks of at most ``cap`` vertices each (module docstring).

    Args:
        src, dst: int64 [E] directed inter-worker edges ``u -> v``.
        cap: The most vertices a block may have (aggregators on the switch).
        seed: METIS's seed.

    Returns:
        One int64 array of edge indices per block, ascending. Every index in
        ``0..E-1`` is in exactly one block; ``u -> v`` and ``v -> u`` share one.
        Blocks are in the order first-fit decreasing opened them (the one with
        the largest item first); ``[]`` without edges.

    Raises:
        ValueError: bad edges, or ``cap`` is not an int (or is below 2 while
            there are edges: an edge needs room for both its ends).
    """
    src, dst = check_edges(src, dst)
    if isinstance(cap, bool) or not isinstance(cap, int | np.integer):
        raise ValueError(
            f"cap: expected an int >= 2 (vertices per block), found {cap!r}"
        )
    cap = int(cap)
    if src.size == 0:
        return []
    if cap < 2:
        raise ValueError(
            f"cap: expected an int >= 2 (a block holds both ends of an edge), "
            f"found {cap}"
        )
    vertices, s, d = compact(src, dst)
    pair_of_edge, lo, hi = undirected_pairs(s, d, vertices.shape[0])
    items = _Items()
    pending = [np.arange(lo.shape[0], dtype=np.int64)]
    while pending:
        level, pending = pending, []
        for big in _split_components(level, lo, hi, cap, items):
            pieces = _metis_pieces(big, lo, hi, cap, seed)
            if max(piece.size for piece in pieces) == big.size:
                _greedy_runs(big, lo, hi, cap, items)
            else:
                pending.extend(pieces)
    block_of_pair = items.pack(cap, lo.shape[0])
    return _group(block_of_pair[pair_of_edge])


class _Items:
    """Pair sets that fit a block (items), gathered for packing.

    Kept per call of ``add``: the pairs, the item of each pair, and each item's
    vertex count.
    """

    def __init__(self) -> None:
        self._pairs: list[np.ndarray] = []
        self._item_of_pair: list[np.ndarray] = []
        self._sizes: list[np.ndarray] = []
        self._count = 0

    def add(self, pairs: np.ndarray, local_item: np.ndarray, sizes: np.ndarray) -> None:
        """Items ``0..len(sizes)-1`` of ``sizes``; ``local_item[i]`` is pairs[i]'s."""
        self._pairs.append(pairs)
        self._item_of_pair.append(local_item + self._count)
        self._sizes.append(sizes)
        self._count += sizes.shape[0]

    def pack(self, cap: int, num_pairs: int) -> np.ndarray:
        """First-fit decreasing into blocks of ``cap``; int64 [num_pairs] block IDs."""
        sizes = np.concatenate(self._sizes)
        bin_of_item = _first_fit_decreasing(sizes, cap)
        block_of_pair = np.full(num_pairs, -1, dtype=np.int64)
        block_of_pair[np.concatenate(self._pairs)] = bin_of_item[
            np.concatenate(self._item_of_pair)
        ]
        assert bool((block_of_pair >= 0).all()), "a pair was never placed"
        return block_of_pair


def _split_components(
    pieces: list[np.ndarray], lo: np.ndarray, hi: np.ndarray, cap: int, items: _Items
) -> list[np.ndarray]:
    """Keep the components of each piece that fit as items; return the others.

    The pieces are split together, as one graph in which each piece has its own
    copy of its vertices: pieces may share vertices, but a component never
    spans two pieces.

    Args:
        pieces: Arrays of pair indices, each a separate graph.

    Returns:
        One int64 array of pair indices per component with more than ``cap``
        vertices.
    """
    pairs = np.concatenate(pieces)
    piece_sizes = np.array([piece.size for piece in pieces], dtype=np.int64)
    # (piece, vertex) keys, so that a vertex in two pieces is two vertices here.
    offset = np.repeat(np.arange(len(pieces), dtype=np.int64), piece_sizes)
    offset *= int(hi[pairs].max()) + 1
    ends, local = np.unique(
        np.concatenate([offset + lo[pairs], offset + hi[pairs]]), return_inverse=True
    )
    local_lo, local_hi = local[: pairs.size], local[pairs.size :]
    num = ends.shape[0]
    adjacency = sp.coo_matrix(
        (np.ones(pairs.size, dtype=np.int8), (local_lo, local_hi)), shape=(num, num)
    )
    _, label = connected_components(adjacency, directed=False)
    sizes = np.bincount(label)
    comp_of_pair = label[local_lo]
    fits = sizes[comp_of_pair] <= cap
    if fits.any():
        kept, item = np.unique(comp_of_pair[fits], return_inverse=True)
        items.add(pairs[fits], item.astype(np.int64), sizes[kept])
    too_big = comp_of_pair[~fits]
    if too_big.size == 0:
        return []
    order = np.argsort(too_big, kind="stable")
    _, starts = np.unique(too_big[order], return_index=True)
    return np.split(pairs[~fits][order], starts[1:])


def _metis_pieces(
    pairs: np.ndarray, lo: np.ndarray, hi: np.ndarray, cap: int, seed: int
) -> list[np.ndarray]:
    """Cut a connected pair set with METIS: each part's internal pairs, then the cut.

    Returns:
        Non-empty int64 arrays of pair indices; together they are ``pairs``.
    """
    import pymetis

    ends, local = np.unique(np.concatenate([lo[pairs], hi[pairs]]), return_inverse=True)
    local_lo, local_hi = local[: pairs.size], local[pairs.size :]
    num = ends.shape[0]
    num_parts = min(num, max(2, int(np.ceil(num / (_HEADROOM * cap)))))
    indptr, indices = symmetric_csr(local_lo, local_hi, num)
    dtype = _metislib.idx_dtype()
    # METIS seeds srand(); 0 and 1 coincide there (see partition/metis.py).
    options = pymetis.Options(seed=seed % (2**31 - 1) + 1)
    # Let a part grow to cap, not just to METIS's default 3% over the average:
    # cutting fewer edges makes a smaller next level (less traffic).
    options.ufactor = max(1, int(1000 * (cap * num_parts / num - 1)))
    result = pymetis.part_graph(
        num_parts,
        pymetis.CSRAdjacency(
            adj_starts=indptr.astype(dtype), adjacent=indices.astype(dtype)
        ),
        options=options,
    )
    part = np.asarray(result.vertex_part, dtype=np.int64)
    part_lo, part_hi = part[local_lo], part[local_hi]
    internal = part_lo == part_hi
    order = np.argsort(part_lo[internal], kind="stable")
    _, starts = np.unique(part_lo[internal][order], return_index=True)
    pieces = np.split(pairs[internal][order], starts[1:]) if starts.size else []
    cut = pairs[~internal]
    return [*pieces, cut] if cut.size else pieces


def _greedy_runs(
    pairs: np.ndarray, lo: np.ndarray, hi: np.ndarray, cap: int, items: _Items
) -> None:
    """The fallback: cut ``pairs``, in order, into runs of at most ``cap`` vertices."""
    item = np.empty(pairs.size, dtype=np.int64)
    sizes: list[int] = []
    seen: set[int] = set()
    for i, (a, b) in enumerate(
        zip(lo[pairs].tolist(), hi[pairs].tolist(), strict=True)
    ):
        grown = len(seen) + (a not in seen) + (b != a and b not in seen)
        if grown > cap:
            sizes.append(len(seen))
            seen = set()
        seen.update((a, b))
        item[i] = len(sizes)
    sizes.append(len(seen))
    items.add(pairs, item, np.asarray(sizes, dtype=np.int64))


def _first_fit_decreasing(sizes: np.ndarray, cap: int) -> np.ndarray:
    """The bin of each item when packed largest first into the first bin with room.

    A segment tree over the (at most one per item) bins keeps each placement
    O(log items): a node holds the most room left in any bin below it.

    Returns:
        int64 [len(sizes)] bin IDs, numbered in order of opening.
    """
    num_leaves = 1 << max(0, int(sizes.shape[0] - 1).bit_length())
    room = [cap] * (2 * num_leaves)
    bins = np.empty(sizes.shape[0], dtype=np.int64)
    order = np.argsort(-sizes, kind="stable")
    for item, size in zip(order.tolist(), sizes[order].tolist(), strict=True):
        node = 1
        while node < num_leaves:  # leftmost leaf with room >= size
            node = 2 * node if room[2 * node] >= size else 2 * node + 1
        room[node] -= size
        bins[item] = node - num_leaves
        node //= 2
        while node:
            room[node] = max(room[2 * node], room[2 * node + 1])
            node //= 2
    return bins


def _group(block_of_edge: np.ndarray) -> list[np.ndarray]:
    """Edge indices per block, ascending within each block, blocks in ID order."""
    order = np.argsort(block_of_edge, kind="stable")
    _, starts = np.unique(block_of_edge[order], return_index=True)
    return [chunk.astype(np.int64) for chunk in np.split(order, starts[1:])]
