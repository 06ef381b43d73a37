"""`DistNeighborSampler`: uniform neighbour sampling over a partitioned graph.

The owner-compute rule (DistDGL §4.1): a node's neighbours are sampled by the
rank that owns it, because only that rank stores its in-edges. For each layer,
from the seeds outward:

1. the frontier (the layer's destinations, global IDs) is split by owner;
2. the owned part is sampled here; each other owner gets ONE request with its
   frontier nodes, answered by its serving thread (``sample.hop`` in the
   ledger): per node the number of sampled edges, then the sources, global
   edge IDs and (GCN) edge weights, in node order;
3. the pieces are stitched back into frontier order and relabelled into a
   :class:`Block` in global IDs, exactly as the single-process sampler does.

Draws are *hashed*: node ``v``'s subset in layer ``l`` of a batch with seed
``s`` is a function of ``(derive_seed(s, l), v)`` alone (see
:func:`~graphwire.sampler.uniform.hashed_draws`). So it does not matter which
rank samples a node, or with which other nodes, and the blocks equal
``UniformNeighborSampler(graph, fanouts, hashed=True).sample(seeds, s)`` on the
graph the parts make up, bit for bit. That is the distributed sampler's test
oracle, and why a presampled schedule (RapidGNN) and on-demand sampling see the
same batches.

Global edge IDs: rank ``r``'s stored in-edges (as the model kind samples them:
with self-loops for GCN/GAT) are edges ``edge_offset[r] ..`` of that graph.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from graphwire.comm.base import Transport
from graphwire.partition.book import PartitionBook
from graphwire.sampler.base import Block, SampledBatch
from graphwire.sampler.importance import NodeBias, biased_rows
from graphwire.sampler.uniform import (
    SlotTables,
    check_batch_seed,
    check_fanouts,
    check_seeds,
    layer_seed,
    sample_rows,
    sampled_weights,
)

__all__ = ["DistNeighborSampler", "Group", "OwnedCSR", "owner_groups", "stitch_groups"]


Sampled = tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor | None]
"""One hop's draws: ``(counts [n], sources [E], eid [E], weight [E] | None)``."""


@dataclass(frozen=True, eq=False)
class OwnedCSR:
    """The in-edges of one rank's owned nodes, as they are sampled.

    Attributes:
        start: global ID of the first owned node (row 0).
        indptr: int64 [n + 1].
        indices: int64 [e], *global* source IDs.
        weight: float32 [e] edge weights (GCN), or None.
        edge_offset: global ID of this rank's first edge.
    """

    start: int
    indptr: torch.Tensor
    indices: torch.Tensor
    weight: torch.Tensor | None
    edge_offset: int

    @property
    def num_owned(self) -> int:
        return self.indptr.numel() - 1

    def sample(
        self,
        dst_nid: torch.Tensor,
        fanout: int,
        seed: int,
        bias: NodeBias | None = None,
    ) -> Sampled:
        """The sampled in-edges of owned ``dst_nid``, edges in node order:
        uniformly, or as DGS samples them for the trainer ``bias`` names.

        Returns ``(counts [n], sources [E], eid [E], weight [E] | None)``."""
        rows = dst_nid - self.start
        if rows.numel() and (int(rows.min()) < 0 or int(rows.max()) >= self.num_owned):
            raise ValueError(
                f"sample: nodes outside the owned range [{self.start}, "
                f"{self.start + self.num_owned})"
            )
        if bias is None:
            indptr, pos = sample_rows(self.indptr, rows, fanout, seed, keys=dst_nid)
        else:
            indptr, pos = biased_rows(
                self.indptr, self.indices, rows, dst_nid, fanout, seed, bias
            )
        weight = None
        if self.weight is not None:
            weight = sampled_weights(self.weight, self.indptr, rows, indptr, pos)
        return (
            indptr[1:] - indptr[:-1],
            self.indices.index_select(0, pos),
            pos + self.edge_offset,
            weight,
        )


