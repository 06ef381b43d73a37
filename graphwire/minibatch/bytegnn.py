"""``--fetch on-demand --schedule serial|fifo|bytegnn``: who makes the batches.

``serial`` is on-demand fetching as DistDGL's loader does it (one thread
samples and pulls each batch in turn, ahead of the trainer:
:class:`~graphwire.feature.ondemand.OnDemand`). ``bytegnn`` makes each batch
a task graph (:mod:`~graphwire.minibatch.taskgraph`) run by a pool of
``--sampler-threads`` threads under ByteGNN's two-level scheduling
(:mod:`~graphwire.minibatch.scheduler`): a launch score decides when the
next batch's DAG starts, and ready tasks go by (DAG, cost). ``fifo`` is the
baseline with the same pool, tasks in the order they became ready and a
DAG launched whenever fewer than ``--prefetch`` are alive.

The batches are the serial loop's whatever the schedule (the draws are
hashed by node, the rows are the store's): only when and on which thread
they are made changes. Each epoch's record adds ``extra["schedule"]``: the
queue of finished batches waiting for the trainer and the DAGs in flight
(mean and largest), and the CPU utilisation the launcher saw; the run's
counters, the DAGs launched.
"""

from __future__ import annotations

import time
from typing import Any

import torch

from graphwire.feature.cache import assemble_inputs
from graphwire.feature.fetcher import Fetched, Made, count_made
from graphwire.feature.ondemand import OnDemand, OnDemandConfig
from graphwire.minibatch.linkbatch import LinkMaker
from graphwire.minibatch.scheduler import DagRunner, LaunchPolicy
from graphwire.minibatch.taskgraph import TaskGraphSampler
from graphwire.sampler.base import Batch, SampledBatch
from graphwire.sampler.dist_pairs import DistPairSampler
from graphwire.sampler.links import SamplingFunctions

__all__ = ["ScheduledOnDemand"]


class ScheduledOnDemand(OnDemand):
    """On-demand fetching with its batches made as ``--schedule`` says."""

    config: OnDemandConfig

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.runner: DagRunner | None = None
        self.functions = SamplingFunctions()
        self.pairs: DistPairSampler | None = None
        self.links: LinkMaker | None = None
        self._pairs_open = True
        self._taken_at = 0.0

    def use_functions(
        self, functions: SamplingFunctions, pairs: DistPairSampler | None
    ) -> None:
        self.functions, self.pairs = functions, pairs
        if pairs is not None:
            self.links = LinkMaker(
                seeds=functions.seed,
                positives=pairs.positives,
                negatives=pairs.negatives,
                sample=self.sampler.sample,
                rows=self._rows,
            )

    def _rows(self, nid: torch.Tensor) -> tuple[torch.Tensor, dict[str, float]]:
        local = self.store.is_local(nid)
        x, counts = assemble_inputs(self.store, None, nid, local, "pull")
        return x, {name: float(value) for name, value in counts.items()}

    def _make(self, batch: Batch) -> Made:
        if self.links is not None:
            return self.links.make(batch)
        return super()._make(batch)

    def _sample(self, batch: Batch) -> SampledBatch:
        return self.sampler.sample(self.functions.seed(batch), batch.seed)

    def begin_epoch(self, epoch: int) -> None:
        schedule = self._schedule
        if self.config.schedule == "serial":
            super().begin_epoch(epoch)
            return
        if self.runner is not None or schedule is None:
            return
        epochs = range(epoch, schedule.epochs.stop)
        keys = [(e, i) for e in epochs for i in range(schedule.steps)]
        policy = LaunchPolicy(
            sigma=self.config.launch_sigma, fifo=self.config.schedule == "fifo"
        )
        graphs = TaskGraphSampler(self.sampler, self.store, self.functions, self.pairs)
        self.runner = DagRunner(
            keys,
            lambda key, dag, finish: graphs.make(
                self._batch(key),  # type: ignore[arg-type]
                dag,
                finish,
            ),
            threads=self.config.threads,
            schedule=self.config.schedule,
            policy=policy,
            depth=self.config.prefetch,
        )

    def get(self, batch: Batch, stats: dict[str, float]) -> Fetched:
        if self.runner is None:
            return super().get(batch, stats)
        began = time.perf_counter()
        made = self.runner.get((batch.epoch, batch.index))
        self._taken_at = time.perf_counter()
        stats["wait_s"] += self._taken_at - began
        return count_made(made, stats, exposed=False)  # type: ignore[arg-type]

    def release(self, batch: Batch) -> None:
        if self.runner is None:
            super().release(batch)
            return
        self.runner.release(time.perf_counter() - self._taken_at)

    def epoch_counters(self) -> dict[str, Any]:
        if self.runner is None:
            return {}
        return {"schedule": self.runner.window()}

    def counters(self) -> dict[str, Any]:
        out = super().counters() if self.runner is None else {}
        if self.runner is not None:
            out["schedule"] = dict(self.runner.counters)
        if self.pairs is not None:
            out["pairs"] = {k: dict(v) for k, v in self.pairs.counters.items()}
        return out

    def finish(self) -> None:
        super().finish()  # the loader and the runner stop first
        if self.pairs is not None and self._pairs_open:
            self.pairs.close()
            self._pairs_open = False

    def _stop_loader(self) -> None:
        super()._stop_loader()
        if self.runner is not None:
            self.runner.close()
