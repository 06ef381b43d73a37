"""DGS's locality- and importance-aware neighbour sampling (``--fetch dgs``).

DGS (seed ``004``, chapter 3) samples a trainer's neighbourhoods so that
fewer of the rows it needs live on other workers. For one trainer, with the
nodes of its part *local* and every other node *remote*, each destination
``v`` of a layer with fan-out ``n`` keeps ``k = min(n, deg v)`` in-neighbours:

1. **the split by degree share**: ``h`` of the ``k`` picks go to local
   neighbours, ``h`` drawn as uniform sampling would draw it (the number of
   local nodes in a uniform ``k``-subset of the row: hypergeometric);
2. **the ε shift**: ``round(ε k)`` picks move from remote to local
   neighbours, so ``k_loc = min(|L|, h + round(ε k), k)`` and
   ``k_rem = k - k_loc``. Local neighbours are never dropped for remote ones
   beyond that split, and the total ``k`` never changes;
3. **the picks**: ``k_loc`` local neighbours uniformly without replacement;
   ``k_rem`` remote ones without replacement with probability proportional to
   ``w(u) + floor``, ``w`` the trainer's node mask over its remote nodes
   (the explainer's, :mod:`~graphwire.feature.explain`; nodes outside the
   mask weigh its mean). Efraimidis-Spirakis keys: the ``k_rem`` smallest of
   ``-log(U) / (w + floor)``.

Rows of degree at most ``n`` keep every neighbour, as uniform sampling does.
With ε = 0 and equal weights the kept subset is a uniform ``k``-subset, as
:class:`~graphwire.sampler.uniform.UniformNeighborSampler` draws (a
chi-square test checks it).

Every draw is hashed from ``(seed, v)`` or ``(seed, v, j)`` for the ``j``-th
in-edge of ``v``, so, as for uniform sampling, who samples a row does not
change its picks: the owner-compute sampler
(:class:`~graphwire.sampler.dist.DistNeighborSampler` with a bias) samples
exactly what :class:`ImportanceNeighborSampler` samples on the whole graph.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from graphwire.graph.graph import Graph
from graphwire.nn.dropout import splitmix64
from graphwire.sampler.base import Block, SampledBatch, derive_seed
from graphwire.sampler.uniform import (
    SlotTables,
    _floyd_subsets,
    check_batch_seed,
    check_fanouts,
    check_seeds,
    hashed_draws,
    layer_seed,
    sample_rows,
    sampled_weights,
)

__all__ = ["FLOOR", "ImportanceNeighborSampler", "NodeBias", "biased_rows"]

FLOOR = 0.01
"""Added to every remote weight: a node the mask zeroes can still be drawn."""

_SPLIT, _KEYS = 1, 2  # draw streams of a layer's seed
_DENSE = 8  # NodeBias._table: at most this many times the mask's own bytes


@dataclass(frozen=True, eq=False)
class NodeBias:
    """One trainer's sampling bias: which nodes are local, how remote ones weigh.

    Attributes:
        local: ``(start, stop)``, the global IDs of the trainer's part.
        nid: int64 [m], sorted global IDs the mask covers (remote nodes).
        weight: float32 [m], the node mask at ``nid``, in [0, 1].
        epsilon: ε in [0, 1), the share of picks moved from remote to local.
    """

    local: tuple[int, int]
    nid: torch.Tensor
    weight: torch.Tensor
    epsilon: float

    def __post_init__(self) -> None:
        if self.nid.shape != self.weight.shape or self.nid.dim() != 1:
            raise ValueError(
                f"NodeBias: nid and weight must be 1-D of one length, found "
                f"{tuple(self.nid.shape)} and {tuple(self.weight.shape)}"
            )
        if not 0.0 <= self.epsilon < 1.0:
            raise ValueError(f"epsilon: expected a value in [0, 1), got {self.epsilon}")

    @functools.cached_property
    def _default(self) -> float:
        """The weight of nodes the mask does not cover: its mean."""
        return float(self.weight.mean()) if self.weight.numel() else 1.0

    def is_local(self, nid: torch.Tensor) -> torch.Tensor:
        return (nid >= self.local[0]) & (nid < self.local[1])

    def weigh(self, nid: torch.Tensor) -> torch.Tensor:
        """float64 [*]: each node's weight plus :data:`FLOOR` (the mask's mean
        for nodes it does not cover)."""
        table = self._table
        if table is not None:  # one lookup per node, no search
            low = int(self.nid[0])
            inside = (nid >= low) & (nid < low + table.numel())
            at = torch.where(inside, nid - low, 0)
            return torch.where(inside, table.index_select(0, at), self._default + FLOOR)
        out = torch.full(nid.shape, self._default, dtype=torch.float64)
        if self.nid.numel():
            pos = torch.searchsorted(self.nid, nid).clamp(max=self.nid.numel() - 1)
            hit = self.nid.index_select(0, pos) == nid
            out[hit] = self.weight.index_select(0, pos[hit]).to(torch.float64)
        return out + FLOOR

    @functools.cached_property
    def _table(self) -> torch.Tensor | None:
        """float64 [span]: :meth:`weigh` of every ID from the mask's first
        covered node to its last, where they are dense enough that the table
        (8 bytes an ID) is at most :data:`_DENSE` times the mask's 12 bytes a
        node; None otherwise (a sparse halo of a large graph)."""
        if not self.nid.numel():
            return None
        low, high = int(self.nid[0]), int(self.nid[-1]) + 1
        if 8 * (high - low) > _DENSE * 12 * self.nid.numel():
            return None
        table = torch.full((high - low,), self._default, dtype=torch.float64)
        table[self.nid - low] = self.weight.to(torch.float64)
        return table + FLOOR


def biased_rows(
    indptr: torch.Tensor,
    indices: torch.Tensor,
    rows: torch.Tensor,
    keys: torch.Tensor,
    fanout: int,
    seed: int,
    bias: NodeBias,
) -> tuple[torch.Tensor, torch.Tensor]:
    """DGS's ``fanout``-subsets of CSR rows (the module docstring's steps).

    Args:
        indptr: int64 [R + 1], the CSR's row offsets.
        indices: int64 [e], the CSR's sources, *global* IDs.
        rows: int64 [n], rows to sample.
        keys: int64 [n], the rows' global IDs (the draws' keys).
        fanout: neighbours per row; ``-1`` keeps every neighbour.
        seed: the layer's seed.
        bias: whose part is local, and the remote weights.

    Returns:
        ``(indptr [n + 1], pos [E])`` as
        :func:`~graphwire.sampler.uniform.sample_rows` returns them: a row's
        local picks first, then its remote ones.
    """
    start = indptr.index_select(0, rows)
    deg = indptr.index_select(0, rows + 1) - start
    big = deg > fanout if fanout > 0 else torch.zeros_like(deg, dtype=torch.bool)
    if not bool(big.any()):
        return sample_rows(indptr, rows, fanout, seed, keys=keys)
    count = deg if fanout < 0 else deg.clamp(max=fanout)
    out_indptr = torch.zeros(rows.numel() + 1, dtype=torch.int64)
    torch.cumsum(count, 0, out=out_indptr[1:])
    # Small rows: every edge, in CSR order.
    small = (~big).nonzero().view(-1)
    _, small_pos = sample_rows(indptr, rows[small], -1, seed)
    # Big rows: every candidate edge, row-major.
    big_rows = big.nonzero().view(-1)
    b_start, b_deg = start[big_rows], deg[big_rows]
    row_of = torch.repeat_interleave(torch.arange(big_rows.numel()), b_deg)
    first = torch.cumsum(b_deg, 0) - b_deg
    offset = torch.arange(row_of.numel(), dtype=torch.int64) - first[row_of]
    cand = b_start[row_of] + offset
    src = indices.index_select(0, cand)
    local = bias.is_local(src)
    n_local = torch.zeros(big_rows.numel(), dtype=torch.int64)
    n_local.index_add_(0, row_of, local.to(torch.int64))
    # 1. the local share of a uniform subset: how many of a Floyd k-subset of
    # the row's positions fall among its first n_local.
    b_keys = keys[big_rows]
    split_seed = derive_seed(seed, _SPLIT)
    subsets = _floyd_subsets(b_deg, fanout, hashed_draws(b_keys, fanout, split_seed))
    share = (subsets < n_local.unsqueeze(1)).sum(1)
    # 2. the ε shift.
    shifted = (share + round(bias.epsilon * fanout)).clamp(max=fanout)
    k_loc = torch.minimum(n_local, shifted)
    k_rem = fanout - k_loc
    # 3. picks: uniform keys for local edges, Efraimidis-Spirakis for remote:
    # one sort by (row, local before remote, -log(U) / weight), the key's
    # fraction s / (1 + s) keeping the score's order within a group. The keys
    # are non-negative doubles, whose bits as int64 sort in the same order:
    # an integer sort is the faster (half the time), with the same result.
    u = _edge_uniforms(b_keys[row_of], offset, derive_seed(seed, _KEYS))
    remote = (~local).to(torch.int64)
    weight = torch.where(local, 1.0, bias.weigh(src))
    score = -torch.log(u) / weight
    group = row_of * 2 + remote
    key = group.to(torch.float64) + score / (1.0 + score)
    order = torch.sort(key.view(torch.int64), stable=True)
    order_ix = order.indices
    sizes = torch.bincount(group, minlength=2 * big_rows.numel())
    starts = torch.cumsum(sizes, 0) - sizes
    sorted_group = group.index_select(0, order_ix)
    rank = torch.arange(group.numel()) - starts.index_select(0, sorted_group)
    limit = torch.stack([k_loc, k_rem], 1).view(-1).index_select(0, sorted_group)
    chosen = cand.index_select(0, order_ix[rank < limit])  # rows, locals first
    pos = torch.empty(int(out_indptr[-1]), dtype=torch.int64)
    slot_big = torch.repeat_interleave(big, count)
    pos[slot_big] = chosen
    pos[~slot_big] = small_pos
    return out_indptr, pos


def _edge_uniforms(keys: torch.Tensor, offset: torch.Tensor, seed: int) -> torch.Tensor:
    """float64 uniforms in (0, 1), fixed by ``(seed, keys[i], offset[i])``."""
    words = splitmix64((keys << 32) | offset, seed)
    return (((words >> 11) & ((1 << 53) - 1)).to(torch.float64) + 0.5) * 2.0**-53


class ImportanceNeighborSampler:
    """DGS's sampling of ``len(fanouts)``-layer blocks on one whole graph.

    The single-process reference of the owner-compute sampler with a bias
    (which samples exactly these blocks, the tests' oracle).

    Args:
        graph: the in-edge CSR graph, global IDs.
        fanouts: per layer, input layer first.
        edge_weight: optional float32 [graph.num_edges] (GCN), scaled as
            :func:`~graphwire.sampler.uniform.sampled_weights` scales it.
    """

    def __init__(
        self,
        graph: Graph,
        fanouts: Sequence[int],
        edge_weight: torch.Tensor | None = None,
    ) -> None:
        self.fanouts = check_fanouts(fanouts)
        self.graph = graph
        self.edge_weight = edge_weight
        self._slots = SlotTables(graph.num_nodes, graph.num_edges)

    def sample(
        self, seeds: torch.Tensor, batch_seed: int, bias: NodeBias
    ) -> SampledBatch:
        seeds = check_seeds(seeds, self.graph.num_nodes)
        batch_seed = check_batch_seed(batch_seed, "batch_seed")
        blocks: list[Block] = []
        dst_nid = seeds
        for layer in reversed(range(len(self.fanouts))):
            seed = layer_seed(batch_seed, layer)
            indptr, pos = biased_rows(
                self.graph.indptr,
                self.graph.indices,
                dst_nid,
                dst_nid,
                self.fanouts[layer],
                seed,
                bias,
            )
            weight = None
            if self.edge_weight is not None:
                weight = sampled_weights(
                    self.edge_weight, self.graph.indptr, dst_nid, indptr, pos
                )
            sources = self.graph.indices.index_select(0, pos)
            block = self._slots.stitch(dst_nid, indptr, sources, pos, weight)
            blocks.append(block)
            dst_nid = block.src_nid
        blocks.reverse()
        return SampledBatch(seeds=seeds, blocks=blocks)
