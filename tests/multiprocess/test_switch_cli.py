"""``--exchange switch`` as users run it: a switch of their own, and one that dies.

- ``graphwire switch --listen 127.0.0.1:0`` (the torchrun recipe) serves a
  2-worker ``graphwire train --switch-addr`` run and exits 0 when it ends;
- the switch that ``graphwire train --workers 2`` starts, SIGKILLed while
  the run trains, ends the run within 30 s with an error naming the switch,
  and no worker outlives it.
"""

from __future__ import annotations

import json
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


def test_a_switch_of_ones_own_serves_a_run_and_leaves_with_it(tmp_path: Path) -> None:
    switch = subprocess.Popen(
        [sys.executable, "-m", "graphwire", "switch", "--listen", "127.0.0.1:0"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert switch.stdout is not None
        line = switch.stdout.readline()
        assert line.startswith("graphwire switch: listening on 127.0.0.1:"), line
        address = line.rsplit(" ", 1)[1].strip()
        run = subprocess.run(
            [*TRAIN, "--epochs", "2", "--switch-addr", address, "--switch-mb", "0.01"]
            + ["--out", str(tmp_path / "run")],
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert run.returncode == 0, run.stderr[-3000:]
        assert switch.wait(timeout=30) == 0, (
            switch.stderr.read() if switch.stderr else ""
        )
    finally:
        if switch.poll() is None:
            switch.kill()
            switch.communicate()
    records = [
        json.loads(line)
        for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()
    ]
    epochs = [r for r in records if r.get("kind") == "epoch" and r["rank"] == 0]
    assert len(epochs) == 2
    report = epochs[-1]["extra"]["switch"]
    assert min(report["up"]) > 0 and min(report["down"]) > 0
    assert report["core"]["aggregated"] > 0


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
