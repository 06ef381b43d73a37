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
5. the gradients are averaged over ranks (``sync.grad``), and every rank takes
   the same Adam step.

An epoch's record times these phases as a single process's does
(:class:`~graphwire.training.EpochRecord`): ``sample_s`` (on-demand),
``fetch_s`` and ``wait_s`` (step 3; ``wait_s`` for the prefetcher, rapid),
``forward_s`` (step 4's forward and loss), ``backward_s`` (its backward and
the optimizer step) and ``sync_s`` (the gradients' all-reduce); they are
disjoint parts of the epoch's ``train_s``.

Both fetch modes see the same blocks and the same feature values, so they take
bitwise-identical steps: ``rapid`` changes only where rows come from.

Evaluation is exact full-graph inference through the ``halo`` engine (as the
single-process loop evaluates on the whole graph), after the epochs
:meth:`~graphwire.training.TrainConfig.evaluates` names.

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
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

from graphwire.comm.base import Transport
from graphwire.comm.scratch import Scratch
from graphwire.feature.cache import HotCache, Prefetcher, assemble_inputs
from graphwire.feature.dist import DistFeatureStore
from graphwire.fullgraph.checkpoint import CheckpointConfig
from graphwire.fullgraph.distributed import (
    _global_metrics,
    _split_sizes,
    build_engine,
    forward_loss,
    load_on_every_rank,
    phase_record,
    restore_training_state,
    save_on_every_rank,
    seeded_model,
    sync_gradients,
    training_state,
)
from graphwire.meter import ResourceMeter
from graphwire.minibatch.owned import owned_csr
from graphwire.minibatch.presample import PresampledEpoch, presample_epoch
from graphwire.minibatch.schedule import (
    Batch,
    epoch_batches,
    share_sizes,
    split_train,
    steps_per_epoch,
)
from graphwire.minibatch.traffic import TrafficWindows
from graphwire.nn.models import LAYER_KINDS
from graphwire.partition.local import LocalPart
from graphwire.sampler.base import SampledBatch
from graphwire.sampler.dist import DistNeighborSampler
from graphwire.training import (
    BestEpoch,
    EpochRecord,
    TrainConfig,
    TrainResult,
    make_optimizer,
)

__all__ = [
    "FETCH_MODES",
    "FetchOptions",
    "MinibatchRun",
    "train_minibatch_distributed",
]

FETCH_MODES = ("on-demand", "rapid")


@dataclass(frozen=True, kw_only=True)
class FetchOptions:
    """How a trainer gets its batches' input features.

    Attributes:
        fetch: ``on-demand`` (DistDGL) or ``rapid`` (RapidGNN).
        n_hot: rows of the hot cache (rapid), at most the distinct remote
            nodes of the whole presampled run (no other node is ever hot, so
            a larger value is cut to that before the buffers are allocated;
            the counters' ``n_hot`` is the value used). None: that many (the
            paper's Eq. 2 counts accesses over all epochs), so that with rows
            kept across epochs each remote row is fetched once per run, but
            at most what fits ``cache_mb``. Fetches grow as it shrinks (the
            paper's Fig. 5 curve).
        cache_mb: with ``n_hot`` None, the most memory the two cache buffers
            may take (``2 n_hot F 4`` bytes, reported as ``cache_bytes``).
        prefetch: Q, batches the prefetcher keeps ready (rapid).
        presample_dir: where the presampled schedule goes (rapid); None: a
            temporary folder removed at the end.
    """

    fetch: str = "on-demand"
    n_hot: int | None = None
    cache_mb: float = 512.0
    prefetch: int = 4
    presample_dir: str | None = None

    def __post_init__(self) -> None:
        if self.fetch not in FETCH_MODES:
            raise ValueError(
                f"fetch: expected one of {FETCH_MODES}, got {self.fetch!r}"
            )
        if self.n_hot is not None and self.n_hot < 0:
            raise ValueError(f"n_hot: expected >= 0, got {self.n_hot}")
        if not self.cache_mb > 0:
            raise ValueError(f"cache_mb: expected > 0, got {self.cache_mb}")
        if self.prefetch < 1:
            raise ValueError(f"prefetch: expected >= 1, got {self.prefetch}")


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


class _Loop:
    """The state of one rank's run: its sampler, store, model, and (rapid)
    presampled epochs, cache and prefetcher."""

    def __init__(
        self,
        part: LocalPart,
        transport: Transport,
        config: TrainConfig,
        options: FetchOptions,
    ) -> None:
        if part.x is None or part.y is None or part.train_local is None:
            raise ValueError(
                f"part {part.part_id}: training needs features, labels and splits"
            )
        num_classes = int(part.meta.get("num_classes") or 0)
        if num_classes < 1:
            raise ValueError(
                f"part {part.part_id}: meta.json says num_classes is "
                f"{num_classes}; training needs labelled classes"
            )
        assert config.fanouts is not None
        self.part, self.transport, self.config, self.options = (
            part,
            transport,
            config,
            options,
        )
        self.rank, self.world = transport.rank, transport.world_size
        # First, before any service starts: it checks no split is empty.
        self.sizes = _split_sizes(part, transport)
        kind = LAYER_KINDS[config.model]
        self.sampler = DistNeighborSampler(
            owned_csr(part, transport, kind), part.book, transport, config.fanouts
        )
        self.weighted = kind.gcn_weights
        self.store = DistFeatureStore(part, transport)
        start = part.global_range[0]
        mine = part.train_local.to(torch.int64) + start
        every = transport.all_gather_object(mine, "setup.train")
        self.share = split_train(every, self.rank)
        shares = share_sizes(sum(ids.numel() for ids in every), self.world)
        self.steps = steps_per_epoch(shares, config.batch_size)
        self.model = seeded_model(part.x.shape[1], num_classes, config)
        self.optimizer = make_optimizer(self.model, config)
        # Evaluation only: no backward, so no loss rows to plan returns for.
        self.eval_engine = build_engine(
            part, transport, config, "halo", {"loss_rows": None}
        )
        self.cache: HotCache | None = None
        self.prefetcher: Prefetcher | None = None
        self.presample_root: Path | None = None
        self._scratch: Scratch | None = None  # the presample's, if temporary
        self.epochs: dict[int, PresampledEpoch] = {}
        self.counters: dict[str, Any] = {
            "train_share": self.share.numel(),
            "steps_per_epoch": self.steps,
        }

    # ------------------------------------------------------------ schedule
    def batches(self, epoch: int) -> list[Batch]:
        return epoch_batches(self.share, self.config.seed, self.rank, epoch, self.steps)

    def sample(self, batch: Batch) -> SampledBatch:
        return self.sampler.sample(batch.seeds, batch.seed)

    # --------------------------------------------------------------- rapid
    def presample(self, first: int) -> None:
        """Sample the rest of the run to disk (every rank at once: each
        serves the others' remote frontiers meanwhile), then stop sampling
        (collective)."""
        if self.options.presample_dir is None:
            # Locked while this rank runs: a rank killed outright leaves it,
            # and the next run's rank removes it.
            self._scratch = Scratch.create("graphwire-presample-")
            self.presample_root = self._scratch.path
        else:
            self.presample_root = Path(self.options.presample_dir)
        folder = self.presample_root / f"rank{self.rank}"
        began = time.perf_counter()
        for epoch in range(first, self.config.epochs):
            presample_epoch(
                folder, self.batches(epoch), self.sample, self.store.is_local
            )
        self.counters["presample_s"] = time.perf_counter() - began
        self.sampler.close()
        for epoch in range(first, self.config.epochs):
            self.epochs[epoch] = PresampledEpoch(
                folder, epoch, self.config.num_layers, self.weighted
            )

    def start_rapid(self, first: int, hot_ids: torch.Tensor | None) -> None:
        epoch0 = self.epochs[first]
        # A buffer holds an epoch's hot set and rows kept from earlier ones:
        # remote inputs of the presampled epochs, never any other node. More
        # rows than there are of those would stay empty, yet be allocated.
        touched = torch.unique(torch.cat([e.hot_ids for e in self.epochs.values()]))
        n_hot = self.options.n_hot
        if n_hot is None:
            fits = int(self.options.cache_mb * 2**20) // (2 * self.store.dim * 4)
            n_hot = min(touched.numel(), fits)
        self.cache = HotCache(self.store, min(n_hot, touched.numel()))
        self.counters["n_hot"] = self.cache.n_hot  # the rows allocated
        self.cache.fill(first, epoch0.hot_ids if hot_ids is None else hot_ids)
        keys = [
            (e, i) for e in range(first, self.config.epochs) for i in range(self.steps)
        ]
        self.prefetcher = Prefetcher(
            keys=keys,
            make=lambda key: self.assemble(key, "prefetch"),  # type: ignore[arg-type]
            depth=self.options.prefetch,
            nbytes=lambda item: item[1].numel() * 4,  # type: ignore[index]
        )
        self.counters["max_batch_inputs"] = max(
            e.max_inputs for e in self.epochs.values()
        )

    def assemble(
        self, key: tuple[int, int], kind: str
    ) -> tuple[SampledBatch, torch.Tensor, torch.Tensor, dict[str, int]]:
        """A presampled batch with its input features and labels."""
        epoch, index = key
        sampled, local = self.epochs[epoch].batch(index)
        x, counts = assemble_inputs(
            self.store, self.cache, sampled.input_nid, local, kind, epoch
        )
        return sampled, x, self.store.labels(sampled.seeds), counts

    # ---------------------------------------------------------------- step
    def step(self, batch: Batch, stats: dict[str, float]) -> float:
        """One training step; returns the batch's loss."""
        began = time.perf_counter()
        if self.prefetcher is not None:
            key = (batch.epoch, batch.index)
            item = self.prefetcher.get(key)
            got = time.perf_counter()
            stats["wait_s"] += got - began
            if item is None:
                sampled, x, y, counts = self.assemble(key, "pull")
                stats["fallbacks"] += 1
            else:
                sampled, x, y, counts = item  # type: ignore[misc]
            fetched = time.perf_counter()
            stats["fetch_s"] += fetched - got
        else:
            sampled = self.sample(batch)
            sampled_at = time.perf_counter()
            stats["sample_s"] += sampled_at - began
            local = self.store.is_local(sampled.input_nid)
            x, counts = assemble_inputs(
                self.store, None, sampled.input_nid, local, "pull"
            )
            y = self.store.labels(sampled.seeds)
            fetched = time.perf_counter()
            stats["fetch_s"] += fetched - sampled_at
        for name, value in counts.items():
            stats[name] += value
        stats["seeds"] += sampled.seeds.numel()
        stats["edges"] += sampled.num_sampled_edges
        loss = self.loss_of(sampled, x, y, batch.dropout_seed)
        forwarded = time.perf_counter()
        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        backwarded = time.perf_counter()
        sync_gradients(self.model, self.transport)
        for p in self.model.parameters():
            assert p.grad is not None
            p.grad /= self.world
        synced = time.perf_counter()
        self.optimizer.step()
        stepped = time.perf_counter()
        stats["forward_s"] += forwarded - fetched
        # The step counts with the backward, as in a single process's
        # records; sync_s is the gradients' all-reduce alone.
        stats["backward_s"] += (backwarded - forwarded) + (stepped - synced)
        stats["sync_s"] += synced - backwarded
        if self.prefetcher is not None:
            self.prefetcher.release((batch.epoch, batch.index))
        return float(loss.detach())

    def loss_of(
        self, sampled: SampledBatch, x: torch.Tensor, y: torch.Tensor, seed: int
    ) -> torch.Tensor:
        """The forward: the batch's mean cross-entropy over its seeds."""
        self.model.train()
        logits = self.model(
            sampled.blocks, x, row_ids=sampled.input_nid, dropout_seed=seed
        )
        return F.cross_entropy(logits, y)

    def evaluate(self, loss: float) -> dict[str, float]:
        self.model.eval()
        with torch.no_grad():
            logits, _ = forward_loss(
                self.eval_engine, self.model, self.sizes["train"], None
            )
            return _global_metrics(
                logits, self.part, self.transport, self.sizes, torch.tensor(loss)
            )

    def close(self, collective: bool = True) -> None:
        """Stop this rank's threads and remove its temporary presample; with
        ``collective``, also close the feature service (all ranks together).
        After an error the peers are not in step, so no collective runs: the
        serving threads are daemons and go with the process. The presample
        goes whatever happens meanwhile (torchrun's SIGTERM, say, which
        interrupts a rank cleaning up after a peer's failure)."""
        try:
            if self.prefetcher is not None:
                self.prefetcher.close()
            if self.cache is not None:
                try:
                    self.cache.wait_built()
                except RuntimeError:
                    if collective:
                        raise
            if collective:
                self.store.close()
        finally:
            if self._scratch is not None:
                self._scratch.remove()


def train_minibatch_distributed(
    part: LocalPart,
    transport: Transport,
    config: TrainConfig,
    options: FetchOptions | None = None,
    *,
    on_epoch: Callable[[EpochRecord], None] | None = None,
    on_restore: Callable[[list[EpochRecord]], None] | None = None,
    checkpoint: CheckpointConfig | None = None,
) -> MinibatchRun:
    """Train ``config.model`` on sampled mini-batches, this rank owning ``part``.

    Args:
        part: this rank's part (features, labels and splits required).
        transport: connects the ranks (rank == part ID).
        config: model, optimiser, ``fanouts``, ``batch_size`` (per trainer).
        options: the fetch mode and its settings.
        on_epoch: called on every rank with each epoch's record.
        on_restore: called on every rank with the records a resume restored.
        checkpoint: checkpoint every K epochs and/or resume from the latest.

    Returns:
        The run, with accuracies over all ranks' nodes.
    """
    began = time.perf_counter()
    options = options or FetchOptions()
    loop = _Loop(part, transport, config, options)
    windows = TrafficWindows(transport, loop.store)
    best = BestEpoch(config.patience)
    records: list[EpochRecord] = []
    first, hot_ids = 0, None
    if checkpoint is not None and checkpoint.resume:
        state = load_on_every_rank(checkpoint, transport)
        if state is not None:
            first, hot_ids = _restore(state, loop, best, records)
            if on_restore is not None:
                on_restore(list(records))
    seen: list[tuple[int, int, int]] = []
    try:
        # a resumed run that had stopped early trains no further
        epochs = range(first, first if best.stopped else config.epochs)
        if options.fetch == "rapid" and epochs:
            loop.presample(first)
            loop.start_rapid(first, hot_ids)
        phases = {"setup": _phase(windows.cut(), began)}
        meter = ResourceMeter()
        ended = time.perf_counter()  # the last window's end
        for epoch in epochs:
            record, stopped = _epoch(loop, epoch, best, meter, seen, windows)
            ended = time.perf_counter()
            records.append(record)
            if on_epoch is not None:
                on_epoch(record)
            if checkpoint is not None and (epoch + 1) % checkpoint.every == 0:
                _save(checkpoint, epoch, loop, best, records)
            if stopped:
                break
        if loop.prefetcher is None:  # sampled online to the end
            loop.sampler.close()
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
    "seeds",
    "edges",
    "cache_hits",
    "local_rows",
    "missed_rows",
    "fallbacks",
)


