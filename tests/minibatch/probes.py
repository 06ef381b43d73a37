"""Worker functions for the distributed mini-batch tests (in-process and gloo)."""

from __future__ import annotations

from typing import Any

import torch

from graphwire.comm.base import Transport
from graphwire.feature.rapid import RapidConfig, RapidStore
from graphwire.fullgraph.inference import ExactInference
from graphwire.minibatch.dist import train_minibatch_distributed
from graphwire.minibatch.loop import RankLoop
from graphwire.partition.format import load_part
from graphwire.run.checkpoint import CheckpointConfig
from graphwire.run.config import TrainConfig
from graphwire.sampler.base import Batch


def train(
    transport: Transport,
    folder: str,
    config: TrainConfig,
    fetch: Any,
    checkpoint: CheckpointConfig | None = None,
    die_at: tuple[int, int] | None = None,
    how: str = "kill",
) -> dict[str, Any]:
    """Train; return what the tests compare (parameters, batches, counters,
    the epochs a resume restored)."""
    part = load_part(folder, transport.rank)
    if die_at is not None:
        _arm_death(transport.rank, *die_at, how)
    restored: list[int] = []
    run = train_minibatch_distributed(
        part,
        transport,
        config,
        fetch,
        inference=ExactInference,
        on_restore=lambda records: restored.extend(r.epoch for r in records),
        checkpoint=checkpoint,
    )
    return {
        "restored": restored,
        "state": run.result.state_dict,
        "batches": run.batches,
        "counters": run.counters,
        "records": [r.as_dict() for r in run.result.records],
        "test_acc": run.result.test_acc,
        "ledger": run.ledger,
    }


def _arm_death(rank: int, victim: int, epoch: int, how: str) -> None:
    """Rank ``victim`` SIGKILLs itself (``how="kill"``) or raises (``"raise"``)
    at its first step of ``epoch``."""
    import os
    import signal

    if rank != victim:
        return
    original = RankLoop.step

    def step(self: RankLoop, batch: Batch, stats: dict[str, float]) -> float:
        if batch.epoch == epoch:
            if how == "raise":
                raise ValueError(f"injected failure in epoch {epoch}")
            os.kill(os.getpid(), signal.SIGKILL)
        return original(self, batch, stats)

    RankLoop.step = step  # type: ignore[method-assign]


def feature_paths(
    transport: Transport, folder: str, config: TrainConfig, n_hot: int
) -> dict[str, Any]:
    """Every feature path of ``--fetch rapid`` on a graph whose row ``g`` is
    ``g * 10 + column`` (new global IDs): prefetched, fallback (assembled by
    the trainer), cache lookups, on-demand pulls. Returns the worst error."""
    part = load_part(folder, transport.rank)
    loop = RankLoop(
        part, transport, config, RapidConfig(n_hot=n_hot), inference=ExactInference
    )
    rapid = loop.fetcher
    assert isinstance(rapid, RapidStore)
    worst = 0.0
    checked = {"prefetched": 0, "fallback": 0, "cache": 0, "on_demand": 0}
    try:
        loop.start(range(config.epochs), None)
        assert rapid.prefetcher is not None and rapid.cache is not None
        cols = torch.arange(loop.store.dim, dtype=torch.float32)
        for epoch in range(config.epochs):
            rapid.begin_epoch(epoch)
            for index in range(loop.steps):
                key = (epoch, index)
                item, prefetched = rapid.prefetcher.get(
                    key,
                    lambda key: rapid.assemble(key, "pull"),  # type: ignore[arg-type]
                )
                # A batch the trainer made itself is the fallback path; for
                # a prefetched one, the fallback path assembles it again.
                paths: dict[str, Any] = (
                    {"prefetched": item, "fallback": rapid.assemble(key, "pull")}
                    if prefetched
                    else {"fallback": item}
                )
                for path, (sampled, x, _, _) in paths.items():
                    checked[path] += 1
                    truth = sampled.input_nid.unsqueeze(1).float() * 10 + cols
                    worst = max(worst, float((x - truth).abs().max()))
                hit, rows = rapid.cache.lookup(sampled.input_nid, epoch)
                checked["cache"] += int(hit.sum())
                if rows.numel():
                    worst = max(worst, float((rows - truth[hit]).abs().max()))
                pulled = loop.store.pull(sampled.input_nid, kind="pull")
                checked["on_demand"] += pulled.shape[0]
                worst = max(worst, float((pulled - truth).abs().max()))
                rapid.prefetcher.release(key)
        transport.barrier()
    finally:
        loop.close()
    counters = dict(loop.counters) | rapid.counters()
    return {"worst": worst, "checked": checked, "counters": counters}


def cache_contents(
    transport: Transport, folder: str, config: TrainConfig, fetch: RapidConfig
) -> dict[str, Any]:
    """Train with ``--fetch rapid``; per epoch, the IDs its steady cache
    buffer holds and every remote input row its batches read (repeats
    kept), from the presampled schedule; and the store's counters."""
    seen: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}
    original = RapidStore.begin_epoch

    def begin_epoch(self: RapidStore, epoch: int) -> None:
        original(self, epoch)
        if self.sampler.rank != transport.rank:
            return  # (run_local: the other rank's thread, same class)
        assert self.cache is not None and self.presampler is not None
        presampled = self.presampler.epoch(epoch)
        reads = []
        for index in range(presampled.num_batches):
            sampled, local = presampled.batch(index)
            reads.append(sampled.input_nid[~local])
        held = self.cache.lookup(torch.cat(reads), epoch)[0]
        seen[epoch] = (torch.unique(torch.cat(reads)[held]), torch.cat(reads))

    RapidStore.begin_epoch = begin_epoch  # type: ignore[method-assign]
    try:
        result = train(transport, folder, config, fetch)
    finally:
        RapidStore.begin_epoch = original  # type: ignore[method-assign]
    return {"seen": seen, "counters": result["counters"]}
