"""One rank's mini-batch loop: its sampler, feature store, fetcher and model.

:func:`~graphwire.minibatch.dist.train_minibatch_distributed` drives it epoch by
epoch; the module docstring there gives the step this class takes.
"""

from __future__ import annotations

import time
from typing import Any

import torch
import torch.nn.functional as F

from graphwire.comm.base import Transport
from graphwire.feature.base import DEFAULT_KINDS
from graphwire.feature.dist import DistFeatureStore
from graphwire.feature.fetcher import Fetcher
from graphwire.minibatch.fetchers import FETCHERS
from graphwire.minibatch.owned import owned_csr
from graphwire.minibatch.schedule import (
    epoch_batches,
    share_sizes,
    split_train,
    steps_per_epoch,
)
from graphwire.nn.models import GNN, LAYER_KINDS
from graphwire.partition.local import LocalPart, trainable_classes
from graphwire.run.collective import (
    InferenceFactory,
    global_metrics,
    seeded_model,
    split_sizes,
)
from graphwire.run.config import TrainConfig
from graphwire.run.gradsync import BackwardSync
from graphwire.run.training import make_optimizer
from graphwire.sampler.base import Batch, SampledBatch
from graphwire.sampler.dist import DistNeighborSampler
from graphwire.sampler.dist_pairs import DistPairSampler
from graphwire.sampler.links import SamplingFunctions

__all__ = ["RankLoop"]


class RankLoop:
    """The state of one rank's run: its sampler, store, fetcher and model.

    Args:
        part: this rank's part (features, labels and splits required).
        transport: connects the ranks.
        config: model, optimiser, fan-outs and batch size.
        fetch: the fetcher's name (``--fetch``) or its config (None: the
            registry's default).
        inference: makes what evaluates the model on the whole graph
            (:class:`~graphwire.run.collective.Inference`).
        functions: the sampling operators' functions (None: the uniform
            ones, ``config.negatives`` negatives per seed).
    """

    def __init__(
        self,
        part: LocalPart,
        transport: Transport,
        config: TrainConfig,
        fetch: Any = None,
        *,
        inference: InferenceFactory,
        functions: SamplingFunctions | None = None,
    ) -> None:
        assert config.fanouts is not None
        strategy, fetch_config = FETCHERS.resolve(fetch or FETCHERS.default)
        self.part, self.transport, self.config = part, transport, config
        self.rank, self.world = transport.rank, transport.world_size
        # First, before any service starts: it checks the data it trains on.
        self.sizes = self.check_data()
        self.functions = functions or SamplingFunctions(k=config.negatives)
        kind = self.layer_kind = LAYER_KINDS[config.model]
        self.sampler = DistNeighborSampler(
            owned_csr(part, transport, kind),
            part.book,
            transport,
            config.fanouts,
            hop=self.functions.hop,
        )
        kinds = getattr(strategy.cls, "KINDS", DEFAULT_KINDS)
        self.store = DistFeatureStore(part, transport, kinds=kinds)
        self.fetcher: Fetcher = strategy.cls(self.store, self.sampler, fetch_config)
        self.fetcher.use_functions(self.functions, self.pair_sampler())
        every = transport.all_gather_object(self.seed_nodes(), "setup.train")
        self.share = split_train(every, self.rank)
        shares = share_sizes(sum(ids.numel() for ids in every), self.world)
        self.steps = steps_per_epoch(shares, config.batch_size)
        self.epochs = range(0)  # the epochs this process trains: start() sets them
        self.model: torch.nn.Module = self.make_model()
        self.optimizer = make_optimizer(self.model, config)
        self.grad_sync = BackwardSync.for_model(self.model, transport)
        self.inference = inference(part, transport, config)
        self.counters: dict[str, Any] = {
            "train_share": self.share.numel(),
            "steps_per_epoch": self.steps,
        }

    # ------------------------------------------------------------ the task
    def check_data(self) -> dict[str, int]:
        """Collective: the nodes of each split over all parts (every rank
        raises alike when one is empty)."""
        trainable_classes(self.part)
        return split_sizes(self.part, self.transport)

    def seed_nodes(self) -> torch.Tensor:
        """int64: this part's nodes batches are drawn from (global IDs)."""
        assert self.part.train_local is not None  # (checked)
        return self.part.train_local.to(torch.int64) + self.part.global_range[0]

    def seeds_trained(self, sampled: SampledBatch, y: torch.Tensor) -> int:
        """The seeds a batch's loss covers (its output nodes)."""
        del y
        return sampled.seeds.numel()

    def pair_sampler(self) -> DistPairSampler | None:
        """The positive and negative sampler (collective; none: node
        batches)."""
        return None

    @property
    def gnn(self) -> GNN:
        """The message-passing part of the model (all of it here)."""
        assert isinstance(self.model, GNN)
        return self.model

    def make_model(self) -> torch.nn.Module:
        """The model, initialised as every rank's (and one process's)."""
        assert self.part.x is not None  # (checked)
        num_classes = trainable_classes(self.part)
        return seeded_model(self.part.x.shape[1], num_classes, self.config)

    # ------------------------------------------------------------ schedule
    def batches(self, epoch: int) -> list[Batch]:
        """This rank's batches of ``epoch`` (the schedule the fetcher reads)."""
        return epoch_batches(self.share, self.config.seed, self.rank, epoch, self.steps)

    def start(self, epochs: range, saved: Any | None) -> None:
        """Set up the fetcher for ``epochs``, the ones this process trains
        (collective); ``saved``: its state at the checkpoint resumed from."""
        self.epochs = epochs
        self.fetcher.start(self, epochs.start, saved)

    # ---------------------------------------------------------------- step
    def step(self, batch: Batch, stats: dict[str, float]) -> float:
        """One training step; returns the batch's loss."""
        sampled, x, y = self.fetcher.get(batch, stats)
        fetched = time.perf_counter()
        stats["seeds"] += self.seeds_trained(sampled, y)
        stats["edges"] += sampled.num_sampled_edges
        loss = self.loss_of(sampled, x, y, batch.dropout_seed)
        forwarded = time.perf_counter()
        self.optimizer.zero_grad(set_to_none=True)
        self.grad_sync.arm()
        loss.backward()  # each layer's gradient sum starts as it completes
        backwarded = time.perf_counter()
        self.grad_sync.finish()
        stats["sync_busy_s"] += self.grad_sync.take_busy()
        for p in self.model.parameters():
            assert p.grad is not None
            p.grad /= self.world
        synced = time.perf_counter()
        self.optimizer.step()
        stepped = time.perf_counter()
        stats["forward_s"] += forwarded - fetched
        # The step counts with the backward, as in a single process's
        # records; sync_s is the wait for the gradients' sums after the
        # backward, sync_busy_s their whole time, overlapped or not.
        stats["backward_s"] += (backwarded - forwarded) + (stepped - synced)
        stats["sync_s"] += synced - backwarded
        self.fetcher.release(batch)
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
        """Global accuracies and validation loss of the model on the whole
        graph, with the epoch's summed training ``loss`` (collective)."""
        logits = self.inference(self.gnn)
        return global_metrics(
            logits, self.part, self.transport, self.sizes, torch.tensor(loss)
        )

    def close(self, collective: bool = True) -> None:
        """Stop the fetcher's threads and remove what it wrote; with
        ``collective``, also close the feature service (all ranks together).
        After an error the peers are not in step, so no collective runs: the
        serving threads are daemons and go with the process."""
        self.grad_sync.close(join=collective)
        self.fetcher.close(collective)
        if collective:
            self.store.close()
