"""ByteGNN's sampling task graphs: each mini-batch as a DAG of small tasks.

ByteGNN (seed ``002`` §4.2.1; digest §3.2 (b)) splits a mini-batch's
sampling into tasks that run in parallel within and across batches. The
*logical* DAG (:func:`supervised_dag`) is

    seed -> hop (layer L-1) -> ... -> hop (layer 0) -> end
                 \\-> fetch        \\-> fetch

and each batch gets a *physical* instance (:meth:`TaskGraphSampler.make`):

- **seed**: the batch's seeds, the last layer's frontier;
- **hop** ``(layer, owner)``: one task per owner of the layer's frontier:
  its nodes sampled here, or by one request to their owner
  (``sample.hop``), the owner-compute rule. Cost: the in-neighbours of its
  nodes (owned here: their degrees; elsewhere: nodes times the fan-out,
  the most they can have);
- **join** ``(layer)``: once the layer's hops are done, its block is
  stitched; its new source nodes start the next layer's hops and, at once,
  one **fetch** task per owner of them;
- **fetch** ``(layer, owner)``: the rows of those nodes, read here or
  pulled with one request to their owner (``kv.pull``). Cost: rows times
  the feature dimension. Every input node is fetched once, by the join
  that first finds it;
- **end**: after the last join and every fetch, the batch: its blocks,
  its input rows in input order, its labels.

Draws are hashed per ``(layer seed, node)``, so which thread samples which
owner's part, and in which order, changes nothing: the blocks and rows are
:meth:`~graphwire.sampler.dist.DistNeighborSampler.sample`'s and
:func:`~graphwire.feature.cache.assemble_inputs`'s, bit for bit. What
changes is the traffic's shape: a batch's rows travel in one pull per owner
and layer rather than one per owner.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

import torch

from graphwire.feature.dist import DistFeatureStore
from graphwire.feature.fetcher import Made
from graphwire.minibatch.scheduler import Task
from graphwire.sampler.base import Batch, Block, SampledBatch
from graphwire.sampler.dist import DistNeighborSampler, Group
from graphwire.sampler.uniform import check_batch_seed, check_seeds, layer_seed

__all__ = ["Operator", "TaskGraphSampler", "supervised_dag"]


@dataclass(frozen=True)
class Operator:
    """One node of the logical DAG: an operator and the ones it waits for."""

    name: str
    kind: str  # seed, hop, fetch, end
    parents: tuple[str, ...] = ()


def supervised_dag(layers: int) -> tuple[Operator, ...]:
    """The logical DAG of a supervised batch of ``layers`` hops."""
    ops = [Operator("seed", "seed")]
    before = "seed"
    for layer in reversed(range(layers)):
        ops.append(Operator(f"hop{layer}", "hop", (before,)))
        ops.append(Operator(f"fetch{layer}", "fetch", (f"hop{layer}",)))
        before = f"hop{layer}"
    fetches = tuple(f"fetch{layer}" for layer in range(layers))
    ops.append(Operator("end", "end", (before, *fetches)))
    return tuple(ops)


@dataclass
class _Instance:
    """One batch's DAG in flight: what its tasks have made so far."""

    batch: Batch
    dag: int
    finish: Callable[[object], None]
    blocks: list[Block | None]
    seeds: torch.Tensor = field(default_factory=lambda: torch.empty(0))
    groups: dict[int, list[Group]] = field(default_factory=dict)
    hops_left: dict[int, int] = field(default_factory=dict)
    rows: list[tuple[torch.Tensor, torch.Tensor]] = field(default_factory=list)
    fetches_left: int = 0
    joined: bool = False
    sample_s: float = 0.0
    fetch_s: float = 0.0
    lock: threading.Lock = field(default_factory=threading.Lock)


