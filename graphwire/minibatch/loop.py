"""One rank's mini-batch loop: its sampler, feature store, model and, with
``--fetch rapid``, presampled epochs, hot cache and prefetcher.

:func:`~graphwire.minibatch.dist.train_minibatch_distributed` drives it epoch by
epoch; the module docstring there gives the step this class takes.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

import torch
import torch.nn.functional as F

from graphwire.comm.base import Transport
from graphwire.comm.scratch import Scratch
from graphwire.feature.cache import HotCache, assemble_inputs
from graphwire.feature.dist import DistFeatureStore
from graphwire.feature.prefetch import Prefetcher
from graphwire.fullgraph.distributed import (
    _global_metrics,
    _split_sizes,
    build_engine,
    forward_loss,
    seeded_model,
    sync_gradients,
)
from graphwire.minibatch.owned import owned_csr
from graphwire.minibatch.presample import (
    PresampledEpoch,
    lock_rank_folder,
    presample_epoch,
)
from graphwire.minibatch.schedule import (
    Batch,
    epoch_batches,
    share_sizes,
    split_train,
    steps_per_epoch,
)
from graphwire.nn.models import LAYER_KINDS
from graphwire.partition.local import LocalPart, trainable_classes
from graphwire.sampler.base import SampledBatch
from graphwire.sampler.dist import DistNeighborSampler
from graphwire.training import TrainConfig, make_optimizer

__all__ = ["DEFAULT_CACHE_MB", "FETCH_MODES", "FetchOptions", "RankLoop"]

FETCH_MODES = ("on-demand", "rapid")
DEFAULT_CACHE_MB = 512.0  # FetchOptions.cache_mb when neither it nor n_hot is given


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
            may take (``2 n_hot F 4`` bytes, reported as ``cache_bytes``);
            None: 512 MiB. Refused with ``n_hot``, which it would not bound.
        prefetch: Q, batches the prefetcher keeps ready (rapid).
        presample_dir: where the presampled schedule goes (rapid); None: a
            temporary folder removed at the end.
    """

    fetch: str = "on-demand"
    n_hot: int | None = None
    cache_mb: float | None = None
    prefetch: int = 4
    presample_dir: str | None = None

    def __post_init__(self) -> None:
        if self.fetch not in FETCH_MODES:
            raise ValueError(
                f"fetch: expected one of {FETCH_MODES}, got {self.fetch!r}"
            )
        if self.n_hot is not None and self.n_hot < 0:
            raise ValueError(f"n_hot: expected >= 0, got {self.n_hot}")
        if self.cache_mb is not None:
            if self.n_hot is not None:
                raise ValueError(
                    f"cache_mb: {self.cache_mb} would not bound the cache's "
                    f"n_hot={self.n_hot} rows; give one of the two"
                )
            if not 0 < self.cache_mb < math.inf:
                raise ValueError(
                    f"cache_mb: expected a finite value > 0, got {self.cache_mb}"
                )
        if self.prefetch < 1:
            raise ValueError(f"prefetch: expected >= 1, got {self.prefetch}")


class RankLoop:
    """The state of one rank's run: its sampler, store, model, and (rapid)
    presampled epochs, cache and prefetcher."""

    def __init__(
        self,
        part: LocalPart,
        transport: Transport,
        config: TrainConfig,
        options: FetchOptions,
    ) -> None:
        num_classes = trainable_classes(part)
        assert part.x is not None and part.train_local is not None  # (checked)
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
        self._presample_lock: IO[str] | None = None  # a given folder's, held
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
        if self._scratch is None:  # (a temporary folder is this run's alone)
            self._presample_lock = lock_rank_folder(folder, self.rank)
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
            budget = self.options.cache_mb
            if budget is None:
                budget = DEFAULT_CACHE_MB
            # in floats: a huge budget (1e303 MiB) is inf rows, not an error
            fits = budget * 2**20 / (2 * self.store.dim * 4)
            n_hot = touched.numel() if fits >= touched.numel() else int(fits)
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
            item, prefetched = self.prefetcher.get(
                key,
                lambda key: self.assemble(key, "pull"),  # type: ignore[arg-type]
            )
            fetched = time.perf_counter()
            # A batch the prefetcher made was waited for; one the trainer
            # made itself (the fallback) was fetched.
            stats["wait_s" if prefetched else "fetch_s"] += fetched - began
            stats["fallbacks"] += not prefetched
            sampled, x, y, counts = item  # type: ignore[misc]
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
        interrupts a rank cleaning up after a peer's failure); after an error
        it goes first, before joining threads that a dead peer can hold up
        (the prefetcher's for up to 30 s, the cache builder's until its pull
        times out) past torchrun's grace period: 30 s after its SIGTERM, the
        agent SIGKILLs the rank, and nothing removes the folder then."""
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
            if collective:
                self.store.close()
        finally:
            if self._scratch is not None:
                self._scratch.remove()
            if self._presample_lock is not None:
                self._presample_lock.close()
