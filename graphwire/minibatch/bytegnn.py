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

from graphwire.feature.fetcher import Fetched, count_made
from graphwire.feature.ondemand import OnDemand, OnDemandConfig
from graphwire.minibatch.scheduler import DagRunner, LaunchPolicy
from graphwire.minibatch.taskgraph import TaskGraphSampler
from graphwire.sampler.base import Batch

__all__ = ["ScheduledOnDemand"]


class ScheduledOnDemand(OnDemand):
    """On-demand fetching with its batches made as ``--schedule`` says."""

    config: OnDemandConfig

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.runner: DagRunner | None = None
        self.graphs = TaskGraphSampler(self.sampler, self.store)
        self._taken_at = 0.0

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
        self.runner = DagRunner(
            keys,
            lambda key, dag, finish: self.graphs.make(
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
        if self.runner is None:
            return super().counters()
        return {"schedule": dict(self.runner.counters)}

    def _stop_loader(self) -> None:
        super()._stop_loader()
        if self.runner is not None:
            self.runner.close()
