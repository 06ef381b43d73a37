"""Worker functions for the multi-process full-graph tests (tests/multiprocess).

Spawned children import a worker function by its module path, so these live in
a plain module, not a collected test module. Every function here runs in a
worker process started by :func:`~graphwire.comm.launch.launch_local` as
``fn(ctx, *args)``:

- :func:`step_cases`: one training forward/backward per case (the parity
  oracle's counterpart), several cases over one process group;
- :func:`train_state`: :func:`train_distributed`, returning the final weights;
- :func:`run_rank_recording_pid`: :func:`run_rank` as ``graphwire train
  --workers N`` runs it, after writing this process's PID to a folder.

A worker dies on purpose through the exchange :data:`DYING_G3`: G3's engine
that SIGKILLs its own process in the middle of a training epoch (options
``die_rank`` and ``die_epoch``), after it has sent the first pipelined message
of layer 1 and while its peers wait for the rest; option ``note`` names a file
to write the time of death to. The engine is registered only inside the workers
(:func:`register_dying_g3`), never in the test process.
"""

from __future__ import annotations

import dataclasses
import os
import signal
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn

from graphwire.comm.base import Transport
from graphwire.comm.context import WorkerContext
from graphwire.comm.dist import TorchTransport
from graphwire.fullgraph.distributed import (
    build_engine,
    forward_loss,
    train_distributed,
)
from graphwire.fullgraph.engines import EXCHANGES
from graphwire.fullgraph.g3.config import G3Config
from graphwire.fullgraph.g3.engine import G3Engine
from graphwire.partition.format import load_part
from graphwire.run.checkpoint import CheckpointConfig
from graphwire.run.collective import seeded_model
from graphwire.run.config import TrainConfig
from graphwire.run.job import Job, RankReport, run_rank
from graphwire.run.training import EpochRecord

__all__ = [
    "DYING_G3",
    "DyingG3Config",
    "DyingP2PEngine",
    "engine_args",
    "StepCase",
    "register_dying_g3",
    "run_rank_recording_pid",
    "step_cases",
    "train_state",
]

DYING_G3 = "g3-dying"


@dataclass(frozen=True, kw_only=True, slots=True)
class DyingG3Config(G3Config):
    """G3's settings, and when to die."""

    die_rank: int = -1
    die_epoch: int = -1
    note: str | None = None


class DyingP2PEngine(G3Engine):
    """G3 (same numbers) whose rank ``die_rank`` SIGKILLs itself in epoch
    ``die_epoch`` (0-based, counted from the first epoch this process trains):
    in the training forward, right after sending its first message of layer 1.

    A rank with nothing to send at layer 1 dies when layer 1 starts instead.
    """

    config: DyingG3Config

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._dies = self.transport.rank == self.config.die_rank
        self._die_epoch = self.config.die_epoch
        self._note = self.config.note
        self._epoch = -1  # training forwards seen so far, minus one
        # Dies as a layer starts, or right after it sent a bin's rows.
        forward_layer, send_bin = self.forward.layer, self.wire.send_bin

        def dying_layer(index: int, *rest: Any) -> Any:
            if self._now(index):
                self._die()
            return forward_layer(index, *rest)

        def dying_send(layer: int, b: int, rows: torch.Tensor) -> None:
            send_bin(layer, b, rows)
            if self._now(layer) and self.wire.sends:
                self._die()

        self.forward.layer = dying_layer  # type: ignore[method-assign,assignment]
        self.wire.send_bin = dying_send  # type: ignore[method-assign]

    def begin(self, model: nn.Module, dropout_seed: int | None) -> None:
        if model.training:
            self._epoch += 1
        super().begin(model, dropout_seed)

    def _now(self, layer: int) -> bool:
        return (
            self._dies
            and layer >= 1
            and self.phase == ""
            and self._epoch == self._die_epoch
        )

    def _die(self) -> None:
        if self._note is not None:  # when it died (wall clock, for the parent)
            Path(self._note).write_text(repr(time.time()))
        os.kill(os.getpid(), signal.SIGKILL)


def register_dying_g3() -> None:
    """Make :data:`DYING_G3` an exchange name (in this process only)."""
    EXCHANGES.register(DYING_G3, DyingP2PEngine, DyingG3Config)


def engine_args(exchange: str, options: dict[str, Any] | None) -> tuple[Any, dict]:
    """A test's ``(exchange, options)`` as :func:`build_engine` takes them:
    the engine's config (the fields ``options`` names) and the engine's own
    keywords (``cache_input``, ``loss_rows``: the rest)."""
    strategy = EXCHANGES.get(exchange)
    names = {f.name for f in dataclasses.fields(strategy.config_type)}
    options = options or {}
    fields = {k: v for k, v in options.items() if k in names}
    return strategy.config(**fields), {
        k: v for k, v in options.items() if k not in names
    }


