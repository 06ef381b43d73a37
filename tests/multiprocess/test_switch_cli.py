"""A switch that dies: the one ``graphwire train --workers 2`` starts,
SIGKILLed while the run trains, ends the run within 30 s with an error
naming the switch, and no worker outlives it. (A switch of one's own,
``graphwire switch --listen``, is in tests/fullgraph/test_switch.py.)"""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil

from tests.multiprocess.cli_runs import SPEC

TRAIN = [sys.executable, "-m", "graphwire", "train", "--dataset", SPEC]
TRAIN += ["--model", "gcn", "--exchange", "switch", "--workers", "2"]
TRAIN += ["--timeout", "120", "--quiet"]


def test_a_killed_switch_ends_every_worker_with_its_name(tmp_path: Path) -> None:
    out = tmp_path / "run"
    run = subprocess.Popen(
        [*TRAIN, "--epochs", "100000", "--out", str(out)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + 120
        while not (out / "metrics.jsonl.partial").exists():  # it trains
            assert run.poll() is None, run.communicate()[1][-3000:]
            assert time.monotonic() < deadline, "no epoch streamed in 120 s"
            time.sleep(0.1)
        family = psutil.Process(run.pid).children(recursive=True)
        switches = [
            p for p in family if "graphwire.comm.switch" in " ".join(p.cmdline())
        ]
        assert len(switches) == 1
        switches[0].send_signal(signal.SIGKILL)
        killed = time.monotonic()
        _, stderr = run.communicate(timeout=60)
        took = time.monotonic() - killed
    finally:
        if run.poll() is None:
            run.kill()
            run.communicate()
    assert run.returncode not in (0, None)
    assert took < 30, took
    error = [line for line in stderr.splitlines() if "graphwire: error" in line]
    assert error and "switch" in error[0], stderr[-3000:]
    _, alive = psutil.wait_procs(
        [p for p in family if p.pid != switches[0].pid], timeout=10
    )
    assert alive == []
