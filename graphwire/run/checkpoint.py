"""Checkpoints of a distributed run (either mode), and resuming from them.

Every ``every`` epochs each rank writes ``rank{r}.pt`` for that epoch (model,
optimizer, torch RNG state, early-stopping state, records so far) atomically;
after a barrier the first rank of each machine writes ``latest.json`` naming
the epoch (so a folder each machine keeps apart has its own; one they share
gets the same file from each), so a checkpoint
counts only once every rank has written it, and then removes the checkpoints
before it but the newest ``keep`` (``--keep-checkpoints``, default 1: a
resume reads only the latest; 0 keeps every one; a resume keeps the run's
count and interval unless given others). ``--resume`` loads the epoch that
``latest.json`` names and continues from the next one, with the settings the
run was started with (``CheckpointConfig.run``, kept in ``latest.json``): a
resume that changes any of them is refused, naming them, and so is one on
other parts than the run trained on (``CheckpointConfig.parts``, a digest of
the partitioned folder's ``meta.json``). Each rank's file is stamped with
the run's settings and parts (their digest), and a resume refuses a file
another run wrote (one started into the same folder that died before its
``latest.json``). Dropout masks are hashed from (seed, epoch), so a resumed
run takes the same steps as an uninterrupted one.
"""

from __future__ import annotations

import hashlib
import json
import os
import pickle
import re
import shutil
import sys
import zipfile
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import torch

from graphwire.fsutil import sha256_file, write_json

__all__ = [
    "CheckpointConfig",
    "check_resume",
    "load_checkpoint",
    "parts_digest",
    "save_checkpoint",
    "saved_epochs",
    "saved_schedule",
]

FORMAT = "graphwire.checkpoint"


@dataclass(frozen=True)
class CheckpointConfig:
    """Where and how often to checkpoint.

    Attributes:
        folder: checkpoint folder (created if missing).
        every: checkpoint after every ``every``-th epoch (and the last,
            :meth:`due`).
        resume: start from the latest complete checkpoint in ``folder``.
        run: the settings a resumed run must share with the one that wrote
            the checkpoints (JSON values by name: model, learning rate, ...;
            not the epoch count, which a resume may extend).
        keep: how many complete checkpoints to keep, the newest (0: all).
        parts: :func:`parts_digest` of the parts the run trains on (None:
            not known here, and not checked).
    """

    folder: str
    every: int = 10
    resume: bool = False
    run: dict[str, Any] = field(default_factory=dict)
    keep: int = 1
    parts: str | None = None

    def __post_init__(self) -> None:
        if self.every < 1:
            raise ValueError(f"checkpoint every: expected >= 1, got {self.every}")
        if self.keep < 0:
            raise ValueError(f"checkpoints to keep: expected >= 0, got {self.keep}")

    def due(self, epoch: int, epochs: int, stopped: bool) -> bool:
        """Whether the run checkpoints after ``epoch`` (of ``epochs``):
        every ``every``-th epoch, and its last, the run's end or an early
        stop (``stopped``), so that a resume of a run that ended trains
        nothing again and one that stopped early stays stopped."""
        return (epoch + 1) % self.every == 0 or epoch + 1 >= epochs or stopped

    def on_parts(self, folder: str | os.PathLike[str]) -> CheckpointConfig:
        """This config with ``parts`` the digest of the partitioned ``folder``
        (:func:`parts_digest`), which every rank's ``latest.json`` and file
        record."""
        return replace(self, parts=parts_digest(folder))


def _epoch_dir(folder: Path, epoch: int) -> Path:
    return folder / f"epoch{epoch:06d}"


def parts_digest(folder: str | os.PathLike[str]) -> str:
    """What identifies a partitioned graph: the SHA-256 of its ``meta.json``,
    which holds every part's array checksums (the same parts, split again
    the same way, give the same digest)."""
    return sha256_file(Path(folder) / "meta.json")


def saved_epochs(folder: str | os.PathLike[str]) -> list[int]:
    """The epochs with a checkpoint folder in ``folder``, complete or not,
    in order."""
    if not Path(folder).is_dir():
        return []
    named = (re.fullmatch(r"epoch(\d{6,})", p.name) for p in Path(folder).iterdir())
    return sorted(int(m.group(1)) for m in named if m is not None)


def save_checkpoint(
    config: CheckpointConfig, epoch: int, rank: int, state: dict[str, Any]
) -> None:
    """Write this rank's ``state`` for ``epoch`` (atomic: temp file, rename),
    stamped with ``rank``, ``epoch`` and the run (:func:`_run_stamp`; a resume
    checks all three)."""
    where = _epoch_dir(Path(config.folder), epoch)
    where.mkdir(parents=True, exist_ok=True)
    final = where / f"rank{rank}.pt"
    partial = where / f".rank{rank}.pt.partial"
    stamp = _run_stamp(config.run, config.parts)
    torch.save({**state, "epoch": epoch, "rank": rank, "run": stamp}, partial)
    os.replace(partial, final)