# ------------------------------------------------------------------ parity
@dataclass(frozen=True, kw_only=True)
class StepCase:
    """One forward/backward of the parity check.

    Attributes:
        folder: the partitioned graph (one part per rank).
        config: the model.
        exchange: engine name.
        options: engine options.
        dropout_seed: the hashed dropout's seed (dropout is on).
    """

    folder: str
    config: TrainConfig
    exchange: str
    options: dict[str, Any] = field(default_factory=dict)
    dropout_seed: int = 0


def step_cases(ctx: WorkerContext, cases: list[StepCase]) -> list[dict[str, Any]]:
    """Run every case over one process group (one launch, many checks).

    Returns:
        Per case: ``orig_nid`` and ``logits`` of the owned rows, ``loss`` (this
        rank's share), ``grads`` (summed over ranks), ``counters`` (engine) and
        ``fwd_messages`` (messages this rank sent for layer 1's forward).
    """
    transport = TorchTransport.open(ctx)
    try:
        results = []
        for case in cases:
            results.append(_step(transport, case))
            transport.barrier()  # cases do not overlap
        return results
    finally:
        transport.close()


def _step(transport: Transport, case: StepCase) -> dict[str, Any]:
    before = _messages(transport, "fwd.L1")
    part = load_part(case.folder, transport.rank)
    assert part.x is not None and part.train_local is not None
    engine = build_engine(
        part, transport, case.config, *engine_args(case.exchange, case.options)
    )
    num_classes = int(part.meta["num_classes"])
    model = seeded_model(part.x.shape[1], num_classes, case.config)
    model.train()
    engine.prepare(model)  # as train_distributed does
    local = torch.tensor([float(part.train_local.numel())])
    num_train = int(transport.all_reduce_sum(local, "sync.metrics"))
    logits, loss = forward_loss(engine, model, num_train, case.dropout_seed)
    loss.backward()
    engine.sync_gradients(model)
    engine.close()
    return {
        "orig_nid": part.orig_nid.clone(),
        "logits": logits.detach().clone(),
        "loss": float(loss.detach()),
        "grads": {
            name: p.grad.clone()
            for name, p in model.named_parameters()
            if p.grad is not None
        },
        "counters": dict(engine.counters),
        "fwd_messages": _messages(transport, "fwd.L1") - before,
    }


def _messages(transport: Transport, tag: str) -> int:
    return sum(row[4] for row in transport.ledger.snapshot()["sent"] if row[2] == tag)


# ---------------------------------------------------------------- training
def train_state(
    ctx: WorkerContext,
    folder: str,
    config: TrainConfig,
    exchange: str,
    options: dict[str, Any],
    checkpoint: CheckpointConfig | None = None,
) -> dict[str, Any]:
    """:func:`train_distributed` on this rank's part (``exchange`` may be
    :data:`DYING_G3`).

    Returns:
        ``state_dict`` (final weights), ``best_state_dict``, ``test_acc``,
        ``val_acc``, ``best_epoch``, ``records`` (every epoch's record as a
        dict, restored ones included) and ``trained`` (the epochs this process
        ran itself, from ``first_epoch``).
    """
    register_dying_g3()
    exchange_config, options = engine_args(exchange, options)
    trained: list[int] = []

    def on_epoch(record: EpochRecord) -> None:
        trained.append(record.epoch)

    transport = TorchTransport.open(ctx)
    try:
        run = train_distributed(
            load_part(folder, ctx.rank),
            transport,
            config,
            exchange_config,
            options=options,
            on_epoch=on_epoch,
            checkpoint=checkpoint,
        )
    finally:
        transport.close()
    result = run.result
    return {
        "state_dict": result.state_dict,
        "best_state_dict": result.best_state_dict,
        "test_acc": result.test_acc,
        "val_acc": result.val_acc,
        "best_epoch": result.best_epoch,
        "records": [r.as_dict() for r in result.records],
        "trained": trained,
        "first_epoch": run.first_epoch,
    }


def run_rank_recording_pid(
    ctx: WorkerContext, job: Job, pid_folder: str
) -> list[RankReport] | None:
    """:func:`run_rank` (``job.strategy`` may be :data:`DYING_G3`'s config), after
    writing ``rank{r}.pid`` into ``pid_folder``."""
    register_dying_g3()
    (Path(pid_folder) / f"rank{ctx.rank}.pid").write_text(str(os.getpid()))
    return run_rank(ctx, job)
