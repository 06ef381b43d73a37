"""Link prediction's samplers: positives, negatives, and one batch of three.

ByteGNN's unsupervised batch (seed ``002`` §4.2.1) has three branches: the
seeds, one **positive** per seed (a direct neighbour) and ``k`` **negatives**
per seed (nodes that are not), each sampled K hops deep and fetched. The
draws are hashed, as the neighbour sampler's are
(:func:`~graphwire.sampler.uniform.hashed_draws`): node ``v``'s positive is a
function of ``(seed, v)`` and its CSR row alone, so the owner of ``v`` draws
it, and any thread, rank or schedule draws the same one.

:class:`SamplingFunctions` is the user's hook (ByteGNN's API): a seed, a
positive, a negative and a hop function; all but the seed function run
where the nodes' in-edges are stored (their owner), on that rank's
:class:`~graphwire.sampler.dist.OwnedCSR`, and return global IDs.

:func:`merge_branches` puts the three branches' blocks side by side in one
stack of blocks, so the model runs once over the batch.

Shapes (n nodes asked, k negatives each):
    positive(csr, nid [n], seed)            -> int64 [n], -1: none
    negative(csr, nid [n], k, seed, N)      -> int64 [n, k]
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from graphwire.graph.links import contains_sorted
from graphwire.graph.seeds import derive_seed
from graphwire.sampler.base import Batch, Block, SampledBatch
from graphwire.sampler.dist import OwnedCSR
from graphwire.sampler.uniform import (
    MAX_FANOUT,
    SlotTables,
    check_fanouts,
    check_seeds,
    hashed_draws,
    layer_seed,
    sample_rows,
)

__all__ = [
    "HopSampler",
    "SamplingFunctions",
    "batch_seeds",
    "link_seed_nodes",
    "merge_branches",
    "negative_draws",
    "pair_seeds",
    "positive_draws",
    "uniform_hop",
]

_REJECTION_ROUNDS = 16  # draws of a negative before its row's complement is listed


def _rows(csr: OwnedCSR, nid: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The in-edges of owned ``nid``: ``(row of each edge [E], source [E])``."""
    rows = nid - csr.start
    if rows.numel() and (int(rows.min()) < 0 or int(rows.max()) >= csr.num_owned):
        raise ValueError(
            f"pairs: nodes outside the owned range [{csr.start}, "
            f"{csr.start + csr.num_owned})"
        )
    indptr, pos = sample_rows(csr.indptr, rows, -1, 0)  # every in-edge
    row_of = torch.repeat_interleave(torch.arange(rows.numel()), indptr.diff())
    return row_of, csr.indices.index_select(0, pos)


def positive_draws(csr: OwnedCSR, nid: torch.Tensor, seed: int) -> torch.Tensor:
    """One in-neighbour of each owned node, uniform over those that are not
    itself (int64 [n] global IDs; -1 for a node with none)."""
    row_of, src = _rows(csr, nid)
    keep = src != nid.index_select(0, row_of)
    count = torch.zeros(nid.numel(), dtype=torch.int64).index_add_(
        0, row_of, keep.to(torch.int64)
    )
    pick = (hashed_draws(nid, 1, seed)[:, 0] * count).to(torch.int64)
    # the rank of each kept edge among its row's kept edges
    kept = torch.cumsum(keep.to(torch.int64), 0) - 1
    before = torch.cumsum(count, 0) - count
    rank = kept - before.index_select(0, row_of)
    chosen = keep & (rank == pick.index_select(0, row_of))
    out = torch.full((nid.numel(),), -1, dtype=torch.int64)
    out[row_of[chosen]] = src[chosen]
    return out


def negative_draws(
    csr: OwnedCSR, nid: torch.Tensor, k: int, seed: int, num_nodes: int
) -> torch.Tensor:
    """``k`` nodes per owned node, uniform over those neither it nor its
    in-neighbours (int64 [n, k] global IDs).

    Raises:
        ValueError: a node joined to every other (nothing to draw).
    """
    row_of, src = _rows(csr, nid)
    n = nid.numel()
    adjacent = (row_of * num_nodes + src).sort().values
    rows = torch.arange(n).unsqueeze(1).expand(n, k)
    out = torch.empty(n, k, dtype=torch.int64)
    bad = torch.ones(n, k, dtype=torch.bool)
    for round_ in range(_REJECTION_ROUNDS):
        draws = hashed_draws(nid, k, derive_seed(seed, round_))
        out[bad] = (draws * num_nodes).to(torch.int64)[bad]
        bad = (out == nid.unsqueeze(1)) | contains_sorted(
            adjacent, rows * num_nodes + out
        )
        if not bool(bad.any()):
            return out
    for i in bad.any(1).nonzero().view(-1).tolist():  # rows near complete
        free = torch.ones(num_nodes, dtype=torch.bool)
        free[src[row_of == i]] = False
        free[nid[i]] = False
        options = free.nonzero().view(-1)
        if not options.numel():
            raise ValueError(f"negatives: node {int(nid[i])} is joined to every other")
        draws = hashed_draws(nid[i : i + 1], k, derive_seed(seed, _REJECTION_ROUNDS))
        picks = options[(draws[0] * options.numel()).to(torch.int64)]
        out[i] = torch.where(bad[i], picks, out[i])
    return out


