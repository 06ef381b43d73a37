"""Layer-wise importance sampling across ranks: FastGCN and LADIES.

DGS's baselines (seed ``004``, §3.4): instead of each destination keeping
``k`` of its neighbours, each *layer* samples a set ``S`` of ``t`` nodes for
all its destinations at once, and a destination keeps the in-edges that end
in ``S``:

- **FastGCN** (Chen et al., 2018) draws ``S`` from one distribution over all
  nodes, ``q(u) ∝ Σ_v A(v, u)²`` (the squared norm of ``u``'s column of the
  aggregation matrix). It is computed once before training: every rank sums
  the columns of its own rows, and one all-reduce of ``N`` floats makes the
  whole vector (``setup.fastgcn``, in the ledger);
- **LADIES** (Zou et al., 2019) draws ``S`` from the layer's candidates, the
  in-neighbours of its destinations, with ``p(u) ∝ Σ_{v ∈ D} A(v, u)²`` over
  those destinations ``D`` only. Those sums change every layer of every
  batch: the owners of ``D`` send their partial sums to the trainer, one
  request per owner per layer (``layer.norms``): the per-iteration
  probability sync DGS counts against it.

``S`` is drawn without replacement (LADIES' ``replace=False``; for FastGCN
too, so both keep ``t`` distinct nodes or every candidate). The owners of the
destinations then return the edges into ``S`` (``layer.edges``, with ``S`` in
the request); each edge's weight is ``A(v, u) / p(u)``, scaled so that a
row's weights sum to its full row's (unbiased sums, exact where a row keeps
every edge; GraphSAGE and GAT ignore weights). As every
:class:`~graphwire.sampler.base.Block`, a layer's sources are its
destinations first, then the sampled nodes they reach, and the layer below
samples for all of them.

``A`` is the graph the model aggregates over (:class:`OwnedCSR`): GCN's
normalised weights, or ``1 / in-degree`` (the mean) for GraphSAGE and GAT.
Draws are seeded by ``(batch seed, layer)``: the same seed, the same batch.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence

import torch

from graphwire.comm.base import Transport
from graphwire.partition.book import PartitionBook
from graphwire.sampler.base import Block, SampledBatch
from graphwire.sampler.dist import Group, OwnedCSR, stitch_groups
from graphwire.sampler.uniform import (
    SlotTables,
    check_batch_seed,
    check_seeds,
    layer_seed,
)

__all__ = ["KINDS", "DistLayerSampler", "column_norms"]

KINDS = ("fastgcn", "ladies")


def _row_weights(csr: OwnedCSR) -> torch.Tensor:
    """float32 [e]: ``A(v, u)`` of each stored in-edge."""
    if csr.weight is not None:
        return csr.weight
    deg = csr.indptr.diff()
    return torch.repeat_interleave(1.0 / deg.clamp(min=1).to(torch.float32), deg)


def column_norms(csr: OwnedCSR, rows: torch.Tensor | None = None) -> tuple:
    """``(u [c], Σ_v A(v, u)² [c])`` over owned ``rows`` (global IDs; None:
    every owned row), ``u`` sorted and distinct."""
    weight = _row_weights(csr)
    if rows is None:
        pos = torch.arange(csr.indices.numel())
    else:
        local = rows - csr.start
        start, stop = csr.indptr[local], csr.indptr[local + 1]
        count = stop - start
        first = torch.cumsum(count, 0) - count
        pos = torch.repeat_interleave(start - first, count) + torch.arange(
            int(count.sum())
        )
    u, inverse = torch.unique(csr.indices[pos], return_inverse=True)
    sums = torch.zeros(u.numel(), dtype=torch.float64)
    sums.index_add_(0, inverse, weight[pos].to(torch.float64) ** 2)
    return u, sums


class DistLayerSampler:
    """Layer-wise sampling of blocks around seeds (module docstring); every
    rank makes one, together.

    Args:
        csr: this rank's owned in-edges.
        book: the partition book.
        transport: the run's transport (opens the ``layer`` service; FastGCN
            also all-reduces its distribution: both collective).
        layer_nodes: ``t``, per layer (input layer first).
        kind: ``"fastgcn"`` or ``"ladies"``.
    """

    def __init__(
        self,
        csr: OwnedCSR,
        book: PartitionBook,
        transport: Transport,
        layer_nodes: Sequence[int],
        kind: str,
    ) -> None:
        if kind not in KINDS:
            raise ValueError(f"kind: expected one of {KINDS}, got {kind!r}")
        if not layer_nodes or min(layer_nodes) < 1:
            raise ValueError(
                f"layer_nodes: expected >= 1 each, got {list(layer_nodes)}"
            )
        self.csr, self.book, self.kind = csr, book, kind
        self.layer_nodes = [int(t) for t in layer_nodes]
        self.rank = transport.rank
        self.num_nodes = book.num_nodes
        self._weight = _row_weights(csr)
        self._slots = SlotTables(book.num_nodes, 2**31)
        self._counting = threading.Lock()
        self.counters: dict[str, float] = dict.fromkeys(
            ("requests", "edges", "batches", "seconds", "candidates"), 0
        )
        self.q: torch.Tensor | None = None
        if kind == "fastgcn":
            u, sums = column_norms(csr)
            total = torch.zeros(book.num_nodes, dtype=torch.float32)
            total[u] = sums.to(torch.float32)
            self.q = transport.all_reduce_sum(total, "setup.fastgcn")
        handlers = {"edges": self._serve_edges, "norms": self._serve_norms}
        self.service = transport.open_service("layer", handlers)

    @property
    def fanouts(self) -> list[int]:
        return self.layer_nodes

    def sample(self, seeds: torch.Tensor, batch_seed: int) -> SampledBatch:
        """The blocks of one mini-batch, input layer first."""
        began = time.perf_counter()
        seeds = check_seeds(seeds, self.num_nodes)
        batch_seed = check_batch_seed(batch_seed, "batch_seed")
        blocks: list[Block] = []
        dst = seeds
        for layer in reversed(range(len(self.layer_nodes))):
            gen = torch.Generator().manual_seed(layer_seed(batch_seed, layer))
            chosen, prob = self._draw(dst, self.layer_nodes[layer], gen)
            block = self._block(dst, chosen, prob)
            blocks.append(block)
            dst = block.src_nid
        blocks.reverse()
        self._count(batches=1, seconds=time.perf_counter() - began)
        return SampledBatch(seeds=seeds, blocks=blocks)

    def close(self) -> None:
        """Collective: stop serving."""
        self.service.close()

    # ------------------------------------------------------------- drawing
    def _draw(
        self, dst: torch.Tensor, t: int, gen: torch.Generator
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """``(S sorted [s], p(S) [s])``: the layer's sampled nodes."""
        if self.q is not None:
            candidates = torch.arange(self.num_nodes)
            weight = self.q.to(torch.float64)
        else:
            candidates, weight = self._ladies_norms(dst)
        self._count(candidates=candidates.numel())
        positive = weight > 0
        candidates, weight = candidates[positive], weight[positive]
        if candidates.numel() == 0:
            return candidates, weight
        p = weight / weight.sum()
        if candidates.numel() <= t:
            picked = torch.arange(candidates.numel())
        else:
            picked = torch.multinomial(p, t, replacement=False, generator=gen)
        order = torch.sort(candidates[picked])
        return order.values, p[picked][order.indices]

    def _ladies_norms(self, dst: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """LADIES' candidates and their column sums over ``dst``'s rows,
        from every owner of some of them."""
        owner = self.book.owner(dst)
        parts = []
        requests = {}
        for peer in owner.unique().tolist():
            rows = dst[owner == peer]
            if peer == self.rank:
                parts.append(column_norms(self.csr, rows))
            else:
                requests[peer] = [rows]
        if requests:
            self._count(requests=len(requests))
            answers = self.service.call(requests, "norms")
            parts.extend((a[0], a[1].to(torch.float64)) for a in answers.values())
        u = torch.cat([p[0] for p in parts])
        sums = torch.cat([p[1] for p in parts])
        candidates, inverse = torch.unique(u, return_inverse=True)
        total = torch.zeros(candidates.numel(), dtype=torch.float64)
        total.index_add_(0, inverse, sums)
        return candidates, total

    # --------------------------------------------------------------- edges
    def _block(
        self, dst: torch.Tensor, chosen: torch.Tensor, prob: torch.Tensor
    ) -> Block:
        owner = self.book.owner(dst)
        groups: list[Group] = []
        requests = {}
        for peer in owner.unique().tolist():
            where = (owner == peer).nonzero().view(-1)
            if peer == self.rank:
                groups.append((where, *self._edges(dst[where], chosen, prob)))
            else:
                requests[peer] = (where, [dst[where], chosen, prob.to(torch.float32)])
        if requests:
            self._count(requests=len(requests))
            answers = self.service.call(
                {peer: request for peer, (_, request) in requests.items()}, "edges"
            )
            for peer, (where, _) in requests.items():
                groups.append((where, *answers[peer]))
        indptr, sources, eid, weight = stitch_groups(dst.numel(), groups, True)
        self._count(edges=eid.numel())
        return self._slots.stitch(dst, indptr, sources, eid, weight)

    def _edges(
        self, dst: torch.Tensor, chosen: torch.Tensor, prob: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """Owned ``dst``'s in-edges into ``chosen``: ``(counts, sources, eid,
        weight)``, weights ``A / p`` scaled to each row's full sum."""
        local = dst - self.csr.start
        start, stop = self.csr.indptr[local], self.csr.indptr[local + 1]
        count = stop - start
        row = torch.repeat_interleave(torch.arange(dst.numel()), count)
        first = torch.cumsum(count, 0) - count
        pos = torch.repeat_interleave(start - first, count) + torch.arange(
            int(count.sum())
        )
        src = self.csr.indices[pos]
        if chosen.numel():
            at = torch.searchsorted(chosen, src).clamp(max=chosen.numel() - 1)
            keep = chosen[at] == src
        else:
            at = torch.zeros_like(src)
            keep = torch.zeros_like(src, dtype=torch.bool)
        full = torch.zeros(dst.numel(), dtype=torch.float64)
        full.index_add_(0, row, self._weight[pos].to(torch.float64))
        row, pos, at = row[keep], pos[keep], at[keep]
        raw = self._weight[pos].to(torch.float64) / prob[at].to(torch.float64)
        kept = torch.zeros(dst.numel(), dtype=torch.float64)
        kept.index_add_(0, row, raw)
        scale = full / kept.clamp(min=1e-300)
        weight = (raw * scale[row]).to(torch.float32)
        counts = torch.bincount(row, minlength=dst.numel())
        return counts, self.csr.indices[pos], pos + self.csr.edge_offset, weight

    def _serve_edges(self, src: int, request: list[torch.Tensor]) -> list[torch.Tensor]:
        dst, chosen, prob = request
        return list(self._edges(dst, chosen, prob))

    def _serve_norms(self, src: int, request: list[torch.Tensor]) -> list[torch.Tensor]:
        (rows,) = request
        u, sums = column_norms(self.csr, rows)
        return [u, sums.to(torch.float32)]

    def _count(self, **added: float) -> None:
        with self._counting:
            for name, value in added.items():
                self.counters[name] += value
