"""Where a run or command may write: never over its input, never under a
file, never over an earlier run unless asked.

A run's folder (``graphwire train --out``) holds what :data:`RUN_WRITES`
names, and ``graphwire report`` adds :data:`REPORT_FILES` there. A folder
that holds any of them holds a run: a new run into it is refused unless it
continues that run (``--resume``) or replaces it (``--overwrite``, which
removes those outputs first, and nothing else). An empty folder, or one
holding only other files (a partitioned ``--dataset`` among them), is fine.
"""

from __future__ import annotations

import json
import os
import re
import shutil
from collections.abc import Callable
from pathlib import Path

from graphwire.fsutil import check_creatable, check_replaceable
from graphwire.graph.datasets import spec_paths

__all__ = [
    "CHECKPOINTS",
    "PARTITIONS",
    "REPORT_FILES",
    "RUN_WRITES",
    "check_not_input",
    "check_out",
    "check_out_path",
    "claim_run_folder",
    "run_folder",
    "run_outputs",
]

CHECKPOINTS = "checkpoints"  # OUT/checkpoints: --checkpoint-every
PARTITIONS = "partitions"  # OUT/partitions: the parts a distributed run writes
# What graphwire report writes into a run's folder (report.md first).
REPORT_FILES = ("report.md", "loss_acc.png", "time_split.png", "bytes_heatmap.png")


def check_out_path(out: str) -> None:
    """``--out`` must be a folder or a path where one can be made.

    Raises:
        ValueError: ``out`` (or a folder above it) is a file, or the folder
            that would hold it cannot be written.
    """
    check_creatable(out, f"--out {out}")


def run_folder(out: str | None, prefix: str) -> Path:
    """``out`` (checked by :func:`check_out_path` before any work) or a
    ``runs/<prefix>-<timestamp>`` folder that does not exist yet."""
    if not out:
        import time

        name = f"{prefix}-{time.strftime('%Y%m%d-%H%M%S')}"
        folder, count = Path("runs") / name, 1
        while folder.exists() or folder.is_symlink():  # two runs in one second
            count += 1
            folder = Path("runs") / f"{name}-{count}"
        return folder
    check_out_path(out)
    return Path(out)


def claim_run_folder(out: Path, dataset: str, *, overwrite: bool, resume: bool) -> None:
    """Make ``out`` a folder a new run may write: refuse one that holds an
    earlier run, or with ``overwrite`` remove that run's outputs
    (:func:`run_outputs`); with ``resume`` (which continues the run) leave
    it as it is. Before any work.

    Raises:
        FileExistsError: ``out`` holds a run, and neither ``overwrite`` nor
            ``resume`` is set; the error names both.
        ValueError: ``out`` holds a file or folder of the name of one the
            run writes that graphwire did not write (never removed).
    """
    if resume:
        return
    found = run_outputs(out, dataset)
    if not found:
        return
    if not overwrite:
        listed = ", ".join(path.name for path in found)
        if any(path.name == CHECKPOINTS for path in found):
            resume_it = " or --resume to continue it from its checkpoints"
        else:
            resume_it = " (it has no checkpoints to --resume from)"
        raise FileExistsError(
            f"--out {out}: holds an earlier run ({listed}); pass --overwrite to "
            f"replace it{resume_it}, or give another --out"
        )
    for path in found:
        if path.is_dir():
            shutil.rmtree(path)
        else:
            path.unlink()


def run_outputs(out: Path, dataset: str) -> list[Path]:
    """The outputs of an earlier run in ``out``: what a run writes
    (:data:`RUN_WRITES`), and a graphwire report with its plots; none that
    is (or holds) the input ``dataset`` reads.

    Raises:
        ValueError: something in ``out`` has the name of what a run writes
            but is not graphwire's (a run would write over it).
    """
    if not out.is_dir():
        return []
    found = []
    for name, ours in RUN_WRITES.items():
        path = out / name
        if not (path.exists() or path.is_symlink()) or _is_input(path, dataset):
            continue
        if not ours(path):
            raise ValueError(
                f"--out {out}: {name} is not graphwire's, and a run writes "
                f"{path}; refusing to replace it (give another --out)"
            )
        found.append(path)
    report = out / REPORT_FILES[0]
    if _is_report(report) and not _is_input(report, dataset):
        for name in REPORT_FILES:  # the plots are the report's
            path = out / name
            if path.is_file() and not path.is_symlink():
                found.append(path)
    return found