def _epoch(
    loop: _Loop,
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
    if loop.cache is not None:
        if epoch > loop.cache.epoch:
            loop.cache.swap(epoch)
        if epoch + 1 < config.epochs:
            loop.cache.build(epoch + 1, loop.epochs[epoch + 1].hot_ids)
    total = 0.0
    for batch in loop.batches(epoch):
        loss = loop.step(batch, stats)  # NaN for a batch without seeds
        if batch.seeds.numel():  # a share smaller than the steps has some
            total += loss * batch.seeds.numel()
        seen.append((batch.epoch, batch.index, int(batch.seeds.sum())))
    train_s = time.perf_counter() - began
    metrics: dict[str, float] = {}
    stopped = False
    eval_began = time.perf_counter()
    if config.evaluates(epoch):
        metrics = loop.evaluate(total)
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
        "train_s": train_s,
        "resources": reading.as_dict(),
    }
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


def _phase(traffic: dict[str, Any], began: float) -> dict[str, Any]:
    """A set-up or teardown window's traffic (``comm``; the rest ``extra``)."""
    return phase_record(traffic.pop("comm"), began, **traffic)


def _counters(loop: _Loop) -> dict[str, Any]:
    out = dict(loop.counters)
    out["store"] = loop.store.stats()
    out["sampler"] = dict(loop.sampler.counters)
    if loop.cache is not None:
        out["cache"] = dict(loop.cache.counters)
        out["cache_bytes"] = loop.cache.nbytes
    if loop.prefetcher is not None:
        out["prefetch"] = dict(loop.prefetcher.counters)
    return out


def _save(
    checkpoint: CheckpointConfig,
    epoch: int,
    loop: _Loop,
    best: BestEpoch,
    records: list[EpochRecord],
) -> None:
    state = training_state(epoch, loop.model, loop.optimizer, best, records)
    # The sampler's position is the next epoch (the schedule is hashed from
    # it); the cache is the hot set the next epoch starts with.
    state["sampler"] = {"next_epoch": epoch + 1}
    state["cache"] = None if loop.cache is None else {"hot_ids": _next_hot(loop, epoch)}
    save_on_every_rank(checkpoint, epoch, loop.transport, state)


def _next_hot(loop: _Loop, epoch: int) -> torch.Tensor | None:
    nxt = loop.epochs.get(epoch + 1)
    return None if nxt is None else nxt.hot_ids


def _restore(
    state: dict[str, Any], loop: _Loop, best: BestEpoch, records: list[EpochRecord]
) -> tuple[int, torch.Tensor | None]:
    restore_training_state(state, loop.model, loop.optimizer, best, records)
    cache = state.get("cache")
    return int(state["sampler"]["next_epoch"]), None if cache is None else cache[
        "hot_ids"
    ]
