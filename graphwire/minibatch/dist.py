"""Distributed mini-batch training: one rank's loop, top to bottom.

Every rank owns one part, runs a sampling server and a feature server beside
its trainer, and takes the same number of steps per epoch (DistDGL, ARCHITECTURE
§6). One step of rank ``w``:

1. the batch: seeds and seed ``H(s0, w, epoch, i)`` from the schedule
   (:mod:`~graphwire.minibatch.schedule`);
2. blocks: sampled now by the owner-compute sampler (``--fetch on-demand``),
   or read from the presampled schedule on disk (``--fetch rapid``);
3. input features: ``on-demand`` pulls every remote input row from its owner
   (one request per owner, ``kv.pull``); ``rapid`` takes the batch the
   prefetcher assembled (hot cache, then local rows, then one pull per owner
   for the misses, ``kv.prefetch``), or assembles it itself when the trainer
   has outrun the prefetcher (``kv.pull``);
4. forward with hashed dropout (seeded by ``H(s0, epoch, i)``, so a node's mask
   does not depend on which rank trains it), mean cross-entropy over the seeds,
   backward;
5. the gradients are averaged over ranks (``sync.grad``), each layer's sum
   starting as soon as the backward has finished that layer's gradients
   (:class:`~graphwire.run.gradsync.BackwardSync`), and every rank takes the
   same Adam step.

An epoch's record times these phases as a single process's does
(:class:`~graphwire.run.training.EpochRecord`): ``sample_s`` (on-demand),
``fetch_s`` and ``wait_s`` (step 3; ``wait_s`` for the prefetcher, rapid),
``forward_s`` (step 4's forward and loss), ``backward_s`` (its backward and
the optimizer step) and ``sync_s`` (the wait for the gradients' sums after
the backward); they are disjoint parts of the epoch's ``train_s``. What runs
beside them is in ``extra``: ``sample_busy_s`` and ``fetch_busy_s`` (the
loader's or prefetcher's whole sampling and fetching) and ``sync_busy_s``
(the sums' whole time, overlapped with the backward or not).

Both fetch modes see the same blocks and the same feature values, so they take
bitwise-identical steps: ``rapid`` changes only where rows come from.

Evaluation is exact full-graph inference (``inference``, which the caller
supplies: the full-graph loops' halo engine, as the single-process loop
evaluates on the whole graph), after the epochs
:meth:`~graphwire.run.config.TrainConfig.evaluates` names.

Each epoch's record counts the traffic of its window of the run
(:mod:`~graphwire.minibatch.traffic`): ``comm`` and ``extra``'s
``remote_rows``, ``remote_bytes`` and ``remote_messages``. What came before
the first epoch (presampling, rapid's first cache fill) and after the last
(closing the services) is the run's ``setup`` and ``teardown``
(:attr:`MinibatchRun.counters`), so the three add up to the run's totals.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from graphwire.comm.base import Transport
from graphwire.feature.traffic import TrafficWindows
from graphwire.graph.links import HeldOut, load_held_out
from graphwire.minibatch.linkloop import LinkLoop
from graphwire.minibatch.linktrainer import link_fields
from graphwire.minibatch.loop import RankLoop
from graphwire.partition.local import LocalPart
from graphwire.run.checkpoint import CheckpointConfig
from graphwire.run.collective import InferenceFactory, phase_record, summed_loss
from graphwire.run.config import TrainConfig
from graphwire.run.job import EpochStream, Job
from graphwire.run.meter import ResourceMeter
from graphwire.run.state import (
    load_on_every_rank,
    restore_training_state,
    save_on_every_rank,
    training_state,
)
from graphwire.run.training import (
    BestEpoch,
    EpochRecord,
    TrainResult,
    check_finite_eval,
    check_finite_loss,
)
from graphwire.sampler.links import SamplingFunctions

__all__ = ["MinibatchRun", "train_minibatch_distributed", "train_rank"]


@dataclass(kw_only=True)
class MinibatchRun:
    """One rank's view of a finished run (accuracies are global).

    Attributes:
        result: accuracies, records and weights.
        ledger: this rank's ledger snapshot for the whole run.
        counters: sampler, cache and prefetcher counters, and the setup;
            ``phases``: the traffic before the first epoch and after the
            last, ``{"setup": w, "teardown": w}`` with ``w`` = ``{"seconds",
            "comm", "extra": {"remote_rows", "remote_bytes",
            "remote_messages"}}`` (as an epoch record holds its own; the
            set-up's seconds count from this function's start). With the
            records of the epochs this process ran they add up to ``ledger``
            and the store's remote rows (:mod:`~graphwire.minibatch.traffic`).
        batches: per step ``(epoch, index, seeds checksum)`` (tests use it).
        first_epoch: the epoch this process started at (resumed: the ledger
            and counters count the epochs from there only).
    """

    result: TrainResult
    ledger: dict[str, Any]
    counters: dict[str, Any] = field(default_factory=dict)
    batches: list[tuple[int, int, int]] = field(default_factory=list)
    first_epoch: int = 0


def train_minibatch_distributed(
    part: LocalPart,
    transport: Transport,
    config: TrainConfig,
    fetch: Any = None,
    *,
    inference: InferenceFactory,
    on_epoch: Callable[[EpochRecord], None] | None = None,
    on_restore: Callable[[list[EpochRecord]], None] | None = None,
    checkpoint: CheckpointConfig | None = None,
    held_out: tuple[HeldOut, HeldOut] | None = None,
    functions: SamplingFunctions | None = None,
) -> MinibatchRun:
    """Train ``config.model`` on sampled mini-batches, this rank owning ``part``.

    Args:
        part: this rank's part (features, labels and splits required).
        transport: connects the ranks (rank == part ID).
        config: model, optimiser, ``fanouts``, ``batch_size`` (per trainer).
        fetch: the fetcher (``--fetch``): its name, or its config
            (:data:`~graphwire.minibatch.fetchers.FETCHERS`; None: its
            default, as the command line's).
        inference: what evaluates the model on the whole graph (the
            full-graph loops' exact inference:
            :class:`~graphwire.fullgraph.inference.ExactInference`).
        on_epoch: called on every rank with each epoch's record.
        on_restore: called on every rank with the records a resume restored.
        checkpoint: checkpoint every K epochs and/or resume from the latest.
        held_out: ``--task link``: the ``(val, test)`` pairs the metrics
            score (global IDs, the same on every rank).
        functions: the sampling operators' functions (None: uniform).

    Returns:
        The run, with accuracies over all ranks' nodes.
    """
    began = time.perf_counter()
    loop = _loop(part, transport, config, fetch, inference, held_out, functions)
    windows = TrafficWindows(transport, loop.store)
    best = BestEpoch(config.patience)
    records: list[EpochRecord] = []
    first, saved = 0, None
    if checkpoint is not None and checkpoint.resume:
        state = load_on_every_rank(checkpoint, transport)
        if state is not None:
            first, saved = _restore(state, loop, best, records)
            if on_restore is not None:
                on_restore(list(records))
    seen: list[tuple[int, int, int]] = []
    try:
        # a resumed run that had stopped early trains no further
        epochs = range(first, first if best.stopped else config.epochs)
        loop.start(epochs, saved)
        transport.barrier()  # set-up ends when every rank's has (as in full graph)
        phases = {"setup": _phase(windows.cut(), began)}
        meter = ResourceMeter()
        ended = time.perf_counter()  # the last window's end
        for epoch in epochs:
            transport.phase = f"epoch {epoch}"  # told by a rank held up
            record, stopped = _epoch(loop, epoch, best, meter, seen, windows)
            ended = time.perf_counter()
            records.append(record)
            if on_epoch is not None:
                on_epoch(record)
            if checkpoint is not None and checkpoint.due(epoch, config.epochs, stopped):
                _save(checkpoint, epoch, loop, best, records)
            if stopped:
                break
        transport.phase = "teardown"
        loop.fetcher.finish()
    except BaseException:
        loop.close(collective=False)
        raise
    loop.close()
    ledger = transport.ledger.snapshot()
    phases["teardown"] = _phase(windows.cut(ledger), ended)
    return MinibatchRun(
        result=best.result(records, loop.model),
        ledger=ledger,
        counters=_counters(loop) | {"phases": phases},
        batches=seen,
        first_epoch=first,
    )


_STATS = (
    "sample_s",
    "fetch_s",
    "wait_s",
    "forward_s",
    "backward_s",
    "sync_s",
    "sync_busy_s",
    "seeds",
    "edges",
    "cache_hits",
    "local_rows",
    "missed_rows",
    "fallbacks",
    "sample_busy_s",
    "fetch_busy_s",
)


def _epoch(
    loop: RankLoop,
    epoch: int,
    best: BestEpoch,
    meter: ResourceMeter,
    seen: list[tuple[int, int, int]],
    windows: TrafficWindows,
) -> tuple[EpochRecord, bool]:
    config = loop.config
    meter.start()
    began = time.perf_counter()
    stats = dict.fromkeys(_STATS, 0.0)
    loop.fetcher.begin_epoch(epoch)
    total = 0.0
    for batch in loop.batches(epoch):
        loss = loop.step(batch, stats)  # NaN for a batch without seeds
        if batch.seeds.numel():  # a share smaller than the steps has some
            total += loss * batch.seeds.numel()
        seen.append((batch.epoch, batch.index, int(batch.seeds.sum())))
    train_s = time.perf_counter() - began
    fetched = loop.fetcher.epoch_counters()
    if epoch == loop.epochs[-1]:
        loop.fetcher.finish()  # its memory goes before the last evaluation
    metrics: dict[str, float] = {}
    stopped = False
    eval_began = time.perf_counter()
    if config.evaluates(epoch):
        metrics = loop.evaluate(total)
        summed = metrics["loss"]
    else:
        summed = summed_loss(loop.transport, total)
    # The loss summed over ranks: NaN or infinite on every rank alike if on
    # any, so every rank raises here and none waits in a collective.
    check_finite_loss(summed, epoch, config)
    check_finite_eval(metrics, epoch, config)
    if metrics:
        stopped = best.update(epoch, metrics, loop.model)
    eval_s = time.perf_counter() - eval_began
    reading = meter.stop()
    traffic = windows.cut()  # from the end of the last window
    extra = {
        "seeds": int(stats["seeds"]),
        "seeds_per_s": stats["seeds"] / train_s if train_s > 0 else 0.0,
        "sampled_edges": int(stats["edges"]),
        "remote_rows": traffic["remote_rows"],
        "remote_bytes": traffic["remote_bytes"],
        "remote_messages": traffic["remote_messages"],
        "missed_rows": int(stats["missed_rows"]),
        "cache_hits": int(stats["cache_hits"]),
        "local_rows": int(stats["local_rows"]),
        "fallbacks": int(stats["fallbacks"]),
        "sample_busy_s": stats["sample_busy_s"],
        "fetch_busy_s": stats["fetch_busy_s"],
        "sync_busy_s": stats["sync_busy_s"],
        "train_s": train_s,
        "resources": reading.as_dict(),
        **fetched,
    }
    if config.task == "link" and metrics:
        extra["link"] = link_fields(metrics)
    record = EpochRecord(
        epoch=epoch,
        loss=total / max(1.0, stats["seeds"]),
        train_acc=metrics.get("train_acc", math.nan),
        val_acc=metrics.get("val_acc", math.nan),
        test_acc=metrics.get("test_acc", math.nan),
        times={
            "sample_s": stats["sample_s"],
            "fetch_s": stats["fetch_s"],
            "wait_s": stats["wait_s"],
            "forward_s": stats["forward_s"],
            "backward_s": stats["backward_s"],
            "sync_s": stats["sync_s"],
            "eval_s": eval_s,
        },
        peak_rss_mb=reading.peak_rss_mb,
        comm=traffic["comm"],
        extra=extra,
    )
    return record, stopped


def _loop(
    part: LocalPart,
    transport: Transport,
    config: TrainConfig,
    fetch: Any,
    inference: InferenceFactory,
    held_out: tuple[HeldOut, HeldOut] | None,
    functions: SamplingFunctions | None,
) -> RankLoop:
    """The task's loop: node classification's, or link prediction's."""
    if config.task == "node":
        return RankLoop(
            part, transport, config, fetch, inference=inference, functions=functions
        )
    if held_out is None:
        raise ValueError("--task link: no held-out pairs given to score")
    return LinkLoop(
        part,
        transport,
        config,
        fetch,
        inference=inference,
        held_out=held_out,
        functions=functions,
    )


def _phase(traffic: dict[str, Any], began: float) -> dict[str, Any]:
    """A set-up or teardown window's traffic (``comm``; the rest ``extra``)."""
    return phase_record(traffic.pop("comm"), began, **traffic)


def _counters(loop: RankLoop) -> dict[str, Any]:
    out = dict(loop.counters) | loop.fetcher.counters()
    out["store"] = loop.store.stats()
    out["sampler"] = dict(loop.sampler.counters)
    return out


def _save(
    checkpoint: CheckpointConfig,
    epoch: int,
    loop: RankLoop,
    best: BestEpoch,
    records: list[EpochRecord],
) -> None:
    state = training_state(epoch, loop.model, loop.optimizer, best, records)
    # The sampler's position is the next epoch (the schedule is hashed from
    # it); the fetcher's state is what the next epoch starts with (rapid:
    # its hot set).
    state["sampler"] = {"next_epoch": epoch + 1}
    state["cache"] = loop.fetcher.state(epoch)
    save_on_every_rank(checkpoint, epoch, loop.transport, state)


def _restore(
    state: dict[str, Any], loop: RankLoop, best: BestEpoch, records: list[EpochRecord]
) -> tuple[int, Any | None]:
    """Load ``state``; ``(the first epoch still to run, the fetcher's state)``."""
    restore_training_state(state, loop.model, loop.optimizer, best, records)
    return int(state["sampler"]["next_epoch"]), state.get("cache")


def train_rank(
    part: LocalPart,
    transport: Transport,
    job: Job,
    on_epoch: EpochStream,
    *,
    inference: InferenceFactory,
) -> MinibatchRun:
    """:func:`train_minibatch_distributed` as a distributed
    :class:`~graphwire.run.job.Job` runs it (``job.strategy``: the fetcher's
    name or config); bind ``inference`` with ``functools.partial``."""
    held_out = None
    if job.config.task == "link":
        held_out = load_held_out(job.folder, part.book.num_nodes)
    return train_minibatch_distributed(
        part,
        transport,
        job.config,
        job.strategy,
        inference=inference,
        on_epoch=on_epoch,
        on_restore=on_epoch.restored,
        checkpoint=job.rank_checkpoint(),
        held_out=held_out,
    )
