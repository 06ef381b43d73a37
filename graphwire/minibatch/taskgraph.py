"""ByteGNN's sampling task graphs: each mini-batch as a DAG of small tasks.

ByteGNN (seed ``002`` §4.2.1; digest §3.2 (b)) splits a mini-batch's
sampling into tasks that run in parallel within and across batches. The
*logical* DAG is built once per run from five operators
(:class:`Operator`): node classification's (:func:`supervised_dag`)

    seed -> hop (layer L-1) -> ... -> hop (layer 0) -> end
       \\-> fetch      \\-> fetch          \\-> fetch

and link prediction's (:func:`link_dag`), three such branches, rooted at
the seeds, at the **positive** and at the **negative** operator (both
children of the seed), joined by one end. Each batch gets a *physical*
instance (:meth:`TaskGraphSampler.make`): an operator's tasks are made
once all its parents are done, from their outputs:

- **seed** (one task): the seed function's nodes;
- **positive**, **negative** ``(owner)``: one task per owner of the seeds,
  drawn there or by one request to it (``pair.pos``, ``pair.neg``); their
  distinct results are the branch's nodes. Cost: the nodes;
- **hop** ``(layer, owner)``: one task per owner of the layer's frontier,
  sampled here or by one request to its owner (``sample.hop``), the
  owner-compute rule; then one **join** stitches the layer's block. Cost:
  the in-neighbours of its nodes (owned here: their degrees; elsewhere:
  nodes times the fan-out, the most they can have);
- **fetch** ``(owner)``: the rows of the nodes its parent added (a root's
  nodes, or a hop's new sources), read here or pulled with one request to
  their owner (``kv.pull``). Cost: rows times the feature dimension;
- **end**: the batch, once every other operator is done.

Draws are hashed per ``(seed, node)``, so which thread runs which task,
and in which order, changes nothing: the batches are the serial loop's
(:meth:`~graphwire.sampler.dist.DistNeighborSampler.sample`, and
:class:`~graphwire.minibatch.linkbatch.LinkMaker`), bit for bit. What
changes is the traffic's shape: rows travel in one pull per owner per
operator rather than one per owner per batch.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

import torch

from graphwire.feature.dist import DistFeatureStore
from graphwire.feature.fetcher import Made
from graphwire.minibatch.linkbatch import assemble_link, link_branches
from graphwire.minibatch.scheduler import Task
from graphwire.sampler.base import Batch, Block, SampledBatch
from graphwire.sampler.dist import DistNeighborSampler, Group
from graphwire.sampler.dist_pairs import DistPairSampler
from graphwire.sampler.links import SamplingFunctions, pair_seeds
from graphwire.sampler.uniform import check_batch_seed, check_seeds, layer_seed

__all__ = ["Operator", "TaskGraphSampler", "link_dag", "supervised_dag"]

KINDS = ("seed", "positive", "negative", "hop", "fetch", "end")
ROOTS = ("seed", "positive", "negative")


@dataclass(frozen=True)
class Operator:
    """One node of the logical DAG.

    Attributes:
        name: unique in the DAG.
        kind: one of :data:`KINDS`.
        parents: the operators it waits for.
        branch: the root whose nodes it carries (hop, fetch).
        layer: a hop's layer.
    """

    name: str
    kind: str
    parents: tuple[str, ...] = ()
    branch: str = ""
    layer: int = -1


def _branch(root: str, parent: str, layers: int) -> list[Operator]:
    """A root's fetch, then its hops (last layer first), each fetched."""
    ops = [Operator(f"{root}.fetch", "fetch", (root,), root)]
    before = parent
    for layer in reversed(range(layers)):
        hop = f"{root}.hop{layer}"
        ops.append(Operator(hop, "hop", (before,), root, layer))
        ops.append(Operator(f"{root}.fetch{layer}", "fetch", (hop,), root, layer))
        before = hop
    return ops


def supervised_dag(layers: int) -> tuple[Operator, ...]:
    """Node classification's logical DAG of ``layers`` hops."""
    ops = [Operator("seed", "seed"), *_branch("seed", "seed", layers)]
    return (*ops, Operator("end", "end", tuple(op.name for op in ops)))


def link_dag(layers: int) -> tuple[Operator, ...]:
    """Link prediction's logical DAG: three branches of ``layers`` hops."""
    ops = [
        Operator("seed", "seed"),
        Operator("positive", "positive", ("seed",)),
        Operator("negative", "negative", ("seed",)),
    ]
    for root in ROOTS:
        ops += _branch(root, root, layers)
    return (*ops, Operator("end", "end", tuple(op.name for op in ops)))