def uniform_hop(
    csr: OwnedCSR, nid: torch.Tensor, fanout: int, seed: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """The default hop: ``fanout`` in-edges of each owned node, uniformly
    (:meth:`OwnedCSR.sample`)."""
    return csr.sample(nid, fanout, seed)


def batch_seeds(batch: Batch) -> torch.Tensor:
    """The default seed function: the batch's seeds, as scheduled."""
    return batch.seeds


SeedFn = Callable[[Batch], torch.Tensor]
PositiveFn = Callable[[OwnedCSR, torch.Tensor, int], torch.Tensor]
NegativeFn = Callable[[OwnedCSR, torch.Tensor, int, int, int], torch.Tensor]
HopFn = Callable[
    [OwnedCSR, torch.Tensor, int, int],
    tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor | None],
]


@dataclass(frozen=True)
class SamplingFunctions:
    """The functions a user may supply for ByteGNN's operators (§4.2.1).

    All but ``seed`` run where the nodes they are given are stored (their
    owner), with the same arguments on every rank and thread, so they must
    be deterministic functions of them (hash; do not draw from a shared
    generator). The defaults are uniform and hashed.

    Attributes:
        seed: ``(batch) -> int64 [B]`` distinct global IDs: the seed
            operator (default: the scheduled seeds).
        positive: ``(csr, nid [n], seed) -> int64 [n]``; -1 drops the seed.
        negative: ``(csr, nid [n], k, seed, num_nodes) -> int64 [n, k]``.
        hop: ``(csr, nid [n], fanout, seed) -> (counts [n], sources [E],
            eid [E], weight [E] | None)``, edges in node order, ``eid``
            positions in ``csr`` plus its ``edge_offset``: one hop of the
            neighbourhood operator (:meth:`OwnedCSR.sample`'s contract).
        k: negatives per seed.

    Example::

        def two_hop_positive(csr, nid, seed):  # a neighbour's neighbour
            ...
        functions = SamplingFunctions(positive=two_hop_positive, k=5)
    """

    seed: SeedFn = batch_seeds
    positive: PositiveFn = positive_draws
    negative: NegativeFn = negative_draws
    hop: HopFn = uniform_hop
    k: int = 1

    def __post_init__(self) -> None:
        k = self.k
        if isinstance(k, bool) or not isinstance(k, int) or not 1 <= k <= MAX_FANOUT:
            raise ValueError(
                f"negatives: expected an integer in [1, {MAX_FANOUT}], got {k!r}"
            )


class HopSampler:
    """Blocks around seeds with a hop function over one CSR holding every
    node (a single process's :class:`~graphwire.sampler.dist.DistNeighborSampler`:
    the same draws, the same blocks).

    Args:
        csr: the whole graph's in-edges (``start`` 0).
        fanouts: per layer, input layer first.
        hop: the hop function.
    """

    def __init__(self, csr: OwnedCSR, fanouts: list[int], hop: HopFn = uniform_hop):
        self.csr, self.fanouts, self.hop = csr, check_fanouts(fanouts), hop
        self._slots = SlotTables(csr.num_owned, 2**31)

    def sample(self, seeds: torch.Tensor, batch_seed: int) -> SampledBatch:
        """The blocks of ``seeds`` (int64 [B], distinct), input layer first."""
        seeds = check_seeds(seeds, self.csr.num_owned)
        blocks: list[Block] = []
        dst_nid = seeds
        for layer in reversed(range(len(self.fanouts))):
            counts, sources, eid, weight = self.hop(
                self.csr, dst_nid, self.fanouts[layer], layer_seed(batch_seed, layer)
            )
            indptr = torch.zeros(dst_nid.numel() + 1, dtype=torch.int64)
            torch.cumsum(counts, 0, out=indptr[1:])
            block = self._slots.stitch(dst_nid, indptr, sources, eid, weight)
            blocks.append(block)
            dst_nid = block.src_nid
        blocks.reverse()
        return SampledBatch(seeds=seeds, blocks=blocks)