class DistNeighborSampler:
    """Samples blocks around seeds across ranks; every rank makes one, together.

    Args:
        csr: this rank's owned in-edges.
        book: the partition book (owner of any global ID).
        transport: the run's transport (the constructor opens the sampling
            service on it, a collective call).
        fanouts: per layer, input layer first (as
            :class:`~graphwire.sampler.uniform.UniformNeighborSampler`).
        service: the service's name (its ledger tags: ``<service>.hop``).
        hop: the hop function (``(csr, nid, fanout, seed) -> (counts,
            sources, eid, weight)``, run by the owner:
            :class:`~graphwire.sampler.links.SamplingFunctions`); None:
            :meth:`OwnedCSR.sample`, uniform.
        biased: sample as DGS does (:mod:`~graphwire.sampler.importance`):
            each rank :meth:`publish` es its numbered biases to every owner
            (``<service>.bias``), and :meth:`sample` names the one a batch
            uses. The biases live at the owners, who sample with them, as the
            requests could not carry them: a requester does not know which
            of its remote nodes an owner's rows reach.

    Attributes:
        counters: ``local_rows`` / ``remote_rows`` (frontier nodes sampled here
            / by their owners), ``requests`` (messages to owners), ``edges``
            (sampled edges), ``batches``, and ``seconds`` (time in
            :meth:`sample`), since the last :meth:`reset_counters`.
    """

    def __init__(
        self,
        csr: OwnedCSR,
        book: PartitionBook,
        transport: Transport,
        fanouts: Sequence[int],
        *,
        service: str = "sample",
        biased: bool = False,
        hop: Callable[[OwnedCSR, torch.Tensor, int, int], Sampled] | None = None,
    ) -> None:
        self.fanouts = check_fanouts(fanouts)
        self.csr = csr
        self.hop = hop
        self.book = book
        self.rank = transport.rank
        self.world = transport.world_size
        self.num_nodes = book.num_nodes
        self._slots = SlotTables(book.num_nodes, 2**31)
        self.counters: dict[str, float] = {}
        self._counting = threading.Lock()  # a loader thread samples too
        self.reset_counters()
        handlers: dict[str, Any] = {"hop": self._answer}
        if biased:
            handlers["bias"] = self._store_bias
        # Per requester, its biases by number (a few kept: a loader samples
        # ahead of the trainer's fallback batches).
        self._biases: dict[int, dict[int, NodeBias]] = {}
        self._biases_lock = threading.Lock()  # the service's thread stores them
        self._sent_nid: torch.Tensor | None = None  # the IDs the peers hold
        self.service = transport.open_service(service, handlers)

    def reset_counters(self) -> None:
        self.counters = dict.fromkeys(
            ("local_rows", "remote_rows", "requests", "edges", "batches", "seconds"),
            0,
        )

    def sample(
        self, seeds: torch.Tensor, batch_seed: int, bias: int | None = None
    ) -> SampledBatch:
        """The blocks of one mini-batch (global IDs), input layer first.

        Args:
            seeds: int64 [B], distinct global IDs (any owners).
            batch_seed: the batch's seed (an integer, as
                :func:`~graphwire.sampler.uniform.check_batch_seed` takes it);
                layer ``l`` draws with ``derive_seed(batch_seed, l)``.
            bias: the number of this rank's published bias to sample with
                (a ``biased`` sampler), or None: uniformly.
        """
        began = time.perf_counter()
        seeds = check_seeds(seeds, self.num_nodes)
        batch_seed = check_batch_seed(batch_seed, "batch_seed")
        extra = () if bias is None else (bias,)
        blocks: list[Block] = []
        dst_nid = seeds
        for layer in reversed(range(len(self.fanouts))):
            seed = layer_seed(batch_seed, layer)
            block = self._sample_block(dst_nid, self.fanouts[layer], seed, extra)
            blocks.append(block)
            dst_nid = block.src_nid
        blocks.reverse()
        self._count(batches=1, seconds=time.perf_counter() - began)
        return SampledBatch(seeds=seeds, blocks=blocks)

    def publish(self, number: int, bias: NodeBias) -> None:
        """Make ``bias`` this rank's bias ``number`` at every owner (one
        message per peer, ``<service>.bias``; returns once all hold it)."""
        if bias.local != self.book.part_range(self.rank):
            raise ValueError(
                f"publish: the bias's local range {bias.local} is not rank "
                f"{self.rank}'s {self.book.part_range(self.rank)}"
            )
        self._store_bias(self.rank, _bias_message(number, bias, True))
        peers = [p for p in range(self.world) if p != self.rank]
        # The IDs travel with the first bias, and again only when they change.
        same = self._sent_nid is not None and torch.equal(self._sent_nid, bias.nid)
        if peers:
            message = _bias_message(number, bias, not same)
            self.service.call(dict.fromkeys(peers, message), "bias")
        self._sent_nid = bias.nid

    def count_batch(self, seconds: float) -> None:
        """A batch sampled step by step (:meth:`sample_group`,
        :meth:`stitch_layer`) took ``seconds``: counted as :meth:`sample`
        counts its own."""
        self._count(batches=1, seconds=seconds)

    def _count(self, **added: float) -> None:
        with self._counting:
            for name, value in added.items():
                self.counters[name] += value

    def close(self) -> None:
        """Collective: stop serving (after every rank's last :meth:`sample`)."""
        self.service.close()

    # ------------------------------------------------------------------ parts
    def _sample_block(
        self, dst_nid: torch.Tensor, fanout: int, seed: int, extra: tuple[int, ...]
    ) -> Block:
        groups = []
        requests = {}
        for peer, where in self.owners(dst_nid):
            if peer == self.rank:
                groups.append(
                    self.sample_group(dst_nid, where, peer, fanout, seed, extra)
                )
            else:
                requests[peer] = where
        if requests:  # one call: the owners answer at once
            self._count(requests=len(requests))
            self._count(remote_rows=sum(w.numel() for w in requests.values()))
            params = _hop_params(fanout, seed, extra)
            answers = self.service.call(
                {p: [dst_nid[w], params] for p, w in requests.items()}, "hop"
            )
            groups += [self._group(w, answers[p]) for p, w in requests.items()]
        return self.stitch_layer(dst_nid, groups)

    def owners(self, dst_nid: torch.Tensor) -> list[tuple[int, torch.Tensor]]:
        """``(owner, positions in dst_nid)`` of a frontier, owners ascending."""
        return owner_groups(self.book, dst_nid)

    def sample_group(
        self,
        dst_nid: torch.Tensor,
        where: torch.Tensor,
        peer: int,
        fanout: int,
        seed: int,
        extra: tuple[int, ...] = (),
    ) -> Group:
        """The sampled in-edges of ``dst_nid[where]``, all owned by ``peer``:
        here, or with one request to it (``<service>.hop``); one group of
        :func:`stitch_groups`. ``extra``: ``(bias number,)`` or none."""
        if peer == self.rank:
            bias = self._bias_of(self.rank, extra)
            self._count(local_rows=where.numel())
            return (where, *self._draw(dst_nid[where], fanout, seed, bias))
        self._count(requests=1, remote_rows=where.numel())
        request = [dst_nid[where], _hop_params(fanout, seed, extra)]
        return self._group(where, self.service.call({peer: request}, "hop")[peer])

    def _group(self, where: torch.Tensor, answer: list[torch.Tensor]) -> Group:
        counts, src, ids, w = answer
        return (where, counts, src, ids, w if self.csr.weight is not None else None)

    def stitch_layer(self, dst_nid: torch.Tensor, groups: list[Group]) -> Block:
        """A layer's :class:`Block` from its owners' groups (any order)."""
        # Weighted (GCN) or not is the graph's, not the frontier's: an empty
        # one has no group to tell, yet its block gets an empty weight.
        weighted = self.csr.weight is not None
        indptr, sources, eid, weight = stitch_groups(dst_nid.numel(), groups, weighted)
        self._count(edges=eid.numel())
        return self._slots.stitch(dst_nid, indptr, sources, eid, weight)

    def _answer(self, src: int, request: list[torch.Tensor]) -> list[torch.Tensor]:
        dst_nid, params = request
        fanout, seed = int(params[0]), int(params[1])
        bias = self._bias_of(src, tuple(params[2:].tolist()))
        counts, sources, eid, weight = self._draw(dst_nid, fanout, seed, bias)
        empty = torch.empty(0, dtype=torch.float32)
        return [counts, sources, eid, empty if weight is None else weight]

    def _draw(
        self, dst_nid: torch.Tensor, fanout: int, seed: int, bias: NodeBias | None
    ) -> Sampled:
        """One hop of owned nodes: biased (DGS), the hop function, or uniform."""
        if bias is None and self.hop is not None:
            return self.hop(self.csr, dst_nid, fanout, seed)
        return self.csr.sample(dst_nid, fanout, seed, bias)

    def _bias_of(self, rank: int, extra: tuple[int, ...]) -> NodeBias | None:
        """Rank ``rank``'s bias numbered ``extra[0]`` (none: uniform)."""
        if not extra:
            return None
        number = extra[0]
        with self._biases_lock:
            held = self._biases.get(rank, {})
            if number not in held:
                raise ValueError(
                    f"sample: rank {rank} asked with bias {number}, which it "
                    f"has not published here (held: {sorted(held)})"
                )
            return held[number]

    def _store_bias(self, src: int, message: list[torch.Tensor]) -> list[torch.Tensor]:
        header, nid, weight = message
        number, start, stop, eps_bits, with_ids = header.tolist()
        epsilon = float(torch.tensor([eps_bits]).view(torch.float64))
        with self._biases_lock:
            held = self._biases.setdefault(src, {})
            if not with_ids:
                if not held:
                    raise ValueError(f"bias: rank {src} sent weights before IDs")
                nid = held[max(held)].nid
            bias = NodeBias((start, stop), nid, weight, epsilon)
            if bias.local != self.book.part_range(src):
                raise ValueError(f"bias: rank {src} sent a bias for {bias.local}")
            held[number] = bias
            for old in [n for n in held if n < number - _KEPT_BIASES]:
                del held[old]
        return []


