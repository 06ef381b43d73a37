"""Running ``graphwire train`` with workers, spawned or under torchrun, in a
process of its own, and reading the summary and metrics it leaves."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

SPEC = "synthetic:products?nodes=2000&degree=8&features=16&classes=4&seed=3"


def _run(argv: list[str]) -> dict[str, str]:
    done = subprocess.run(argv, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    return _summary(done.stdout)


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
        text = path.read_text()
    except FileNotFoundError:
        return 0
    return sum(1 for line in text.splitlines(keepends=True)[1:] if line.endswith("\n"))


def _epoch_times(metrics: Path) -> dict[tuple[int, int], float]:
    """(epoch, rank) -> the record's ``time``, from a finished run's file."""
    records = [json.loads(line) for line in metrics.open()]
    assert not metrics.with_suffix(".jsonl.partial").exists()
    return {(r["epoch"], r["rank"]): r["time"] for r in records if r["kind"] == "epoch"}
