"""`Fetcher`: where one trainer's batches come from (``--fetch NAME``).

A distributed mini-batch trainer asks its fetcher for each batch of its
schedule and gets the batch's blocks, input feature rows and seed labels; how
they were made (sampled now and pulled row by row, read from a presampled
schedule and a hot cache, ...) is the fetcher's business, so the training loop
does not know which one it has. Fetchers are registered by name with their
config (:data:`graphwire.minibatch.fetchers.FETCHERS`) and built as
``cls(store, sampler, config)``.

The loop's calls, in order::

    start(schedule, first, saved)   once, before the first epoch (collective)
    begin_epoch(epoch)              at each epoch's start
    get(batch, stats)               each batch, in schedule order
    release(batch)                  after the batch's step
    epoch_counters()                after each epoch's steps: its figures
    state(epoch)                    what a checkpoint after ``epoch`` keeps
    finish()                        after the last epoch's steps, before its
                                    evaluation; again after the last epoch
                                    (collective; the second call does nothing)
    close(collective)               always, last

``get`` adds the seconds it spent to ``stats`` under ``sample_s`` (sampling),
``fetch_s`` (reading rows) or ``wait_s`` (waiting for a batch made ahead),
and the rows it assembled under ``cache_hits``, ``local_rows`` and
``missed_rows`` (remote rows pulled for this batch), so every fetcher's
records read alike.
"""

from __future__ import annotations

import time
from abc import ABC, abstractmethod
from collections.abc import Callable
from typing import Any, Protocol, cast

import torch

from graphwire.allocator import return_freed_memory
from graphwire.feature.dist import DistFeatureStore
from graphwire.feature.prefetch import Prefetcher
from graphwire.nn.models import GNN, LayerKind
from graphwire.sampler.base import Batch, SampledBatch
from graphwire.sampler.dist import DistNeighborSampler
from graphwire.sampler.dist_pairs import DistPairSampler
from graphwire.sampler.links import SamplingFunctions, batch_seeds

__all__ = ["Fetched", "Fetcher", "Made", "Schedule", "count_made", "take_batch"]

Fetched = tuple[SampledBatch, torch.Tensor, torch.Tensor]
"""A batch as a fetcher hands it over: blocks, input rows float32 [n, F],
seed labels int64 [B]."""

Made = tuple[SampledBatch, torch.Tensor, torch.Tensor, dict[str, float]]
"""A batch as a fetcher makes it: :data:`Fetched`, and its counts for
``stats`` (rows, and ``fetch_busy_s`` / ``sample_busy_s``: the seconds making
it took, on whichever thread made it)."""


def count_made(made: Made, stats: dict[str, float], exposed: bool) -> Fetched:
    """``made``'s counts added to ``stats``; ``exposed`` (made on the
    trainer's thread) its busy seconds also as ``sample_s`` and ``fetch_s``."""
    sampled, x, y, counts = made
    if exposed:
        stats["sample_s"] += counts.get("sample_busy_s", 0.0)
        stats["fetch_s"] += counts["fetch_busy_s"]
    for name, value in counts.items():
        stats[name] += value
    return sampled, x, y


def take_batch(
    prefetcher: Prefetcher,
    batch: Batch,
    make: Callable[[], Made],
    stats: dict[str, float],
) -> Fetched:
    """``batch`` from ``prefetcher``: the wait for one it made ahead is
    ``wait_s``; one the trainer reaches first it makes here with ``make`` (a
    fallback, :func:`count_made` exposed)."""
    began = time.perf_counter()
    item, prefetched = prefetcher.get((batch.epoch, batch.index), lambda key: make())
    if prefetched:
        stats["wait_s"] += time.perf_counter() - began
    stats["fallbacks"] += not prefetched
    return count_made(cast(Made, item), stats, exposed=not prefetched)


class Schedule(Protocol):
    """The part of the trainer's schedule a fetcher may look ahead in."""

    @property
    def epochs(self) -> range:
        """The epochs this process trains (a resumed run's start at its
        checkpoint)."""
        ...

    @property
    def steps(self) -> int:
        """Batches per epoch (the same on every rank)."""
        ...

    def batches(self, epoch: int) -> list[Batch]:
        """This rank's batches of ``epoch``, in order."""
        ...

    @property
    def gnn(self) -> GNN:
        """The GNN in training (DGS's explainer takes snapshots of it)."""
        ...

    @property
    def layer_kind(self) -> LayerKind:
        """The model's layer kind."""
        ...


class Fetcher(ABC):
    """One rank's source of batches (see the module docstring).

    Args:
        store: this rank's feature store; remote rows are pulled from their
            owners (``kv.<kind>`` tags).
        sampler: the owner-compute neighbour sampler, serving the other
            ranks' frontiers until it is closed (collectively).
        config: the strategy's config (a dataclass of option fields).
    """

    def __init__(
        self, store: DistFeatureStore, sampler: DistNeighborSampler, config: Any
    ) -> None:
        self.store = store
        self.sampler = sampler
        self.config = config
        self._sampler_open = True

    def start(self, schedule: Schedule, first: int, saved: Any | None) -> None:
        """Set up before epoch ``first``, the first this process trains
        (collective); ``saved`` is what :meth:`state` returned for the
        checkpoint the run resumed from (None: a fresh run)."""
        del schedule, first, saved

    def use_functions(
        self, functions: SamplingFunctions, pairs: DistPairSampler | None
    ) -> None:
        """Make batches with ``functions``' seed operator and, given
        ``pairs``, link prediction's (before :meth:`start`). This fetcher
        makes node batches from the scheduled seeds only."""
        if pairs is not None:
            raise ValueError(
                "--task link: only with --fetch on-demand (it samples each "
                "batch as it comes; this fetcher makes node batches)"
            )
        if functions.seed is not batch_seeds:
            raise ValueError("a seed function: only with --fetch on-demand")

    def begin_epoch(self, epoch: int) -> None:  # noqa: B027 - optional hook
        """Called at the start of each epoch this process trains."""

    @abstractmethod
    def get(self, batch: Batch, stats: dict[str, float]) -> Fetched:
        """The blocks, input rows and labels of ``batch``; times and row
        counts are added to ``stats`` (module docstring)."""

    def release(self, batch: Batch) -> None:  # noqa: B027 - optional hook
        """The trainer is done with ``batch`` (its memory may go)."""

    def state(self, epoch: int) -> Any | None:
        """What a checkpoint after ``epoch`` keeps for a resumed run
        (picklable; default none)."""
        del epoch
        return None

    def finish(self) -> None:
        """After the last epoch's steps (collective): stop serving samples,
        if this fetcher did not already, and let go of the memory that only
        training needs, so the evaluation does not add to it."""
        self.close_sampler()
        return_freed_memory()

    def close_sampler(self) -> None:
        """Close the sampler's service once (collective: every rank's last
        sample is taken)."""
        if self._sampler_open:
            self.sampler.close()
            self._sampler_open = False

    def counters(self) -> dict[str, Any]:
        """The fetcher's own counters for the run's report (default none)."""
        return {}

    def epoch_counters(self) -> dict[str, Any]:
        """Figures of the epoch just trained, added to its record's ``extra``
        (JSON-ready; default none)."""
        return {}

    def close(self, collective: bool = True) -> None:  # noqa: B027 - optional hook
        """Stop this rank's threads and remove what it wrote; after an error
        (``collective`` False) without waiting for the peers."""