_KEPT_BIASES = 2  # a requester's biases kept besides its newest


def owner_groups(
    book: PartitionBook, nid: torch.Tensor
) -> list[tuple[int, torch.Tensor]]:
    """``(owner, positions in nid)`` of global IDs, owners ascending."""
    owner = book.owner(nid)
    return [
        (peer, (owner == peer).nonzero().view(-1)) for peer in owner.unique().tolist()
    ]


def _hop_params(fanout: int, seed: int, extra: tuple[int, ...]) -> torch.Tensor:
    """A hop request's parameters: ``[fanout, seed, *extra]``."""
    return torch.tensor([fanout, seed, *extra], dtype=torch.int64)


def _bias_message(number: int, bias: NodeBias, with_ids: bool) -> list[torch.Tensor]:
    """A bias on the wire: a header, the IDs (or none: the last ones sent),
    the weights."""
    eps_bits = int(torch.tensor([bias.epsilon], dtype=torch.float64).view(torch.int64))
    header = torch.tensor(
        [number, *bias.local, eps_bits, int(with_ids)], dtype=torch.int64
    )
    nid = bias.nid if with_ids else bias.nid[:0]
    return [header, nid, bias.weight.to(torch.float32)]


Group = tuple[
    torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor | None
]


def stitch_groups(
    n: int, groups: list[Group], weighted: bool
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """Edges of several owner groups back in frontier order.

    Args:
        n: frontier size.
        groups: per owner ``(positions in the frontier, counts, sources, eid,
            weight)``, each owner's edges in the order of its positions
            (weight: float32 [e] when ``weighted``, else None).
        weighted: whether the edges carry weights (GCN).

    Returns:
        ``(indptr [n + 1], sources [E], eid [E], weight [E] | None)``: weight
        is None exactly when not ``weighted`` (empty for an empty frontier).
    """
    counts = torch.zeros(n, dtype=torch.int64)
    for where, count, *_ in groups:
        counts[where] = count
    indptr = torch.zeros(n + 1, dtype=torch.int64)
    torch.cumsum(counts, 0, out=indptr[1:])
    total = int(indptr[-1])
    sources = torch.empty(total, dtype=torch.int64)
    eid = torch.empty(total, dtype=torch.int64)
    weight = torch.empty(total, dtype=torch.float32) if weighted else None
    for where, count, src, ids, w in groups:
        # Edge k of this group lands at indptr[its row] + (k - first edge of row).
        first = torch.cumsum(count, 0) - count
        offset = torch.arange(src.numel(), dtype=torch.int64)
        offset -= torch.repeat_interleave(first, count)
        target = torch.repeat_interleave(indptr.index_select(0, where), count) + offset
        sources[target] = src
        eid[target] = ids
        if weight is not None and w is not None:
            weight[target] = w
    return indptr, sources, eid, weight