def _is_input(path: Path, dataset: str) -> bool:
    """Whether ``path`` is, or holds, what ``dataset`` reads."""
    try:
        check_not_input(path, dataset, str(path))
    except ValueError:
        return True
    return False


def _is_records(path: Path) -> bool:
    """A ``metrics.jsonl`` graphwire wrote: empty, or a JSON record with a
    ``kind`` first."""
    if path.is_symlink() or not path.is_file():
        return False
    try:
        with path.open("rb") as handle:
            first = handle.readline(1 << 20)
        if not first:
            return True
        record = json.loads(first)
    except (OSError, ValueError, RecursionError):
        return False
    return isinstance(record, dict) and "kind" in record


def _is_report(path: Path) -> bool:
    """A ``report.md`` graphwire report wrote."""
    if path.is_symlink() or not path.is_file():
        return False
    try:
        with path.open("rb") as handle:
            return handle.read(18) == b"# graphwire report"
    except OSError:
        return False


_CHECKPOINT_ENTRY = re.compile(r"latest\.json|\.latest\.json\..*\.(tmp|new)")
_EPOCH = re.compile(r"epoch\d{6,}")
_RANK_FILE = re.compile(r"\.?rank\d+\.pt(\.partial)?")


def _is_checkpoints(path: Path) -> bool:
    """A checkpoint folder: ``latest.json`` and ``epochNNNNNN/rankR.pt``
    (and their temporary files), nothing else."""
    if path.is_symlink() or not path.is_dir():
        return False
    for entry in path.iterdir():
        if entry.is_symlink():
            return False
        if entry.is_dir() and _EPOCH.fullmatch(entry.name):
            if not all(
                _RANK_FILE.fullmatch(f.name) and f.is_file() and not f.is_symlink()
                for f in entry.iterdir()
            ):
                return False
        elif not (entry.is_file() and _CHECKPOINT_ENTRY.fullmatch(entry.name)):
            return False
    return True


def _is_parts(path: Path) -> bool:
    """A partitioned folder graphwire wrote, holding nothing else."""
    try:
        check_replaceable(path, True)
    except ValueError:
        return False
    return True


# What a run writes into its folder, by name, and how to tell that an
# existing one is graphwire's.
RUN_WRITES: dict[str, Callable[[Path], bool]] = {
    "metrics.jsonl": _is_records,
    "metrics.jsonl.partial": _is_records,
    CHECKPOINTS: _is_checkpoints,
    PARTITIONS: _is_parts,
}


def check_out(out: str, dataset: str, overwrite: bool) -> None:
    """Refuse an ``--out`` that would destroy the input or something not ours.

    Run before any work, so a refusal costs nothing. ``out`` may not be the
    input ``dataset`` reads, contain it, or lie inside it, nor lie under a
    file (:func:`check_out_path`); an existing ``out`` needs
    ``--overwrite`` and must be a folder graphwire wrote.

    Raises:
        ValueError: ``out`` overlaps the input, lies under a file, or is not
            graphwire's to replace.
        FileExistsError: ``out`` exists and ``overwrite`` is false.
    """
    check_not_input(out, dataset, f"--out {out}")
    check_out_path(out)  # a path under a file, or in a folder not ours to write
    check_replaceable(out, overwrite, flag="--overwrite")


def check_not_input(folder: str | Path, dataset: str, what: str) -> None:
    """Refuse a ``folder`` to be written that is the input ``dataset`` reads,
    contains it, or lies inside it; ``what`` names the folder in the error.

    Raises:
        ValueError: ``folder`` overlaps the input.
    """
    # Paths as given (a link is the input's name here) and as resolved.
    targets = {Path(os.path.abspath(folder)), Path(folder).resolve()}
    for given in spec_paths(dataset):
        for source in {Path(os.path.abspath(given)), given.resolve()}:
            if any(t == source or t in source.parents for t in targets):
                raise ValueError(
                    f"{what}: holds the input of --dataset {dataset}, "
                    "refusing to replace it; write the output somewhere else"
                )
            if any(source in t.parents for t in targets):
                raise ValueError(
                    f"{what}: lies inside the input of --dataset {dataset}; "
                    "write the output somewhere else"
                )
