"""`UniformNeighborSampler`: uniform neighbour sampling without replacement.

For each layer, from the seeds outward, every destination keeps all its
in-neighbours if it has at most ``fanout`` of them, else a uniformly random
``fanout``-subset (GraphSAGE / DGL ``sample_neighbors(replace=False)``). The
sampled sources, after the destinations, become the next layer's destinations.

Everything is vectorised over destinations and edges:

- subsets come from Floyd's algorithm run for all high-degree destinations at
  once: ``fanout`` rounds, each one random draw per destination plus a compare
  against the picks so far, so the cost is O(num_dst * fanout^2) whatever the
  degrees (hubs in power-law graphs cost no more than leaves);
- relabelling (global -> local IDs, destinations first, new sources in order of
  first appearance) goes through a ``[num_nodes]`` slot table with gathers and
  one ``scatter_reduce``, no sort. The table makes a sampler single-threaded:
  use one sampler per thread.

Randomness comes only from what :meth:`sample` is given: a ``torch.Generator``,
or (``hashed``) an int seed from which every node's draws are hashed; so a seed
fixes the batch.
"""

from __future__ import annotations

import operator
import threading
from collections.abc import Sequence

import torch

from graphwire.graph.graph import Graph, GraphError, node_ids
from graphwire.graph.order import index_dtype
from graphwire.graph.seeds import is_int
from graphwire.nn.dropout import splitmix64
from graphwire.sampler.base import Block, SampledBatch, derive_seed

__all__ = [
    "MAX_FANOUT",
    "UniformNeighborSampler",
    "check_batch_seed",
    "check_fanouts",
    "check_seeds",
    "sampled_weights",
    "hashed_draws",
    "layer_seed",
    "relabel",
    "sample_rows",
    "slot_table",
    "stitch_block",
    "SlotTables",
]


def _floyd_subsets(deg: torch.Tensor, k: int, draws: torch.Tensor) -> torch.Tensor:
    """A uniform ``k``-subset of ``range(deg[i])`` for every row ``i``.

    Floyd's algorithm: for ``j`` in ``deg-k .. deg-1`` draw ``t`` in ``[0, j]``
    and keep ``t``, or ``j`` if ``t`` was already kept.

    Args:
        deg: int64 [n], every entry > k.
        k: subset size.
        draws: float64 [n, k] uniforms in [0, 1), one per row and round.

    Returns:
        int64 [n, k], distinct offsets per row.
    """
    n = deg.numel()
    chosen = torch.empty(n, k, dtype=torch.int64)
    for i in range(k):  # loop over the fan-out, not over nodes
        top = deg - (k - i)  # j, the largest value allowed this round
        pick = torch.minimum((draws[:, i] * (top + 1)).long(), top)
        if i:
            seen = (chosen[:, :i] == pick.unsqueeze(1)).any(1)
            pick = torch.where(seen, top, pick)
        chosen[:, i] = pick
    return chosen


Draw = torch.Generator | int
"""Where a block's randomness comes from: a generator (draws depend on which
rows are sampled together) or an int seed (*hashed* draws: row ``v``'s subset
is a function of ``(seed, v)`` alone, whoever samples it and with whatever
other rows)."""


def hashed_draws(keys: torch.Tensor, k: int, seed: int) -> torch.Tensor:
    """float64 [n, k] uniforms in [0, 1) fixed by ``(seed, keys[i], j)``.

    53 bits of SplitMix64 per draw, so ``floor(u * (deg + 1))`` is unbiased
    for any degree a graph can have.
    """
    cols = torch.arange(k, dtype=torch.int64)
    words = splitmix64(keys.unsqueeze(1) * MAX_FANOUT + cols, seed)
    return ((words >> 11) & ((1 << 53) - 1)).to(torch.float64) * 2.0**-53


MAX_FANOUT = 1 << 12


