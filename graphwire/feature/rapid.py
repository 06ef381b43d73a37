"""`RapidStore` (``--fetch rapid``): RapidGNN's presampled, cached, prefetched store.

RapidGNN (seed ``003``) knows the whole run's batches before it starts, since
every batch's seeds and sampling seed are hashed from ``(s0, worker, epoch,
batch)``. This store wraps the rank's distributed store with three parts:

1. **the presampled schedule**: every epoch's batches are sampled at set-up
   (every rank at once, each serving the others' remote frontiers) and
   streamed to disk, read back memory-mapped
   (:mod:`~graphwire.sampler.presample`);
2. **the hot cache**: two buffers of ``n_hot`` remote rows, the current
   epoch's most accessed and the next one's, built in the background
   (:class:`~graphwire.feature.cache.HotCache`, ``kv.cache``);
3. **the prefetcher**: a thread assembling batches ahead of the trainer,
   ``prefetch`` (Q) at most alive, cache first, then local rows, then one
   pull per owner for the misses (:class:`~graphwire.feature.prefetch.Prefetcher`,
   ``kv.prefetch``). A batch the trainer reaches first it assembles itself
   (``kv.pull``, counted as a fallback).

It hands the trainer the same blocks and rows as on-demand fetching (only
where rows come from changes), so both train bitwise alike.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

import psutil
import torch

from graphwire.comm.scratch import Scratch
from graphwire.feature.cache import HotCache, assemble_inputs
from graphwire.feature.fetcher import Fetched, Fetcher, Made, Schedule, take_batch
from graphwire.feature.ondemand import DEFAULT_PREFETCH, PREFETCH_HELP
from graphwire.feature.prefetch import Prefetcher
from graphwire.options import check_options, option
from graphwire.sampler.base import Batch, SampledBatch
from graphwire.sampler.presample import (
    PresampledEpoch,
    lock_rank_folder,
    presample_epoch,
)

__all__ = ["DEFAULT_CACHE_MB", "RapidConfig", "RapidStore", "default_cache_mb"]

DEFAULT_CACHE_MB = 512.0  # the cache's budget, at most, when cache_mb is not set
_MEMORY_SHARE = 0.1  # of the memory available at start, for the machine's caches


def default_cache_mb(machine_ranks: int) -> float:
    """The cache's budget when ``--cache-mb`` is not given, MiB:
    :data:`DEFAULT_CACHE_MB`, or less where memory is short, a tenth of the
    memory available at start shared by the machine's ``machine_ranks``
    workers (a 24 GiB machine of 4 workers: 512; of 64 workers: about 35)."""
    available = psutil.virtual_memory().available / 2**20
    return min(DEFAULT_CACHE_MB, available * _MEMORY_SHARE / max(1, machine_ranks))


@dataclass(frozen=True, kw_only=True, slots=True)
class RapidConfig:
    """RapidGNN's settings.

    ``n_hot`` is at most the distinct remote nodes of the presampled run (no
    other node is ever hot; a larger value is cut to that); left out, it is
    ``cache_share`` of that many, within ``cache_mb``
    (:func:`default_cache_mb` when not given). The two buffers take
    ``2 n_hot F 4`` bytes (reported as ``cache_bytes``). Each epoch's buffer
    holds that epoch's ``n_hot`` most accessed remote rows of the schedule.
    """

    n_hot: int | None = option(
        None,
        least=0,
        help="rapid: hot-cache rows (default: every remote row the run reads, "
        "within --cache-mb; memory 2 x n_hot x F x 4 bytes)",
    )
    cache_mb: float | None = option(
        None,
        least=0,
        strict=True,
        excludes="n_hot",
        help=f"rapid: memory for the two cache buffers when --n-hot is not "
        f"given (unset: {DEFAULT_CACHE_MB:g}, or a tenth of the memory "
        "available at start over this machine's workers where that is less)",
    )
    cache_share: float | None = option(
        None,
        least=0,
        most=1,
        excludes="n_hot",
        help="rapid: the share of the remote rows this worker's schedule "
        "reads that the cache holds, its most accessed, within --cache-mb "
        "(unset: 1, all of them)",
    )
    prefetch: int = option(DEFAULT_PREFETCH, least=1, help=PREFETCH_HELP)
    presample_dir: str | None = option(
        None,
        folder=True,
        help="rapid: where the presampled schedule goes (default: a temporary "
        "folder removed at the end)",
    )

    def __post_init__(self) -> None:
        check_options(self)


class RapidStore(Fetcher):
    """Batches from the presampled schedule, the hot cache and the prefetcher."""

    config: RapidConfig

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.cache: HotCache | None = None
        self.prefetcher: Prefetcher | None = None
        self.epochs: dict[int, PresampledEpoch] = {}
        self._scratch: Scratch | None = None  # the presample's, if temporary
        self._lock: IO[str] | None = None  # a given folder's, held
        self._counters: dict[str, Any] = {}

    # ------------------------------------------------------------- set-up
    def start(self, schedule: Schedule, first: int, saved: Any | None) -> None:
        if not schedule.epochs:
            return  # a resumed run that had stopped: nothing to presample
        self._presample(schedule)
        hot_ids = None if saved is None else saved["hot_ids"]
        self._start_cache(schedule, first, hot_ids)

    def _presample(self, schedule: Schedule) -> None:
        """Sample the rest of the run to disk (every rank at once: each
        serves the others' remote frontiers meanwhile), then stop sampling
        (collective)."""
        if self.config.presample_dir is None:
            # Locked while this rank runs: a rank killed outright leaves it,
            # and the next run's rank removes it.
            self._scratch = Scratch.create("graphwire-presample-")
            root = self._scratch.path
        else:
            root = Path(self.config.presample_dir)
        rank = self.sampler.rank
        folder = root / f"rank{rank}"
        if self._scratch is None:  # (a temporary folder is this run's alone)
            self._lock = lock_rank_folder(folder, rank)
        began = time.perf_counter()
        for epoch in schedule.epochs:
            presample_epoch(
                folder, schedule.batches(epoch), self._sample, self.store.is_local
            )
        self._counters["presample_s"] = time.perf_counter() - began
        self.close_sampler()
        num_layers = len(self.sampler.fanouts)
        weighted = self.sampler.csr.weight is not None
        for epoch in schedule.epochs:
            self.epochs[epoch] = PresampledEpoch(folder, epoch, num_layers, weighted)

    def _sample(self, batch: Batch) -> SampledBatch:
        return self.sampler.sample(batch.seeds, batch.seed)

    def _start_cache(
        self, schedule: Schedule, first: int, hot_ids: torch.Tensor | None
    ) -> None:
        # A buffer holds an epoch's hot set and rows kept from earlier ones:
        # remote inputs of the presampled epochs, never any other node. More
        # rows than there are of those would stay empty, yet be allocated.
        touched = torch.unique(torch.cat([e.hot_ids for e in self.epochs.values()]))
        n_hot = self.config.n_hot
        if n_hot is None:
            share = 1.0 if self.config.cache_share is None else self.config.cache_share
            wanted = math.ceil(share * touched.numel())
            budget = self.config.cache_mb
            if budget is None:
                budget = default_cache_mb(self.store.transport.machine_ranks)
            self._counters["cache_budget_mb"] = budget
            # in floats: a huge budget (1e303 MiB) is inf rows, not an error
            fits = budget * 2**20 / (2 * self.store.dim * 4)
            n_hot = wanted if fits >= wanted else int(fits)
        self.cache = HotCache(self.store, min(n_hot, touched.numel()))
        self._counters["n_hot"] = self.cache.n_hot  # the rows allocated
        self._counters["touched_rows"] = touched.numel()
        self.cache.fill(
            first, self.epochs[first].hot_ids if hot_ids is None else hot_ids
        )
        keys = [(e, i) for e in schedule.epochs for i in range(schedule.steps)]
        self.prefetcher = Prefetcher(
            keys=keys,
            make=lambda key: self.assemble(key, "prefetch"),  # type: ignore[arg-type]
            depth=self.config.prefetch,
            nbytes=lambda item: item[1].numel() * 4,  # type: ignore[index]
        )
        self._counters["max_batch_inputs"] = max(
            e.max_inputs for e in self.epochs.values()
        )

    # -------------------------------------------------------------- epochs
    def begin_epoch(self, epoch: int) -> None:
        """Make ``epoch``'s cache buffer the steady one and start building
        the next epoch's in the background."""
        assert self.cache is not None
        if epoch > self.cache.epoch:
            self.cache.swap(epoch)
        if epoch + 1 in self.epochs:
            self.cache.build(epoch + 1, self.epochs[epoch + 1].hot_ids)

    def assemble(self, key: tuple[int, int], kind: str) -> Made:
        """A presampled batch with its input rows and labels, the rows read
        as ``kind`` (``prefetch`` on the prefetcher's thread, ``pull`` by
        the trainer)."""
        began = time.perf_counter()
        epoch, index = key
        sampled, local = self.epochs[epoch].batch(index)
        x, counts = assemble_inputs(
            self.store, self.cache, sampled.input_nid, local, kind, epoch
        )
        y = self.store.labels(sampled.seeds)
        busy = {"fetch_busy_s": time.perf_counter() - began}
        return sampled, x, y, {**counts, **busy}

    def get(self, batch: Batch, stats: dict[str, float]) -> Fetched:
        assert self.prefetcher is not None
        key = (batch.epoch, batch.index)
        return take_batch(
            self.prefetcher, batch, lambda: self.assemble(key, "pull"), stats
        )

    def release(self, batch: Batch) -> None:
        assert self.prefetcher is not None
        self.prefetcher.release((batch.epoch, batch.index))

    def state(self, epoch: int) -> Any | None:
        """The hot set the next epoch starts with."""
        nxt = self.epochs.get(epoch + 1)
        return {"hot_ids": None if nxt is None else nxt.hot_ids}

    def counters(self) -> dict[str, Any]:
        out = dict(self._counters)
        if self.cache is not None:
            out["cache"] = dict(self.cache.counters)
            out["cache_bytes"] = self.cache.nbytes
        if self.prefetcher is not None:
            out["prefetch"] = dict(self.prefetcher.counters)
        return out

    def close(self, collective: bool = True) -> None:
        """Stop the cache builder and the prefetcher, and remove a temporary
        presample. After an error the presample goes first, before joining
        threads that a dead peer can hold up (the prefetcher's for up to
        30 s, the cache builder's until its pull times out) past torchrun's
        grace period, after which nothing would remove it."""
        try:
            if not collective and self._scratch is not None:
                # Threads reading from it fail: fine here. Inside the try: a
                # SIGTERM landing in this rmtree leaves the rest to the finally.
                self._scratch.remove()
            if self.cache is not None:
                # First: a prefetcher that ran into an epoch this run will not
                # start (it stopped early) waits in a lookup for its buffer.
                self.cache.close()
            if self.prefetcher is not None:
                self.prefetcher.close()
            if self.cache is not None:
                try:
                    self.cache.wait_built()
                except RuntimeError:
                    if collective:
                        raise
        finally:
            if self._scratch is not None:
                self._scratch.remove()
            if self._lock is not None:
                self._lock.close()
