"""A launcher in its own process, for the tests that kill or stop it: its
workers found by PID, and the scratch folder it makes."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import psutil

from tests.signals import default_stop_signals

REPO_ROOT = Path(__file__).resolve().parents[2]

# Two workers that sleep until they are stopped.
_SLEEPING = (
    "from graphwire.comm.launch import launch_local\n"
    "from tests.comm.probes import sleep_forever\n"
    "launch_local(sleep_forever, 2)\n"
)


def with_repo_on_path(env: dict[str, str]) -> dict[str, str]:
    """``env`` with the repository root first on ``PYTHONPATH``: a ``python -c``
    script and its workers import modules under ``tests`` from any working
    folder."""
    paths = [str(REPO_ROOT), env.get("PYTHONPATH", "")]
    return {**env, "PYTHONPATH": os.pathsep.join(p for p in paths if p)}


def worker_children(pid: int | None = None) -> list[psutil.Process]:
    """Worker processes started by ``pid`` (default: this process) still
    alive, in the order they were started: spawned, or forked by its fork
    server (not the server, nor multiprocessing's resource tracker, which
    outlive them by design)."""
    alive = []
    for child in psutil.Process(pid).children(recursive=True):
        try:
            if _is_worker(child):
                alive.append(child)
        except psutil.NoSuchProcess:
            pass
    return sorted(alive, key=lambda p: (p.create_time(), p.pid))


def _is_worker(process: psutil.Process) -> bool:
    if any("spawn_main" in part for part in process.cmdline()):
        return True
    parent = process.parent()  # a fork server's children share its cmdline
    return parent is not None and _is_fork_server(parent)


def _is_fork_server(process: psutil.Process) -> bool:
    return "multiprocessing.forkserver" in " ".join(process.cmdline())


@contextmanager
def sleeping_launcher(
    tmp: Path,
) -> Iterator[tuple[subprocess.Popen[bytes], list[psutil.Process]]]:
    """A launcher of two sleeping workers with ``TMPDIR=tmp``, once both
    workers run and its ``graphwire-run-*`` folder is made; killed (by its
    PID) on the way out if it still runs."""
    with sleeping_launchers([tmp]) as started:
        yield started[0]


@contextmanager
def sleeping_launchers(
    tmps: list[Path],
) -> Iterator[list[tuple[subprocess.Popen[bytes], list[psutil.Process]]]]:
    """One :func:`sleeping_launcher` per folder of ``tmps``, started at once
    (their start-up, most of their cost, overlaps)."""
    launchers = []
    for tmp in tmps:
        env = with_repo_on_path({**os.environ, "TMPDIR": str(tmp)})
        launchers.append(
            subprocess.Popen(
                [sys.executable, "-c", _SLEEPING],
                env=env,
                preexec_fn=default_stop_signals,
            )
        )
    try:
        deadline = time.monotonic() + 60
        started = []
        for launcher, tmp in zip(launchers, tmps, strict=True):
            workers: list[psutil.Process] = []
            while len(workers) < 2 or not list(tmp.glob("graphwire-run-*")):
                assert time.monotonic() < deadline, "the workers never started"
                time.sleep(0.2)
                workers = worker_children(launcher.pid)
            started.append((launcher, workers))
        yield started
    finally:
        for launcher in launchers:
            if launcher.poll() is None:
                launcher.kill()
                launcher.wait()
