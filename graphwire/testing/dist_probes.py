"""Worker functions for the distributed full-graph tests (spawned children
import them by name, so they live in the package)."""

from __future__ import annotations

import os
import signal
from typing import Any

import torch

from graphwire.comm.context import WorkerContext
from graphwire.comm.dist import TorchTransport
from graphwire.fullgraph.checkpoint import CheckpointConfig
from graphwire.fullgraph.distributed import (
    build_engine,
    forward_loss,
    seeded_model,
    sync_gradients,
    train_distributed,
)
from graphwire.partition.format import load_part
from graphwire.training import EpochRecord, TrainConfig

__all__ = ["one_step", "train_and_report"]


def train_and_report(
    ctx: WorkerContext,
    folder: str,
    config: TrainConfig,
    exchange: str,
    options: dict[str, Any],
    checkpoint: CheckpointConfig | None = None,
    kill: tuple[int, int] | None = None,
) -> dict[str, Any]:
    """Train; ``kill=(rank, epoch)`` SIGKILLs that rank when that epoch ends.

    Returns:
        ``{"test_acc", "state_dict", "epochs_run", "ledger"}`` of this rank.
    """

    def on_epoch(record: EpochRecord) -> None:
        if kill is not None and (ctx.rank, record.epoch) == kill:
            os.kill(os.getpid(), signal.SIGKILL)

    transport = TorchTransport.open(ctx)
    try:
        run = train_distributed(
            load_part(folder, ctx.rank),
            transport,
            config,
            exchange,
            options=options,
            on_epoch=on_epoch,
            checkpoint=checkpoint,
        )
    finally:
        transport.close()
    return {
        "test_acc": run.result.test_acc,
        "state_dict": run.result.state_dict,
        "epochs_run": run.result.epochs_run,
        "ledger": run.ledger,
    }


def one_step(
    ctx: WorkerContext,
    folder: str,
    config: TrainConfig,
    exchange: str,
    options: dict[str, Any],
    dropout_seed: int,
) -> dict[str, Any]:
    """One training forward/backward: owned logits, loss share, synced grads."""
    transport = TorchTransport.open(ctx)
    try:
        part = load_part(folder, ctx.rank)
        engine = build_engine(part, transport, config, exchange, options)
        assert part.x is not None and part.train_local is not None
        model = seeded_model(part.x.shape[1], int(part.meta["num_classes"]), config)
        model.train()
        local = torch.tensor([float(part.train_local.numel())])
        num_train = int(transport.all_reduce_sum(local, "sync.metrics"))
        logits, loss = forward_loss(engine, model, num_train, dropout_seed)
        loss.backward()
        sync_gradients(model, transport)
        return {
            "orig_nid": part.orig_nid.clone(),
            "logits": logits.detach(),
            "loss": float(loss.detach()),
            "grads": {
                n: p.grad.clone()
                for n, p in model.named_parameters()
                if p.grad is not None
            },
        }
    finally:
        transport.close()