class TaskGraphSampler:
    """Physical task graphs of one rank's batches (module docstring).

    Args:
        sampler: the owner-compute sampler (its fan-outs, input layer
            first).
        store: the rank's feature store.
    """

    def __init__(self, sampler: DistNeighborSampler, store: DistFeatureStore) -> None:
        self.sampler, self.store = sampler, store
        self._degree = sampler.csr.indptr[1:] - sampler.csr.indptr[:-1]

    def make(
        self, batch: Batch, dag: int, finish: Callable[[object], None]
    ) -> Iterable[Task]:
        """The roots of ``batch``'s DAG (its seed task); its end task calls
        ``finish`` with the batch, as :meth:`OnDemand._make` makes it."""
        layers = len(self.sampler.fanouts)
        run = _Instance(batch, dag, finish, [None] * layers)
        return [Task(dag, 0.0, lambda: self._seed(run), "seed")]

    # ------------------------------------------------------------- tasks
    def _seed(self, run: _Instance) -> list[Task]:
        seeds = check_seeds(run.batch.seeds, self.sampler.num_nodes)
        check_batch_seed(run.batch.seed, "batch_seed")
        run.seeds = seeds
        last = len(self.sampler.fanouts) - 1
        fetches = self._fetches(run, last, seeds)
        return self._hops(run, last, seeds) + fetches

    def _hops(self, run: _Instance, layer: int, frontier: torch.Tensor) -> list[Task]:
        fanout = self.sampler.fanouts[layer]
        seed = layer_seed(run.batch.seed, layer)
        owners = self.sampler.owners(frontier)
        run.groups[layer] = []
        run.hops_left[layer] = len(owners)
        if not owners:  # an empty frontier: the layer joins at once
            return [
                Task(run.dag, 0.0, lambda: self._join(run, layer, frontier), "join")
            ]
        tasks = []
        for peer, where in owners:
            if peer == self.sampler.rank:
                start = frontier[where] - self.sampler.csr.start
                cost = float(self._degree[start].sum())
            else:
                cost = float(where.numel() * max(fanout, 1))
            tasks.append(
                Task(
                    run.dag,
                    cost,
                    _bind(self._hop, run, layer, frontier, where, peer, fanout, seed),
                    f"hop{layer}",
                )
            )
        return tasks

    def _hop(
        self,
        run: _Instance,
        layer: int,
        frontier: torch.Tensor,
        where: torch.Tensor,
        peer: int,
        fanout: int,
        seed: int,
    ) -> list[Task]:
        began = time.perf_counter()
        group = self.sampler.sample_group(frontier, where, peer, fanout, seed)
        with run.lock:
            run.groups[layer].append(group)
            run.hops_left[layer] -= 1
            last = run.hops_left[layer] == 0
            run.sample_s += time.perf_counter() - began
        if not last:
            return []
        return [Task(run.dag, 0.0, lambda: self._join(run, layer, frontier), "join")]

    def _join(self, run: _Instance, layer: int, frontier: torch.Tensor) -> list[Task]:
        began = time.perf_counter()
        block = self.sampler.stitch_layer(frontier, run.groups.pop(layer))
        with run.lock:
            run.blocks[layer] = block
            run.sample_s += time.perf_counter() - began
        # The new sources' fetches are counted before the last join is
        # marked, so an earlier fetch ending now does not end the batch.
        tasks = self._fetches(run, layer, block.src_nid[block.num_dst :])
        if layer > 0:
            return tasks + self._hops(run, layer - 1, block.src_nid)
        with run.lock:
            run.joined = True
        return tasks or self._end_if_done(run)

    def _fetches(self, run: _Instance, layer: int, nid: torch.Tensor) -> list[Task]:
        owners = self.sampler.owners(nid)
        with run.lock:
            run.fetches_left += len(owners)
        return [
            Task(
                run.dag,
                float(where.numel() * self.store.dim),
                _bind(self._fetch, run, nid[where]),
                f"fetch{layer}",
            )
            for _, where in owners
        ]

    def _fetch(self, run: _Instance, nid: torch.Tensor) -> list[Task]:
        began = time.perf_counter()
        rows = self.store.pull(nid)
        with run.lock:
            run.rows.append((nid, rows))
            run.fetches_left -= 1
            run.fetch_s += time.perf_counter() - began
        return self._end_if_done(run)

    def _end_if_done(self, run: _Instance) -> list[Task]:
        with run.lock:
            if not run.joined or run.fetches_left:
                return []
            run.fetches_left = -1  # the end is made once
        return [Task(run.dag, 0.0, lambda: self._end(run), "end")]

    def _end(self, run: _Instance) -> None:
        began = time.perf_counter()
        self.sampler.count_batch(run.sample_s)
        blocks = [b for b in run.blocks if b is not None]
        sampled = SampledBatch(seeds=run.seeds, blocks=blocks)
        input_nid = sampled.input_nid
        order, perm = input_nid.sort()
        x = torch.empty(input_nid.numel(), self.store.dim)
        for nid, rows in run.rows:  # each input node in one of them
            x[perm[torch.searchsorted(order, nid)]] = rows
        local = self.store.is_local(input_nid)
        y = self.store.labels(sampled.seeds)
        counts: dict[str, float] = {
            "cache_hits": 0,
            "local_rows": int(local.sum()),
            "missed_rows": int(local.numel() - local.sum()),
            "sample_busy_s": run.sample_s,
            "fetch_busy_s": run.fetch_s + time.perf_counter() - began,
        }
        made: Made = (sampled, x, y, counts)
        run.finish(made)


def _bind(fn: Callable[..., list[Task]], *args: object) -> Callable[[], list[Task]]:
    return lambda: fn(*args)
