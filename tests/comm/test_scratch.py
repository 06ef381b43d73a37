"""A launcher's scratch folder: a stopped launcher removes its own, a killed
launcher's is removed by the next; a running one's, or one that is not a
launcher's, is kept."""

from __future__ import annotations

import fcntl
import signal
import tempfile
import time
from pathlib import Path

import psutil
import pytest

from graphwire.comm.scratch import Scratch
from graphwire.sigterm import STOP_SIGNALS
from tests.comm.launchers import sleeping_launchers


@pytest.fixture
def tmp_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The system's temporary folder, for this test: ``tmp_path``."""
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    return tmp_path


def test_a_stopped_launcher_removes_its_scratch_and_a_killed_ones_the_next(
    tmp_dir: Path,
) -> None:
    """SIGTERM (``timeout``, a job scheduler) or SIGHUP (the terminal closed)
    ends a launcher as Ctrl-C does: its workers stopped by PID, its
    ``graphwire-run-*`` folder removed. SIGKILL (the OOM killer) runs no
    clean-up: the folder, with what its workers wrote (rapid's presampled
    batches), stays until the next launcher starts. One launcher per signal,
    at once."""
    stopped = [tmp_dir / stop.name for stop in STOP_SIGNALS]
    for folder in stopped:
        folder.mkdir()
    with sleeping_launchers([*stopped, tmp_dir]) as started:
        *stopping, (killed, killed_workers) = started
        (abandoned,) = tmp_dir.glob("graphwire-run-*")
        (abandoned / "graphwire-presample-x").mkdir()
        time.sleep(1.0)  # let the launchers reach their watch loops
        for stop, (launcher, _) in zip(STOP_SIGNALS, stopping, strict=True):
            launcher.send_signal(stop)
        killed.send_signal(signal.SIGKILL)
        for stop, (launcher, _) in zip(STOP_SIGNALS, stopping, strict=True):
            assert launcher.wait(timeout=30) == 128 + stop, stop.name
        killed.wait(timeout=30)
    for folder, (_, workers) in zip(stopped, stopping, strict=True):
        _, alive = psutil.wait_procs(workers, timeout=10)
        assert alive == []
        assert list(folder.glob("graphwire-run-*")) == []
    _, alive = psutil.wait_procs(killed_workers, timeout=30)  # they die with it
    assert alive == []
    assert abandoned.is_dir()
    scratch = Scratch.create()
    try:
        assert not abandoned.exists()
        assert list(tmp_dir.glob("graphwire-run-*")) == [scratch.path]
    finally:
        scratch.remove()
    assert list(tmp_dir.glob("graphwire-run-*")) == []


def test_a_running_launchers_scratch_and_others_are_kept(tmp_dir: Path) -> None:
    running = Scratch.create()
    held = tmp_dir / "graphwire-run-held"  # locked by another open file
    held.mkdir()
    lock = open(held / ".lock", "w")  # noqa: SIM115 - closed below
    fcntl.flock(lock, fcntl.LOCK_EX)
    unlocked = tmp_dir / "graphwire-run-older"  # no .lock: not ours to judge
    unlocked.mkdir()
    other = tmp_dir / "someone-else"
    (other / ".lock").parent.mkdir()
    (other / ".lock").touch()
    try:
        Scratch.create().remove()
        assert running.path.is_dir() and held.is_dir()
        assert unlocked.is_dir() and other.is_dir()
    finally:
        lock.close()
        running.remove()
    Scratch.create().remove()  # its lock is free now
    assert not held.exists() and unlocked.is_dir()


def test_a_prefix_sweeps_only_its_own_kind(tmp_dir: Path) -> None:
    """A torchrun worker's presample folder (``graphwire-presample-*``) is
    locked the same way; each kind sweeps only its own."""
    abandoned = {}
    for prefix in ("graphwire-run-", "graphwire-presample-"):
        scratch = Scratch.create(prefix)
        assert scratch._lock is not None
        scratch._lock.close()  # as if its process were SIGKILLed
        abandoned[prefix] = scratch.path
    Scratch.create("graphwire-presample-").remove()
    assert not abandoned["graphwire-presample-"].exists()
    assert abandoned["graphwire-run-"].is_dir()
