"""`RapidStore` (``--fetch rapid``): RapidGNN's presampled, cached, prefetched store.

RapidGNN (seed ``003``) knows the whole run's batches before it starts, since
every batch's seeds and sampling seed are hashed from ``(s0, worker, epoch,
batch)``. This store wraps the rank's distributed store with three parts:

1. **the presampled schedule**: every epoch's batches are sampled ahead and
   streamed to disk, read back memory-mapped
   (:mod:`~graphwire.sampler.presample`): the first epoch at set-up, the
   others on a thread while the trainer trains the ones before
   (:class:`~graphwire.feature.presampler.Presampler`), every rank's sampling
   server answering the others' remote frontiers until the run's end; an
   epoch's files go once the run is done with it;
2. **the hot cache**: two buffers of ``n_hot`` remote rows, the current
   epoch's most accessed and the next one's, built in the background as soon
   as the next epoch is presampled and the trainer has started this one
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
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

import psutil
import torch

from graphwire.comm.scratch import Scratch
from graphwire.feature.base import DEFAULT_KINDS
from graphwire.feature.cache import HotCache, assemble_inputs
from graphwire.feature.explain import ExplainSettings
from graphwire.feature.fetcher import Fetched, Fetcher, Made, Schedule, take_batch
from graphwire.feature.ondemand import DEFAULT_PREFETCH, PREFETCH_HELP
from graphwire.feature.prefetch import Prefetcher
from graphwire.feature.presampler import Presampler
from graphwire.feature.rounds import (
    EXPLAIN_EVERY,
    FEATURE_RATE,
    DimStats,
    ExplainRounds,
    top_dims,
)
from graphwire.options import OptionError, check_options, option
from graphwire.sampler.base import Batch, SampledBatch
from graphwire.sampler.presample import lock_rank_folder

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

    ``n_hot`` is at most the distinct remote nodes of the first epoch's
    presampled batches (a buffer holds one epoch's hot set; a larger value is
    cut to that); left out, it is ``cache_share`` of that many, within
    ``cache_mb`` (:func:`default_cache_mb` when not given). The two buffers
    take ``2 n_hot F 4`` bytes (reported as ``cache_bytes``). Each epoch's
    buffer holds that epoch's ``n_hot`` most accessed remote rows of the
    schedule.
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
        help="rapid: the share of the remote rows an epoch of this worker's "
        "schedule reads (its first) that the cache holds, each epoch's most "
        "accessed, within --cache-mb (unset: 1, all of them)",
    )
    prefetch: int = option(DEFAULT_PREFETCH, least=1, help=PREFETCH_HELP)
    presample_dir: str | None = option(
        None,
        folder=True,
        help="rapid: where the presampled schedule goes (default: a temporary "
        "folder removed at the end)",
    )

    dgs_dims: bool = option(
        False,
        help="rapid: pull the cache's misses with DGS's top --feature-rate "
        "dimensions, from an explainer run every --explain-every steps (no "
        "paper has it)",
    )
    explain_every: int | None = option(
        None,
        least=1,
        help="T_ex: batches between explanation rounds (dgs; "
        f"rapid with --dgs-dims, default {EXPLAIN_EVERY})",
    )
    feature_rate: float | None = option(
        None,
        least=0.0,
        strict=True,
        most=1.0,
        help="N_f: the share of dimensions pulled for remote rows, in (0, 1] "
        f"(dgs; rapid with --dgs-dims, default {FEATURE_RATE})",
    )

    def __post_init__(self) -> None:
        check_options(self)
        for name in ("explain_every", "feature_rate"):
            if getattr(self, name) is not None and not self.dgs_dims:
                raise OptionError(name, "only with dgs_dims", other="dgs_dims")
        if self.dgs_dims and self.prefetch > self.every:
            raise OptionError(
                "prefetch",
                f"at most explain_every ({self.every}) with dgs_dims, got "
                f"{self.prefetch}: a batch made ahead may need the round "
                "started T_ex steps before it",
                other="explain_every",
            )

    @property
    def every(self) -> int:
        """T_ex (``dgs_dims``)."""
        return EXPLAIN_EVERY if self.explain_every is None else self.explain_every

    @property
    def rate(self) -> float:
        """N_f (``dgs_dims``)."""
        return FEATURE_RATE if self.feature_rate is None else self.feature_rate


class RapidStore(Fetcher):
    """Batches from the presampled schedule, the hot cache and the prefetcher."""

    config: RapidConfig
    KINDS = (*DEFAULT_KINDS, "explain")  # the store's pull kinds (dgs_dims)

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.cache: HotCache | None = None
        self.prefetcher: Prefetcher | None = None
        self.presampler: Presampler | None = None
        self._schedule_epochs = range(0)  # the epochs this process trains
        self._started = -1  # the last epoch the trainer began
        self._built = -1  # the last epoch whose cache buffer was started
        self._build_lock = threading.Lock()
        self._scratch: Scratch | None = None  # the presample's, if temporary
        self._lock: IO[str] | None = None  # a given folder's, held
        self._counters: dict[str, Any] = {}
        self.rounds: ExplainRounds[torch.Tensor | None] | None = None
        self._dims = DimStats()
        if self.config.dgs_dims:
            rate = self.config.rate
            self.rounds = ExplainRounds(
                self.store,
                self.config.every,
                ExplainSettings(),
                lambda explained: top_dims(explained.feature_mask, rate),
            )

    # ------------------------------------------------------------- set-up
    def start(self, schedule: Schedule, first: int, saved: Any | None) -> None:
        if not schedule.epochs:
            return  # a resumed run that had stopped: nothing to presample
        self._schedule_epochs = schedule.epochs
        if self.rounds is not None:
            self.rounds.start(schedule, None if saved is None else saved.get("dgs"))
        self._presample(schedule)
        hot_ids = None if saved is None else saved["hot_ids"]
        self._start_cache(schedule, first, hot_ids)

    def _presample(self, schedule: Schedule) -> None:
        """Sample the first epoch to disk now (every rank at once: each
        serves the others' remote frontiers meanwhile) and the rest on the
        presampler's thread."""
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
        folder.mkdir(parents=True, exist_ok=True)
        self.presampler = Presampler(
            folder,
            schedule.epochs,
            schedule.batches,
            self._sample,
            self.store.is_local,
            len(self.sampler.fanouts),
            self.sampler.csr.weight is not None,
            remove=self._scratch is not None,
            on_ready=self._build_next,
        )

    def _sample(self, batch: Batch) -> SampledBatch:
        return self.sampler.sample(batch.seeds, batch.seed)

    def _start_cache(
        self, schedule: Schedule, first: int, hot_ids: torch.Tensor | None
    ) -> None:
        # A buffer holds an epoch's hot set and rows kept from earlier ones;
        # the first epoch's remote inputs size it (the later epochs are yet
        # to be sampled).
        assert self.presampler is not None
        touched = self.presampler.epoch(first).hot_ids
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
        self.cache.fill(first, touched if hot_ids is None else hot_ids)
        keys = [(e, i) for e in schedule.epochs for i in range(schedule.steps)]
        self.prefetcher = Prefetcher(
            keys=keys,
            make=lambda key: self.assemble(key, "prefetch"),  # type: ignore[arg-type]
            depth=self.config.prefetch,
            nbytes=lambda item: item[1].numel() * 4,  # type: ignore[index]
        )

    # -------------------------------------------------------------- epochs
    def begin_epoch(self, epoch: int) -> None:
        """Make ``epoch``'s cache buffer the steady one, drop the epoch
        before, and start building the next epoch's buffer in the background
        (now, if it is presampled; else as soon as it is)."""
        assert self.cache is not None and self.presampler is not None
        if epoch > self.cache.epoch:
            # Its buffer may wait for its presample still (which then
            # starts it, unless this call does first).
            self.presampler.epoch(epoch)
            self._build_next(epoch)
            self.cache.swap(epoch)
        self.presampler.forget(epoch - 1)
        with self._build_lock:
            self._started = epoch
        self._build_next(epoch + 1)

    def _build_next(self, epoch: int) -> None:
        """Start ``epoch``'s cache buffer if the trainer has begun the epoch
        before and ``epoch`` is presampled (called by both, whichever comes
        second starts it)."""
        presampler = self.presampler
        if presampler is None or self.cache is None or not presampler.ready(epoch):
            return
        with self._build_lock:
            if epoch != self._started + 1 or epoch <= self._built:
                return
            self._built = epoch
            self.cache.build(epoch, presampler.epoch(epoch).hot_ids)

    def assemble(self, key: tuple[int, int], kind: str) -> Made:
        """A presampled batch with its input rows and labels, the rows read
        as ``kind`` (``prefetch`` on the prefetcher's thread, ``pull`` by
        the trainer)."""
        began = time.perf_counter()
        epoch, index = key
        assert self.presampler is not None
        sampled, local = self.presampler.epoch(epoch).batch(index)
        dims = None
        if self.rounds is not None:
            applied = self.rounds.applied(Batch(epoch, index, sampled.seeds, 0, 0))
            dims = None if applied is None else applied[1]
        x, counts = assemble_inputs(
            self.store, self.cache, sampled.input_nid, local, kind, epoch, dims
        )
        share = 1.0 if dims is None else dims.numel() / self.store.dim
        self._dims.add(counts["missed_rows"], share)
        y = self.store.labels(sampled.seeds)
        busy = {"fetch_busy_s": time.perf_counter() - began}
        return sampled, x, y, {**counts, **busy}

    def get(self, batch: Batch, stats: dict[str, float]) -> Fetched:
        assert self.prefetcher is not None
        if self.rounds is not None:
            self.rounds.on_step(batch)
        key = (batch.epoch, batch.index)
        return take_batch(
            self.prefetcher, batch, lambda: self.assemble(key, "pull"), stats
        )

    def release(self, batch: Batch) -> None:
        assert self.prefetcher is not None
        self.prefetcher.release((batch.epoch, batch.index))

    def state(self, epoch: int) -> Any | None:
        """The hot set the next epoch starts with."""
        assert self.presampler is not None
        dgs = None if self.rounds is None else self.rounds.state(epoch)
        if epoch + 1 not in self._schedule_epochs:
            return {"hot_ids": None, "dgs": dgs}
        return {"hot_ids": self.presampler.epoch(epoch + 1).hot_ids, "dgs": dgs}

    def epoch_counters(self) -> dict[str, Any]:
        """With ``dgs_dims``: the epoch's ``extra["dgs"]`` (the misses'
        share of dimensions, the explainer's rounds)."""
        if self.rounds is None:
            return {}
        return {"dgs": self._dims.record(self.rounds.finished())}

    def finish(self) -> None:
        """Stop presampling (an early stop leaves epochs unsampled), close
        the sampler (collective), and let go of the cache, the prefetcher
        and the presampled epochs before the evaluation."""
        if self.presampler is not None:
            self.presampler.stop()
            self.presampler.raise_error()
            for epoch in self._schedule_epochs:
                self.presampler.forget(epoch)
        # The cache first: a prefetcher that ran into an epoch this run
        # will not start (an early stop) waits in a lookup for its buffer.
        if self.cache is not None:
            self.cache.close()
        if self.prefetcher is not None:
            self.prefetcher.close()
        if self.cache is not None:
            self.cache.wait_built()
            self.cache.free()
        super().finish()

    def counters(self) -> dict[str, Any]:
        out = dict(self._counters)
        if self.presampler is not None:
            first, rest = self.presampler.first_s, self.presampler.busy_s
            out["presample_s"] = first + rest
            out["presample_first_s"] = first
            out["presample_waits"] = self.presampler.waits
            out["max_batch_inputs"] = self.presampler.max_inputs
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
        if self.rounds is not None:
            self.rounds.close(collective)
        try:
            if self.presampler is not None:
                # After an error, a few seconds for its last batch: it must
                # not write into the folder removed next.
                self.presampler.stop(timeout=None if collective else 5.0)
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
