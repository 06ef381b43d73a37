"""What a checkpoint holds of a training loop, saved and loaded on every rank.

:func:`training_state` is the state any loop saves after an epoch (model,
optimizer, torch RNG, early-stopping state, records so far);
:func:`save_on_every_rank` writes it on each rank and marks the checkpoint
complete once every rank has; :func:`load_on_every_rank` reads the latest one
back once every rank has found the same; :func:`restore_training_state` loads
it into a loop's objects. Files and their checks: :mod:`graphwire.run.checkpoint`.
"""

from __future__ import annotations

from typing import Any

import torch

from graphwire.comm.base import Transport
from graphwire.run.checkpoint import (
    CheckpointConfig,
    load_checkpoint,
    mark_complete,
    save_checkpoint,
)
from graphwire.run.training import BestEpoch, EpochRecord

__all__ = [
    "load_on_every_rank",
    "restore_training_state",
    "save_on_every_rank",
    "training_state",
]


def training_state(
    epoch: int,
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    best: BestEpoch,
    records: list[EpochRecord],
) -> dict[str, Any]:
    """What a checkpoint holds of any training loop after ``epoch``."""
    return {
        "epoch": epoch,
        "model": model.state_dict(),
        "optimizer": optimizer.state_dict(),
        "rng": torch.get_rng_state(),
        "best": {
            "epoch": best.epoch,
            "val_acc": best.val_acc,
            "val_loss": best.val_loss,
            "test_acc": best.test_acc,
            "stale": best._stale,
            "state_dict": best.state_dict,
        },
        "records": [r.as_dict() for r in records],
    }


def load_on_every_rank(
    checkpoint: CheckpointConfig, transport: Transport
) -> dict[str, Any] | None:
    """This rank's state at the latest complete checkpoint (None: none), once
    every rank has found the same one (an ``all_gather_object`` of the
    epochs, tag ``meta.resume``).

    Raises:
        ValueError: as :func:`load_checkpoint`; or, on every rank, the ranks
            found different checkpoints (machines that do not share the
            folder: a rank that found none would train on from fresh
            weights, in step with the others until the run ends apart).
    """
    state = load_checkpoint(checkpoint, transport.rank, transport.world_size)
    epoch = None if state is None else int(state["epoch"])
    found = transport.all_gather_object(epoch, "meta.resume")
    if len(set(found)) > 1:
        said = ", ".join(
            f"rank {rank} {'none' if e is None else f'epoch {e}'}"
            for rank, e in enumerate(found)
        )
        raise ValueError(
            f"{checkpoint.folder}: the ranks found different checkpoints there "
            f"({said}); every rank must read the run's own (on several machines: "
            "the same --out each machine gave the run, shared or its own)"
        )
    return state


def save_on_every_rank(
    checkpoint: CheckpointConfig,
    epoch: int,
    transport: Transport,
    state: dict[str, Any],
) -> None:
    """Write this rank's ``state``; the checkpoint counts once all have. The
    first rank of each machine then marks it complete in its folder
    (:meth:`~graphwire.comm.base.Transport.leads_machine`): machines that do
    not share the folder each keep their own ``latest.json`` and prune their
    own; those that share it write the same file."""
    save_checkpoint(checkpoint, epoch, transport.rank, state)
    transport.barrier()  # every rank has written this epoch
    if transport.leads_machine:
        mark_complete(checkpoint, epoch, transport.world_size)
    transport.barrier()


def restore_training_state(
    state: dict[str, Any],
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    best: BestEpoch,
    records: list[EpochRecord],
) -> int:
    """Load ``state``; return the first epoch still to run.

    Raises:
        ValueError: the state's model or optimizer does not fit these (a
            checkpoint file changed by hand).
    """
    try:
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
    except (RuntimeError, ValueError, KeyError) as error:
        said = str(error).strip().splitlines()
        raise ValueError(
            f"the checkpoint of rank {state.get('rank')} after epoch "
            f"{state.get('epoch')} does not fit this model: "
            f"{said[-1].strip() if said else type(error).__name__}"
        ) from None
    torch.set_rng_state(state["rng"])
    saved = state["best"]
    best.epoch, best.val_acc = saved["epoch"], saved["val_acc"]
    best.val_loss, best.test_acc = saved["val_loss"], saved["test_acc"]
    best._stale, best.state_dict = saved["stale"], saved["state_dict"]
    records.extend(EpochRecord(**r) for r in state["records"])
    return int(state["epoch"]) + 1
