"""`OnDemand` (``--fetch on-demand``): DistDGL's fetch, batch by batch.

Each batch is sampled (the owner-compute sampler: remote frontiers are
sampled by their owners, ``sample.hop``) and its input rows are read where
they live: local rows from this rank's shard, remote ones with one pull per
owner (``kv.pull``). Nothing is cached or kept across batches.

As DistDGL's loader does, a thread samples and fetches the batches ahead of
the trainer while it computes, at most ``prefetch`` (Q) alive at once, the
one in training included (:class:`~graphwire.feature.prefetch.Prefetcher`):
the trainer waits (``wait_s``) only where the loader has not kept up. A
batch the trainer reaches first it makes itself (``sample_s``, ``fetch_s``,
a fallback); ``--prefetch 1`` makes every batch so, when the trainer reaches
it. Either way the batches, their blocks and rows are the same: only where
the time goes changes. The seconds spent sampling and fetching wherever they
ran are counted too (``sample_busy_s``, ``fetch_busy_s``).
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from typing import Any

import torch

from graphwire.feature.cache import assemble_inputs
from graphwire.feature.fetcher import (
    Fetched,
    Fetcher,
    Made,
    Schedule,
    count_made,
    take_batch,
)
from graphwire.feature.prefetch import Prefetcher
from graphwire.options import OptionError, check_options, option
from graphwire.sampler.base import Batch, SampledBatch

__all__ = ["DEFAULT_PREFETCH", "SCHEDULES", "OnDemand", "OnDemandConfig"]

DEFAULT_PREFETCH = 4  # Q of both fetchers: they share --prefetch
PREFETCH_HELP = (
    "the most batches made at once, the one in training included (Q; 1: none "
    "ahead): on-demand samples and fetches them, rapid assembles them from "
    "its schedule and cache"
)


SCHEDULES = ("serial", "fifo", "bytegnn")


@dataclass(frozen=True, kw_only=True, slots=True)
class OnDemandConfig:
    """On-demand fetching's settings: how far ahead its batches are made,
    and how (``schedule``: this module's loader is ``serial``; the task-graph
    schedules are :class:`~graphwire.minibatch.bytegnn.ScheduledOnDemand`'s,
    the fetcher ``--fetch on-demand`` names)."""

    prefetch: int = option(DEFAULT_PREFETCH, least=1, help=PREFETCH_HELP)
    schedule: str = option(
        "serial",
        choices=SCHEDULES,
        help="on-demand: serial (one loader thread, DistDGL), bytegnn (each "
        "batch a task graph on a thread pool, ByteGNN's launch score and "
        "task priorities) or fifo (the same pool, tasks first come first "
        "served)",
    )
    sampler_threads: int | None = option(
        None, least=1, help="fifo, bytegnn: sampling threads (unset: 2)"
    )
    sigma: float | None = option(
        None,
        least=0.0,
        strict=True,
        help="bytegnn: σ, the launch score a new batch's DAG must reach "
        "(seconds since the last launch x f(CPU%%) x balance; unset: 1)",
    )

    def __post_init__(self) -> None:
        check_options(self)
        if self.sampler_threads is not None and self.schedule == "serial":
            raise OptionError(
                "sampler_threads", "only with a fifo or bytegnn schedule",
                other="schedule",
            )  # fmt: skip
        if self.sigma is not None and self.schedule != "bytegnn":
            raise OptionError(
                "sigma", "only with the bytegnn schedule", other="schedule"
            )

    @property
    def threads(self) -> int:
        """The sampling pool's threads (fifo, bytegnn)."""
        return 2 if self.sampler_threads is None else self.sampler_threads

    @property
    def launch_sigma(self) -> float:
        """σ (bytegnn)."""
        return 1.0 if self.sigma is None else self.sigma


class OnDemand(Fetcher):
    """Sample each batch and pull its remote input rows, ahead of the trainer."""

    config: OnDemandConfig

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.prefetcher: Prefetcher | None = None
        self._schedule: Schedule | None = None
        self._epoch: tuple[int, list[Batch]] = (-1, [])  # the loader's epoch
        self._lock = threading.Lock()

    def start(self, schedule: Schedule, first: int, saved: Any | None) -> None:
        del first, saved
        self._schedule = schedule

    def begin_epoch(self, epoch: int) -> None:
        """Start the loader with the first epoch (not in the set-up, whose
        window of the run's traffic it would take a first batch into)."""
        schedule = self._schedule
        if self.prefetcher is not None or schedule is None:
            return
        if self.config.prefetch < 2:
            return  # every batch made when the trainer reaches it
        epochs = range(epoch, schedule.epochs.stop)
        keys = [(e, i) for e in epochs for i in range(schedule.steps)]
        self.prefetcher = Prefetcher(
            keys=keys,
            make=lambda key: self._make(self._batch(key)),  # type: ignore[arg-type]
            depth=self.config.prefetch,
            nbytes=lambda item: item[1].numel() * 4,  # type: ignore[index]
        )

    def _batch(self, key: tuple[int, int]) -> Batch:
        """Batch ``key`` of the schedule (the loader's thread walks it)."""
        epoch, index = key
        assert self._schedule is not None
        with self._lock:
            if self._epoch[0] != epoch:
                self._epoch = (epoch, self._schedule.batches(epoch))
            return self._epoch[1][index]

    def _make(self, batch: Batch) -> Made:
        """Sample ``batch`` and read its rows, on whichever thread asks."""
        began = time.perf_counter()
        sampled = self._sample(batch)
        sampled_at = time.perf_counter()
        local = self.store.is_local(sampled.input_nid)
        dims = self._dims(batch, local)
        x, counts = assemble_inputs(
            self.store, None, sampled.input_nid, local, "pull", dims=dims
        )
        y = self.store.labels(sampled.seeds)
        busy = {
            "sample_busy_s": sampled_at - began,
            "fetch_busy_s": time.perf_counter() - sampled_at,
        }
        return sampled, x, y, {**counts, **busy}

    def _sample(self, batch: Batch) -> SampledBatch:
        """``batch``'s blocks (the owner-compute uniform sampler)."""
        return self.sampler.sample(batch.seeds, batch.seed)

    def _dims(self, batch: Batch, local: torch.Tensor) -> torch.Tensor | None:
        """The dimensions pulled for ``batch``'s remote input rows (those not
        ``local``): None, every one."""
        del batch, local
        return None

    def get(self, batch: Batch, stats: dict[str, float]) -> Fetched:
        if self.prefetcher is None:
            return count_made(self._make(batch), stats, exposed=True)
        return take_batch(self.prefetcher, batch, lambda: self._make(batch), stats)

    def release(self, batch: Batch) -> None:
        if self.prefetcher is not None:
            self.prefetcher.release((batch.epoch, batch.index))

    def finish(self) -> None:
        """Stop the loader, then the sampler's service (collective): a loader
        sampling ahead would call a service its peers have closed."""
        self._stop_loader()
        super().finish()

    def counters(self) -> dict[str, Any]:
        if self.prefetcher is None:
            return {}
        return {"prefetch": dict(self.prefetcher.counters)}

    def close(self, collective: bool = True) -> None:
        del collective
        self._stop_loader()

    def _stop_loader(self) -> None:
        if self.prefetcher is not None:
            self.prefetcher.close()