def sample_rows(
    indptr: torch.Tensor,
    rows: torch.Tensor,
    fanout: int,
    draw: Draw,
    keys: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Uniform ``fanout``-subsets of CSR rows, without replacement.

    Args:
        indptr: int64 [R + 1], the CSR's row offsets.
        rows: int64 [n], rows to sample (any order, repeats allowed).
        fanout: neighbours per row; ``-1`` keeps every neighbour.
        draw: a generator, or an int seed for hashed draws.
        keys: int64 [n], per-row hash keys (global node IDs) for hashed draws;
            defaults to ``rows``.

    Returns:
        ``(indptr [n + 1], pos [E])``: the block's row offsets and the CSR
        position of each sampled edge, rows in order, a row's picks in the
        order Floyd's algorithm made them.
    """
    start = indptr.index_select(0, rows)
    deg = indptr.index_select(0, rows + 1) - start
    count = deg if fanout < 0 else deg.clamp(max=fanout)
    out_indptr = torch.zeros(rows.numel() + 1, dtype=torch.int64)
    torch.cumsum(count, 0, out=out_indptr[1:])
    num_edges = int(out_indptr[-1])  # host sync: sizes the edge arrays
    row = torch.repeat_interleave(torch.arange(rows.numel()), count)
    # Slot i of row r is edge start[r] + (i - indptr[r]) unless subsampled.
    pos = (start - out_indptr[:-1]).index_select(0, row)
    pos += torch.arange(num_edges, dtype=torch.int64)
    if fanout > 0:
        if fanout > MAX_FANOUT:
            raise ValueError(f"fanout: at most {MAX_FANOUT}, got {fanout}")
        big = deg > fanout
        big_rows = big.nonzero().view(-1)
        if big_rows.numel():
            # Rows with deg > fanout own exactly `fanout` consecutive slots,
            # in row order, so the subsets fill the masked slots row-major.
            if isinstance(draw, torch.Generator):
                draws = torch.rand(
                    big_rows.numel(), fanout, generator=draw, dtype=torch.float64
                )
            else:
                key = rows if keys is None else keys
                draws = hashed_draws(key[big_rows], fanout, draw)
            subsets = _floyd_subsets(deg[big_rows], fanout, draws)
            subsets += start[big_rows].unsqueeze(1)
            pos.masked_scatter_(big.index_select(0, row), subsets)
    return out_indptr, pos


class UniformNeighborSampler:
    """Samples ``len(fanouts)``-layer blocks around seed nodes.

    Args:
        graph: the in-edge CSR graph to sample from.
        fanouts: neighbours per destination for each layer, **input layer
            first** (as DGL): ``[10, 25]`` takes 25 neighbours of each seed and
            10 of each of those. ``-1`` takes all neighbours.
        seed: seeds the sampler's own generator, used when :meth:`sample` gets
            no generator.
        edge_weight: optional float32 [graph.num_edges] in CSR order; each block
            gets the weights of its sampled edges as ``edge_weight``.
        hashed: an int given to :meth:`sample` seeds *hashed* draws (layer
            ``l`` uses ``derive_seed(seed, l)``, node ``v``'s subset depends on
            that and ``v`` only), the draws the distributed sampler makes, so
            it samples exactly these blocks. Otherwise an int seeds a fresh
            generator.
    """

    def __init__(
        self,
        graph: Graph,
        fanouts: Sequence[int],
        seed: int = 0,
        edge_weight: torch.Tensor | None = None,
        hashed: bool = False,
    ) -> None:
        self.fanouts = check_fanouts(fanouts)
        if edge_weight is not None and edge_weight.shape != (graph.num_edges,):
            raise ValueError(
                f"edge_weight: expected shape [{graph.num_edges}], "
                f"found {tuple(edge_weight.shape)}"
            )
        self.graph = graph
        self.edge_weight = edge_weight
        self.hashed = hashed
        self.generator = torch.Generator().manual_seed(seed)
        self._slots = SlotTables(graph.num_nodes, graph.num_edges)

    def sample(
        self, seeds: torch.Tensor, generator: torch.Generator | int | None = None
    ) -> SampledBatch:
        """Sample the blocks of one mini-batch.

        Args:
            seeds: int64 [B], distinct global IDs of the output nodes.
            generator: a ``torch.Generator``, an int seed (a fresh generator;
                hashed draws with ``hashed``; numpy integers and 0-d integer
                tensors count as ints), or ``None`` (the sampler's own
                generator, advancing per call).

        Returns:
            The batch; ``blocks[-1].dst_nid`` equals ``seeds``.

        Raises:
            ValueError: ``generator`` is none of those.
        """
        draw: Draw = self.generator
        if isinstance(generator, torch.Generator):
            draw = generator
        elif generator is not None:
            draw = check_batch_seed(generator, "generator")
            if not self.hashed:
                draw = torch.Generator().manual_seed(draw)
        seeds = check_seeds(seeds, self.graph.num_nodes)
        blocks: list[Block] = []
        dst_nid = seeds
        for layer in reversed(range(len(self.fanouts))):
            layer_draw = (
                draw if isinstance(draw, torch.Generator) else layer_seed(draw, layer)
            )
            block = self._sample_block(dst_nid, self.fanouts[layer], layer_draw)
            blocks.append(block)
            dst_nid = block.src_nid
        blocks.reverse()
        return SampledBatch(seeds=seeds, blocks=blocks)

    def _sample_block(self, dst_nid: torch.Tensor, fanout: int, draw: Draw) -> Block:
        indptr, eid = sample_rows(self.graph.indptr, dst_nid, fanout, draw)
        sources = self.graph.indices.index_select(0, eid)
        weight = None
        if self.edge_weight is not None:
            weight = sampled_weights(
                self.edge_weight, self.graph.indptr, dst_nid, indptr, eid
            )
        return self._slots.stitch(dst_nid, indptr, sources, eid, weight)


def sampled_weights(
    weight: torch.Tensor,
    indptr: torch.Tensor,
    rows: torch.Tensor,
    block_indptr: torch.Tensor,
    pos: torch.Tensor,
) -> torch.Tensor:
    """The weights of the edges :func:`sample_rows` kept, scaled to unbiased sums.

    Each is times its row's in-degree over the edges the row kept: unbiased
    estimates of the row's weighted sums (exactly the weights where a row kept
    every edge).

    Args:
        weight: float32 [e], the CSR's edge weights.
        indptr: int64 [R + 1], the CSR's row offsets.
        rows: int64 [n], the sampled rows.
        block_indptr: int64 [n + 1], the sample's row offsets.
        pos: int64 [E], the CSR position of each kept edge.

    Returns:
        float32 [E].
    """
    deg = indptr.index_select(0, rows + 1) - indptr.index_select(0, rows)
    kept = block_indptr[1:] - block_indptr[:-1]
    scale = deg.to(torch.float32) / kept.clamp(min=1).to(torch.float32)
    return weight.index_select(0, pos) * torch.repeat_interleave(scale, kept)


def layer_seed(batch_seed: int, layer: int) -> int:
    """The hashed-draw seed of one layer of a batch."""
    return derive_seed(batch_seed, layer)


def check_fanouts(fanouts: Sequence[int]) -> list[int]:
    """``fanouts`` as plain ints, each in ``[1, MAX_FANOUT]`` or ``-1``.

    One or more integers (numpy integers too, not bools); ``-1`` takes all
    neighbours.

    Raises:
        ValueError: naming ``fanouts`` and what was found (a fraction was
            truncated, 0.5 to 0 and True to 1).
    """
    values = list(fanouts)
    if not values:
        raise ValueError("fanouts: expected one per layer, got []")
    if any(not is_int(f) or f == 0 or f < -1 for f in values):
        raise ValueError(f"fanouts: expected positive ints or -1 (all), got {values}")
    if max(values) > MAX_FANOUT:  # the hashed draws' key space
        raise ValueError(
            f"fanouts: at most {MAX_FANOUT} each (or -1, all), got {values}"
        )
    return [int(f) for f in values]


def check_batch_seed(seed: object, name: str) -> int:
    """``seed`` as a plain int: any integral number, not a bool.

    Integral as ``operator.index`` takes it: an int, a numpy integer, a 0-d
    integer tensor.

    Raises:
        ValueError: naming ``name`` and what was found.
    """
    scalar = not isinstance(seed, torch.Tensor) or seed.dim() == 0
    if scalar and not isinstance(seed, bool):
        try:
            return operator.index(seed)  # type: ignore[arg-type]
        except TypeError:
            pass
    raise ValueError(
        f"{name}: expected an integer seed, found {type(seed).__name__} {seed!r}"
    )


def check_seeds(seeds: torch.Tensor, num_nodes: int) -> torch.Tensor:
    """``seeds`` as int64, checked as :class:`Graph` checks its splits, and distinct.

    Integer IDs (not a boolean mask, not floats), 1-D, in ``[0, num_nodes)``.

    Raises:
        GraphError: (a ``ValueError``) naming ``seeds`` and what was wrong.
    """
    seeds = node_ids(seeds, "seeds", num_nodes)
    if torch.unique(seeds).numel() != seeds.numel():
        raise GraphError("seeds: expected distinct node IDs, found a repeat")
    return seeds.contiguous()  # a seed function may hand over a view


def slot_table(num_nodes: int, num_edges: int) -> torch.Tensor:
    """The relabelling table of :func:`stitch_block`: all -1, one per node.

    int32 when node IDs and per-block edge positions (at most num_edges) fit,
    as random access into this table is the relabelling's cost. One table
    serves one thread at a time (:class:`SlotTables` keeps one per thread).
    """
    return torch.full((num_nodes,), -1, dtype=index_dtype(num_nodes, num_edges))


class SlotTables:
    """A sampler's relabelling tables, one per thread stitching at once.

    A sampler is called from several threads (a loader ahead of the trainer
    and the trainer's own fallback batches, a pool of sampling threads), and
    :func:`relabel` writes into its table: two stitches sharing one table
    corrupt each other's blocks. Each :meth:`stitch` takes a free table,
    making one when none is, and gives it back: as many tables as threads
    ever stitched at once, each ``num_nodes`` entries.
    """

    def __init__(self, num_nodes: int, num_edges: int) -> None:
        self.num_nodes, self.num_edges = num_nodes, num_edges
        self._free: list[torch.Tensor] = []
        self._lock = threading.Lock()

    def stitch(
        self,
        dst_nid: torch.Tensor,
        indptr: torch.Tensor,
        sources: torch.Tensor,
        eid: torch.Tensor,
        weight: torch.Tensor | None,
    ) -> Block:
        """:func:`stitch_block` on a table no other thread is using."""
        with self._lock:
            table = self._free.pop() if self._free else None
        if table is None:
            table = slot_table(self.num_nodes, self.num_edges)
        try:
            return stitch_block(table, dst_nid, indptr, sources, eid, weight)
        finally:
            with self._lock:
                self._free.append(table)


def stitch_block(
    slot: torch.Tensor,
    dst_nid: torch.Tensor,
    indptr: torch.Tensor,
    sources: torch.Tensor,
    eid: torch.Tensor,
    weight: torch.Tensor | None,
) -> Block:
    """A :class:`Block` from sampled edges in global IDs (rows in dst order)."""
    src_nid, local = relabel(slot, dst_nid, sources)
    return Block(
        indptr,
        local,
        src_nid.numel(),
        dst_nid.numel(),
        weight,
        src_nid=src_nid,
        dst_nid=dst_nid,
        eid=eid,
    )


def relabel(
    slot: torch.Tensor, dst_nid: torch.Tensor, src_global: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Local source rows: destinations first, then new nodes by first appearance.

    Uses the ``[num_nodes]`` slot table instead of a sort: O(E) gathers and
    scatters, no ``torch.unique``. The table is reset before returning.
    (Rows fit the table's dtype: a block has at most num_nodes sources.)

    Returns:
        ``(src_nid [num_src], local [E])`` with ``src_nid[local] == src_global``.
    """
    dtype = slot.dtype
    num_dst = dst_nid.numel()
    # scatter_/index_select rather than advanced indexing: faster on CPU.
    slot.scatter_(0, dst_nid, torch.arange(num_dst, dtype=dtype))
    local = slot.index_select(0, src_global)
    is_new = local < 0
    candidates = src_global[is_new]  # [M], with repeats
    m = candidates.numel()
    # First occurrence of each new node: amax of (m - position) is m minus
    # the smallest position that names it (slot holds -1 before, < any).
    slot.scatter_reduce_(0, candidates, torch.arange(m, 0, -1, dtype=dtype), "amax")
    first_pos = m - slot.index_select(0, candidates)  # [M]
    is_first = first_pos == torch.arange(m, dtype=dtype)
    new_nid = candidates[is_first]
    # New node at first position p gets row num_dst + (#firsts before p).
    row_at = torch.cumsum(is_first, 0, dtype=dtype) + (num_dst - 1)
    local.masked_scatter_(is_new, row_at.index_select(0, first_pos))
    src_nid = torch.cat([dst_nid, new_nid])
    slot.index_fill_(0, src_nid, -1)
    return src_nid, local.to(torch.int64)
