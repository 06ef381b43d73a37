"""A launcher's scratch folder: a killed launcher's is removed by the next
launcher; a running one's, or one that is not a launcher's, is kept."""

from __future__ import annotations

import fcntl
import signal
import tempfile
from pathlib import Path

import psutil
import pytest

from graphwire.comm.scratch import Scratch
from tests.comm.launchers import sleeping_launcher


@pytest.fixture
def tmp_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The system's temporary folder, for this test: ``tmp_path``."""
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    return tmp_path


def test_a_killed_launchers_scratch_is_removed_by_the_next(tmp_dir: Path) -> None:
    """SIGKILL (the OOM killer) runs no clean-up: the launcher's folder, with
    what its workers wrote (rapid's presampled batches), stays until the
    next launcher starts."""
    with sleeping_launcher(tmp_dir) as (launcher, workers):
        (abandoned,) = tmp_dir.glob("graphwire-run-*")
        (abandoned / "graphwire-presample-x").mkdir()
        launcher.send_signal(signal.SIGKILL)
        launcher.wait(timeout=30)
    _, alive = psutil.wait_procs(workers, timeout=30)  # they die with it
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