def _run_stamp(run: dict[str, Any], parts: str | None) -> dict[str, str | None]:
    """What ties a rank's file to its run: the SHA-256 of the run's settings
    (as ``latest.json`` holds them) and the parts' digest."""
    settings = json.dumps(json.loads(json.dumps(run)), sort_keys=True)
    return {"settings": hashlib.sha256(settings.encode()).hexdigest(), "parts": parts}


def mark_complete(config: CheckpointConfig, epoch: int, world_size: int) -> None:
    """After every rank saved ``epoch`` (by the first rank of each machine):
    make it the latest, then remove the checkpoints before it but the newest
    ``config.keep``, and the folders of later epochs (left by an earlier
    attempt at this run that died after them; this one has not got there).
    Machines that share the folder write the same ``latest.json`` (each
    atomically) and remove the same folders: what another has removed
    already is passed over."""
    write_json(
        Path(config.folder) / "latest.json",
        {
            "format": FORMAT,
            "epoch": epoch,
            "world_size": world_size,
            "every": config.every,
            "keep": config.keep,
            "run": config.run,
            "parts": config.parts,
        },
    )
    saved = saved_epochs(config.folder)
    done = [e for e in saved if e <= epoch]
    stale = [e for e in saved if e > epoch]
    if config.keep:
        stale += done[: -config.keep]
    for old in stale:
        _remove_shared(_epoch_dir(Path(config.folder), old))


def _remove_shared(folder: Path) -> None:
    """Remove ``folder``, which another machine may be removing at once:
    what is gone from under ``rmtree`` is passed over, any other error
    raised."""

    def gone_already(function: Any, path: str, error: Any) -> None:
        error = error[1] if isinstance(error, tuple) else error  # onerror's
        if not isinstance(error, FileNotFoundError):
            raise error

    if sys.version_info >= (3, 12):
        shutil.rmtree(folder, onexc=gone_already)
    else:  # onexc is new in 3.12, where onerror is deprecated
        shutil.rmtree(folder, onerror=gone_already)


def saved_schedule(folder: str | os.PathLike[str]) -> dict[str, int]:
    """What ``latest.json`` in ``folder`` records of how the run checkpoints,
    which a resume keeps unless told otherwise: ``every`` (the interval) and
    ``keep`` (how many are kept); empty if there is no such file, and without
    a field the file does not hold."""
    try:
        meta = json.loads((Path(folder) / "latest.json").read_text())
    except (OSError, ValueError, RecursionError):
        return {}
    if not isinstance(meta, dict):
        return {}
    lowest = {"every": 1, "keep": 0}
    return {
        name: meta[name]
        for name, low in lowest.items()
        if type(meta.get(name)) is int and meta[name] >= low
    }


def check_resume(config: CheckpointConfig, world_size: int) -> int | None:
    """The epoch of the latest complete checkpoint in ``config.folder`` (None
    if there is none).

    Raises:
        ValueError: ``latest.json`` is malformed, was written by a run with
            another number of ranks, with other settings (``config.run``;
            each differing one is named), or on other parts (``config.parts``,
            when both it and ``latest.json`` give them).
    """
    meta = _latest(config, world_size)
    return None if meta is None else int(meta["epoch"])


def _latest(config: CheckpointConfig, world_size: int) -> dict[str, Any] | None:
    """``latest.json`` of ``config.folder``, checked as :func:`check_resume`
    says (None if there is none)."""
    latest = Path(config.folder) / "latest.json"
    if not latest.exists():
        return None
    try:
        meta = json.loads(latest.read_text())
        epoch, saved_world = int(meta["epoch"]), int(meta["world_size"])
    except (ValueError, KeyError, TypeError, RecursionError) as error:
        raise ValueError(
            f"{latest}: not a graphwire checkpoint index: {error}"
        ) from None
    if meta.get("format") != FORMAT:
        raise ValueError(f"{latest}: format {meta.get('format')!r}, expected {FORMAT}")
    if saved_world != world_size:
        raise ValueError(
            f"{latest}: written by {saved_world} ranks, resuming with {world_size}"
        )
    saved, parts = meta.get("run") or {}, meta.get("parts")
    for name, value, kind in (("run", saved, dict), ("parts", parts, str | None)):
        if not isinstance(value, kind):
            raise ValueError(
                f"{latest}: not a graphwire checkpoint index: its {name!r} is "
                f"{type(value).__name__} {value!r:.40}"
            )
    wanted = json.loads(json.dumps(config.run))  # as latest.json would hold it
    differ = [
        f"{name} {saved.get(name)!r} (now {wanted.get(name)!r})"
        for name in sorted(set(saved) | set(wanted))
        if saved.get(name) != wanted.get(name)
    ]
    if saved and wanted and differ:  # (either side empty: nothing to compare)
        raise ValueError(
            f"{latest}: the run was started with other settings: "
            f"{', '.join(differ)}; resume with the same ones (the epoch count "
            f"and patience may change)"
        )
    if config.parts is not None and parts is not None and parts != config.parts:
        raise ValueError(
            f"{latest}: the run trained on other parts than these (their "
            f"meta.json's SHA-256 was {str(parts)[:12]}..., now "
            f"{config.parts[:12]}...): the graph was partitioned again, or is "
            "another one; resume on the parts the run trained on, or start "
            "afresh with another --out"
        )
    return dict(meta, epoch=epoch)