@dataclass
class _Instance:
    """One batch's DAG in flight: what its operators have made so far."""

    batch: Batch
    dag: int
    finish: Callable[[object], None]
    nodes: dict[str, torch.Tensor] = field(default_factory=dict)  # op -> output
    added: dict[str, torch.Tensor] = field(default_factory=dict)  # op -> new nodes
    parts: dict[str, list[Any]] = field(default_factory=dict)  # op -> task results
    left: dict[str, int] = field(default_factory=dict)  # op -> tasks to finish
    done: set[str] = field(default_factory=set)
    blocks: dict[str, Block] = field(default_factory=dict)  # hop -> its block
    rows: dict[str, list[tuple[torch.Tensor, torch.Tensor]]] = field(
        default_factory=dict
    )  # branch -> fetched (nid, rows)
    sample_s: float = 0.0
    fetch_s: float = 0.0
    lock: threading.Lock = field(default_factory=threading.Lock)


class TaskGraphSampler:
    """Physical task graphs of one rank's batches (module docstring).

    Args:
        sampler: the owner-compute sampler (its fan-outs, input layer first).
        store: the rank's feature store.
        functions: the seed function (the others run at the owners:
            ``sampler``'s hop, ``pairs``' positive and negative).
        pairs: the positive and negative sampler: batches are link
            prediction's (:func:`link_dag`); None: node classification's.
    """

    def __init__(
        self,
        sampler: DistNeighborSampler,
        store: DistFeatureStore,
        functions: SamplingFunctions,
        pairs: DistPairSampler | None = None,
    ) -> None:
        self.sampler, self.store = sampler, store
        self.functions, self.pairs = functions, pairs
        layers = len(sampler.fanouts)
        self.dag = link_dag(layers) if pairs else supervised_dag(layers)
        self.ops = {op.name: op for op in self.dag}
        self.children: dict[str, list[Operator]] = {op.name: [] for op in self.dag}
        for op in self.dag:
            for parent in op.parents:
                self.children[parent].append(op)
        self._degree = sampler.csr.indptr[1:] - sampler.csr.indptr[:-1]
        self._start = {
            "seed": self._seed,
            "positive": self._pair,
            "negative": self._pair,
            "hop": self._hop,
            "fetch": self._fetch,
            "end": self._end,
        }

    def make(
        self, batch: Batch, dag: int, finish: Callable[[object], None]
    ) -> Iterable[Task]:
        """The roots of ``batch``'s DAG; its end calls ``finish`` with the
        batch, as the serial loader makes it."""
        run = _Instance(batch, dag, finish)
        return self._start["seed"](run, self.ops["seed"])

    # ------------------------------------------------------------ the walk
    def _complete(self, run: _Instance, op: Operator) -> list[Task]:
        """``op`` is done: the tasks of its children whose parents all are."""
        with run.lock:
            run.done.add(op.name)
            ready = [
                child
                for child in self.children[op.name]
                if all(p in run.done for p in child.parents)
            ]
        return [t for child in ready for t in self._start[child.kind](run, child)]

    def _split(
        self,
        run: _Instance,
        op: Operator,
        nid: torch.Tensor,
        work: Callable[[torch.Tensor, int], Any],
        cost: Callable[[torch.Tensor, int], float],
        then: Callable[[], list[Task]],
    ) -> list[Task]:
        """One task per owner of ``nid``: ``work(where, owner)`` stores its
        result in ``run.parts[op]``; the last one done runs ``then``."""
        owners = self.sampler.owners(nid)
        run.parts[op.name] = []
        run.left[op.name] = len(owners)
        if not owners:
            return then()

        def task(where: torch.Tensor, peer: int) -> list[Task]:
            result = work(where, peer)
            with run.lock:
                run.parts[op.name].append(result)
                run.left[op.name] -= 1
                last = run.left[op.name] == 0
            return then() if last else []

        return [
            Task(run.dag, cost(where, peer), _bind(task, where, peer), op.name)
            for peer, where in owners
        ]

    # ------------------------------------------------------ the operators
    def _seed(self, run: _Instance, op: Operator) -> list[Task]:
        def seed() -> list[Task]:
            seeds = check_seeds(self.functions.seed(run.batch), self.sampler.num_nodes)
            check_batch_seed(run.batch.seed, "batch_seed")
            run.nodes[op.name] = run.added[op.name] = seeds
            return self._complete(run, op)

        return [Task(run.dag, 0.0, seed, op.name)]

    def _pair(self, run: _Instance, op: Operator) -> list[Task]:
        assert self.pairs is not None
        pairs = self.pairs
        seeds = run.nodes["seed"]
        positive = op.kind == "positive"
        seed = pair_seeds(run.batch.seed)[0 if positive else 1]
        draw = pairs.positive_group if positive else pairs.negative_group

        def work(where: torch.Tensor, peer: int) -> tuple[torch.Tensor, torch.Tensor]:
            began = time.perf_counter()
            drawn = draw(seeds, where, peer, seed)
            with run.lock:
                run.sample_s += time.perf_counter() - began
            return where, drawn

        def joined() -> list[Task]:
            shape = (seeds.numel(),) if positive else (seeds.numel(), pairs.k)
            drawn = torch.empty(shape, dtype=torch.int64)
            for where, values in run.parts.pop(op.name):
                drawn[where] = values
            run.nodes[f"{op.name}.drawn"] = drawn
            nodes = drawn[drawn >= 0] if positive else drawn.reshape(-1)
            run.nodes[op.name] = run.added[op.name] = torch.unique(nodes)
            return self._complete(run, op)

        return self._split(
            run, op, seeds, work, lambda where, peer: float(where.numel()), joined
        )

    def _hop(self, run: _Instance, op: Operator) -> list[Task]:
        frontier = run.nodes[op.parents[0]]
        fanout = self.sampler.fanouts[op.layer]
        seed = layer_seed(run.batch.seed, op.layer)

        def work(where: torch.Tensor, peer: int) -> Group:
            began = time.perf_counter()
            group = self.sampler.sample_group(frontier, where, peer, fanout, seed)
            with run.lock:
                run.sample_s += time.perf_counter() - began
            return group

        def cost(where: torch.Tensor, peer: int) -> float:
            if peer == self.sampler.rank:
                start = frontier[where] - self.sampler.csr.start
                return float(self._degree[start].sum())
            return float(where.numel() * max(fanout, 1))

        def joined() -> list[Task]:
            return [Task(run.dag, 0.0, lambda: self._join(run, op, frontier), "join")]

        return self._split(run, op, frontier, work, cost, joined)

    def _join(self, run: _Instance, op: Operator, frontier: torch.Tensor) -> list[Task]:
        began = time.perf_counter()
        block = self.sampler.stitch_layer(frontier, run.parts.pop(op.name))
        with run.lock:
            run.blocks[op.name] = block
            run.nodes[op.name] = block.src_nid
            run.added[op.name] = block.src_nid[block.num_dst :]
            run.sample_s += time.perf_counter() - began
        return self._complete(run, op)

    def _fetch(self, run: _Instance, op: Operator) -> list[Task]:
        nid = run.added[op.parents[0]]

        def work(where: torch.Tensor, peer: int) -> None:
            del peer
            began = time.perf_counter()
            rows = self.store.pull(nid[where])
            with run.lock:
                run.rows.setdefault(op.branch, []).append((nid[where], rows))
                run.fetch_s += time.perf_counter() - began

        def cost(where: torch.Tensor, peer: int) -> float:
            del peer
            return float(where.numel() * self.store.dim)

        return self._split(run, op, nid, work, cost, lambda: self._complete(run, op))

    def _end(self, run: _Instance, op: Operator) -> list[Task]:
        del op
        return [Task(run.dag, 0.0, lambda: self._finish(run), "end")]

    def _finish(self, run: _Instance) -> None:
        began = time.perf_counter()
        self.sampler.count_batch(run.sample_s)
        roots = ROOTS if self.pairs else ROOTS[:1]
        branches, rows = [], []
        for root in roots:
            hops = [self.ops[f"{root}.hop{layer}"] for layer in range(self._layers)]
            blocks = [run.blocks[hop.name] for hop in hops]
            branch = SampledBatch(seeds=run.nodes[root], blocks=blocks)
            branches.append(branch)
            rows.append(self._in_order(branch.input_nid, run.rows.get(root, [])))
        local = torch.cat([self.store.is_local(b.input_nid) for b in branches])
        if self.pairs:
            seeds = run.nodes["seed"]
            drawn = run.nodes["positive.drawn"], run.nodes["negative.drawn"]
            _, pairs = link_branches(seeds, *drawn)
            sampled, x, y = assemble_link(branches, rows, pairs)
        else:
            sampled, x = branches[0], rows[0]
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

    @property
    def _layers(self) -> int:
        return len(self.sampler.fanouts)

    def _in_order(
        self, input_nid: torch.Tensor, fetched: list[tuple[torch.Tensor, torch.Tensor]]
    ) -> torch.Tensor:
        """The fetched rows in ``input_nid``'s order (each node fetched once)."""
        order, perm = input_nid.sort()
        x = torch.empty(input_nid.numel(), self.store.dim)
        for nid, rows in fetched:
            x[perm[torch.searchsorted(order, nid)]] = rows
        return x


def _bind(fn: Callable[..., list[Task]], *args: object) -> Callable[[], list[Task]]:
    return lambda: fn(*args)
