"""Running ``graphwire train`` with workers, spawned or under torchrun, and
reading the summary and metrics it leaves.

A run spawned with ``--workers`` runs in the test's own process
(:func:`graphwire`, as ``python -m graphwire`` would run it): its workers
start from the fork server the earlier runs started, where a process of its
own would first import torch and start a fork server (5-8 s a run). Runs
under torchrun, and runs a test signals or watches, are processes of their
own (:func:`_run`).
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from graphwire.cli import main

SPEC = "synthetic:products?nodes=2000&degree=8&features=16&classes=4&seed=3"


def _run(argv: list[str]) -> dict[str, str]:
    done = subprocess.run(argv, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    return _summary(done.stdout)


@dataclass(frozen=True)
class Ran:
    """What a command run in this process did: its exit status and what it,
    and the workers it started, wrote to standard output and error."""

    returncode: int
    stdout: str
    stderr: str

    def summary(self) -> dict[str, str]:
        """The fields of its summary line; fails the test unless it ended 0."""
        assert self.returncode == 0, self.stderr[-3000:]
        return _summary(self.stdout)


def graphwire(capfd: pytest.CaptureFixture[str], *args: str) -> Ran:
    """``python -m graphwire ARGS``, run in this process: ``capfd`` takes
    what it and its workers write to file descriptors 1 and 2."""
    capfd.readouterr()  # what the test wrote before is not the command's
    try:
        code = main(list(args))
    except SystemExit as stop:  # argparse's: a flag refused
        code = stop.code if isinstance(stop.code, int) else 2
    out, err = capfd.readouterr()
    return Ran(code, out, err)


def _summary(stdout: str) -> dict[str, str]:
    """The fields of the summary line, the last line of a run's output."""
    line = stdout.strip().splitlines()[-1]
    assert line.startswith("summary "), stdout[-2000:]
    return dict(pair.split("=", 1) for pair in line.split()[1:])


def _torchrun() -> str:
    """The torchrun beside this interpreter (the test is skipped without it)."""
    torchrun = shutil.which("torchrun", path=str(Path(sys.executable).parent))
    if torchrun is None:
        pytest.skip("torchrun is not installed beside this interpreter")
    return torchrun


def _epoch_lines(path: Path) -> int:
    """Complete epoch lines in ``path`` so far (0 while it does not exist)."""
    try:
        return len(_streamed_epochs(path))
    except FileNotFoundError:
        return 0


def _streamed_epochs(path: Path) -> list[str]:
    """The complete epoch lines of a ``metrics.jsonl.partial`` (after its
    config line): a worker may be stopped, or still be, inside a write."""
    text = path.read_text()
    return [line for line in text.splitlines(keepends=True)[1:] if line.endswith("\n")]


def _epoch_times(metrics: Path) -> dict[tuple[int, int], float]:
    """(epoch, rank) -> the record's ``time``, from a finished run's file."""
    records = [json.loads(line) for line in metrics.open()]
    assert not metrics.with_suffix(".jsonl.partial").exists()
    return {(r["epoch"], r["rank"]): r["time"] for r in records if r["kind"] == "epoch"}