def load_checkpoint(
    config: CheckpointConfig, rank: int, world_size: int
) -> dict[str, Any] | None:
    """This rank's state at the latest complete checkpoint (None if none).

    Raises:
        ValueError: as :func:`check_resume`, or ``latest.json`` names an
            epoch whose file is missing, unreadable (truncated, damaged: a
            record failing its CRC-32, not written by torch, or holding more
            than tensors and plain values), or
            written for another epoch, rank or run (a file copied in, or
            written by another run started into the same folder).
    """
    meta = _latest(config, world_size)
    if meta is None:
        return None
    epoch = int(meta["epoch"])
    path = _epoch_dir(Path(config.folder), epoch) / f"rank{rank}.pt"
    if not path.exists():
        raise ValueError(f"{path}: missing (latest.json names epoch {epoch})")
    damaged = _failing_crc(path)
    if damaged is not None:
        raise ValueError(
            f"{path}: not a readable checkpoint (damaged: its record {damaged} "
            "fails its CRC-32 check)"
        )
    try:
        state = torch.load(path, weights_only=True)
    except (OSError, EOFError, RuntimeError, ValueError, pickle.UnpicklingError) as e:
        raise ValueError(
            f"{path}: not a readable checkpoint ({_unreadable(path, e)})"
        ) from None
    missing = _STATE_KEYS - set(state) if isinstance(state, dict) else _STATE_KEYS
    if missing:
        raise ValueError(f"{path}: not a checkpoint (no {', '.join(sorted(missing))})")
    if state["epoch"] != epoch or state.get("rank", rank) != rank:
        raise ValueError(
            f"{path}: holds the state of rank {state.get('rank', rank)} after "
            f"epoch {state['epoch']}, not of rank {rank} after epoch {epoch} "
            "(latest.json); was the checkpoint folder changed by hand?"
        )
    stamp = state.get("run", {})  # (an older graphwire's file has none)
    stamp = stamp if isinstance(stamp, dict) else {"settings": stamp}
    run = _run_stamp(meta.get("run") or {}, meta.get("parts"))
    parts = {stamp.get("parts"), run["parts"]} - {None}  # None: not known
    if stamp.get("settings", run["settings"]) != run["settings"] or len(parts) > 1:
        raise ValueError(
            f"{path}: written by another run than the one latest.json names "
            f"(with other settings or parts); did another run write into "
            f"{config.folder}? Resume from a folder only its own run wrote, or "
            "start afresh with another --out"
        )
    return {name: value for name, value in state.items() if name != "run"}


# What every training loop's state holds (:func:`save_checkpoint` adds the rank).
_STATE_KEYS = {"epoch", "model", "optimizer", "rng", "best", "records"}


def _failing_crc(path: Path) -> str | None:
    """The first record of the ``torch.save`` archive ``path`` whose bytes
    fail the CRC-32 the archive holds for them, or None (also for a file that
    is no archive, which ``torch.load`` then reports). ``torch.load`` checks
    no CRC: a checkpoint with damaged tensor bytes loaded, and the ranks
    resumed with models that differ."""
    try:
        with zipfile.ZipFile(path) as archive:
            return archive.testzip()
    except (zipfile.BadZipFile, EOFError, OSError):
        return None


def _unreadable(path: Path, error: BaseException) -> str:
    """Why ``torch.load`` could not read ``path``, in a line. Torch's own
    messages run to paragraphs, and for a file that is no checkpoint advise
    ``weights_only=False``, which would run whatever the file holds."""
    if path.stat().st_size == 0:
        return "the file is empty"
    if isinstance(error, pickle.UnpicklingError):
        return "not a torch.save file of tensors and plain values"
    lines = str(error).strip().splitlines()
    said = lines[0].split(". ")[0] if lines else type(error).__name__  # a sentence
    return f"cut short or damaged: {said}"
