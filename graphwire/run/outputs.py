"""Where a run or command may write: never over its input, never under a file."""

from __future__ import annotations

import os
from pathlib import Path

from graphwire.fsutil import check_creatable, check_replaceable
from graphwire.graph.datasets import spec_paths

__all__ = ["check_not_input", "check_out", "check_out_path", "run_folder"]


def check_out_path(out: str) -> None:
    """``--out`` must be a folder or a path where one can be made.

    Raises:
        ValueError: ``out`` (or a folder above it) is a file, or the folder
            that would hold it cannot be written.
    """
    check_creatable(out, f"--out {out}")


def run_folder(out: str | None, prefix: str) -> Path:
    """``out`` (checked by :func:`check_out_path` before any work) or a
    fresh ``runs/<prefix>-<timestamp>`` folder."""
    if not out:
        import time

        return Path("runs") / f"{prefix}-{time.strftime('%Y%m%d-%H%M%S')}"
    check_out_path(out)
    return Path(out)


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