def pair_seeds(batch_seed: int) -> tuple[int, int]:
    """The positive and negative draws' seeds of a batch (apart from its
    layers', which are ``derive_seed(batch_seed, layer)``)."""
    return derive_seed(batch_seed, -1), derive_seed(batch_seed, -2)


def merge_branches(
    branches: list[SampledBatch],
) -> tuple[SampledBatch, list[torch.Tensor]]:
    """One stack of blocks holding each branch's side by side.

    Layer ``l``'s source rows are, in order, every branch's seeds, then every
    branch's nodes new at the last layer, ..., then those new at layer
    ``l`` (so each layer's destinations are the next layer's sources, as in
    any stack); a node in two branches has a row in each. The merged
    batch's seeds are the branches' seeds, concatenated.

    Returns:
        ``(merged, at)``: ``at[b]`` int64 [branch b's input rows], where
        each of them is among the merged input rows.
    """
    layers = len(branches[0].blocks)
    # Pieces of each branch's input rows: its seeds, then the nodes each
    # layer adds (last layer first), in its own order.
    sizes = torch.tensor(
        [
            [b.seeds.numel()]
            + [
                b.blocks[l].num_src - b.blocks[l].num_dst
                for l in reversed(range(layers))
            ]
            for b in branches
        ],
        dtype=torch.int64,
    )  # [branches, layers + 1]
    offsets = (torch.cumsum(sizes.T.reshape(-1), 0) - sizes.T.reshape(-1)).view(
        layers + 1, len(branches)
    )
    at = [
        torch.cat(
            [
                torch.arange(int(sizes[b, p])) + int(offsets[p, b])
                for p in range(layers + 1)
            ]
        )
        for b in range(len(branches))
    ]
    input_nid = torch.empty(int(sizes.sum()), dtype=torch.int64)
    for b, branch in enumerate(branches):
        input_nid[at[b]] = branch.input_nid
    blocks = []
    for l in range(layers):
        kept = layers - l + 1  # pieces among layer l's sources
        num_src, num_dst = int(sizes[:, :kept].sum()), int(sizes[:, : kept - 1].sum())
        blocks.append(_merged_block(branches, l, at, num_src, num_dst, input_nid))
    seeds = torch.cat([b.seeds for b in branches])
    return SampledBatch(seeds=seeds, blocks=blocks), at


def _merged_block(
    branches: list[SampledBatch],
    layer: int,
    at: list[torch.Tensor],
    num_src: int,
    num_dst: int,
    input_nid: torch.Tensor,
) -> Block:
    dst_rows, src_rows, eids, weights = [], [], [], []
    for b, branch in enumerate(branches):
        block = branch.blocks[layer]
        where = at[b][: block.num_src]
        dst_rows.append(
            torch.repeat_interleave(where[: block.num_dst], block.in_degrees())
        )
        src_rows.append(where.index_select(0, block.indices))
        eids.append(block.eid)
        if block.edge_weight is not None:
            weights.append(block.edge_weight)
    dst = torch.cat(dst_rows)
    order = torch.argsort(dst, stable=True)
    indptr = torch.zeros(num_dst + 1, dtype=torch.int64)
    torch.cumsum(torch.bincount(dst, minlength=num_dst), 0, out=indptr[1:])
    return Block(
        indptr=indptr,
        indices=torch.cat(src_rows)[order],
        num_src=num_src,
        num_dst=num_dst,
        edge_weight=torch.cat(weights)[order] if weights else None,
        src_nid=input_nid[:num_src],
        dst_nid=input_nid[:num_dst],
        eid=torch.cat(eids)[order],
    )


def link_seed_nodes(csr: OwnedCSR) -> torch.Tensor:
    """int64, ascending: the owned nodes with an in-neighbour besides
    themselves (the seeds a link batch can draw a positive for)."""
    nid = torch.arange(csr.num_owned, dtype=torch.int64) + csr.start
    row_of, src = _rows(csr, nid)
    other = torch.zeros(nid.numel(), dtype=torch.int64).index_add_(
        0, row_of, (src != nid.index_select(0, row_of)).to(torch.int64)
    )
    return nid[other > 0]
