"""launch_local / run_workers failure handling: tracebacks come back with the
rank named, a SIGKILLed worker ends the run promptly, nothing is left running.

Times are asserted only as generous bounds (correctness: no hang), never as
speed; each run starts real processes (forked by the fork server, which
imported torch once).
"""

from __future__ import annotations

import errno
import math
import multiprocessing
import multiprocessing.util
import os
import re
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest
import torch

from graphwire.comm.launch import LOOPBACK, WorkerFailed, free_port, launch_local, start
from graphwire.testing import run_workers
from tests.comm.launchers import (
    with_repo_on_path,
    worker_children,
)
from tests.comm.probes import (
    backend_of,
    hang_on_rank,
    join_nowhere,
    kill_on_rank,
    leave_and_kill,
    quick_steps,
    raise_on_rank,
    sleep_forever,
)


def test_raising_worker_is_reported_with_rank_and_traceback() -> None:
    start = time.monotonic()
    with pytest.raises(WorkerFailed) as caught:
        run_workers(raise_on_rank, 2, 1, timeout_s=60)
    elapsed = time.monotonic() - start
    error = caught.value
    assert error.rank == 1 and error.exitcode == 1
    assert error.usage  # a ValueError: a command line prints its first line
    message = str(error)
    assert message.startswith("rank 1 raised ValueError: probe failure on rank 1")
    assert "--- traceback of rank 1 ---" in message
    assert "probes.py" in message and "in raise_on_rank" in message
    assert 0 in error.failures  # the peer stuck in the barrier is accounted for
    assert elapsed < 30, f"took {elapsed:.1f}s"
    assert worker_children() == []


def test_ranks_that_cannot_join_are_named_in_a_line_without_traceback(
    capfd: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A join that fails (here: no store at the address; also a --timeout
    too short for the ranks to start) used to end in a page of traceback
    through torch's rendezvous; the message names where and within what.
    torch's C++ log of the same failure (c10d's ``[E ...] [c10d]`` lines and
    their C++ frames) stays out of the children's stderr."""
    monkeypatch.delenv("TORCH_CPP_LOG_LEVEL", raising=False)
    # A port this test holds bound but never listens on: connecting to it is
    # refused, and no other process can take it meanwhile (a port that was
    # merely free a moment ago could be taken by a store of a test running
    # beside this one, under pytest-xdist).
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as held:
        held.bind((LOOPBACK, 0))
        port = held.getsockname()[1]
        with pytest.raises(WorkerFailed) as caught:
            launch_local(join_nowhere, 2, port, 0.5, timeout_s=60)
    err = capfd.readouterr().err
    assert "[c10d]" not in err and "frame #" not in err, err
    assert "TORCH_CPP_LOG_LEVEL" not in os.environ  # the parent's is as it was
    message = str(caught.value)
    first = message.splitlines()[0]
    assert first.startswith(f"rank {caught.value.rank} raised JoinFailed: "), first
    assert f"joining 2 ranks at tcp://127.0.0.1:{port} (gloo) failed within " in first
    assert "the timeout of 0.5 s: " in first
    assert "Traceback" not in message and "traceback of rank" not in message


def test_sigkilled_worker_ends_the_run_promptly(tmp_path: Path) -> None:
    note = tmp_path / "folders.txt"
    start = time.monotonic()
    with pytest.raises(WorkerFailed) as caught:
        run_workers(kill_on_rank, 3, 2, str(note), timeout_s=120)
    elapsed = time.monotonic() - start
    error = caught.value
    assert error.rank == 2 and error.exitcode == -9
    assert not error.usage
    assert str(error).startswith("rank 2 was killed by SIGKILL (exit code -9)")
    # gloo fails the survivors' pending all-to-all at once ("Connection closed
    # by peer", naming an address); they report it as a TransportError naming
    # the rank that stopped beating (under torchrun on several nodes, no
    # launcher of theirs knows it), and exit non-zero.
    for rank in (0, 1):
        assert error.failures[rank].startswith("raised TransportError: rank "), (
            error.failures
        )
        assert "(doomed): all_to_all" in error.failures[rank]
        assert "failed: rank 2 stopped beating (died," in error.failures[rank]
    assert elapsed < 30, f"took {elapsed:.1f}s"
    assert worker_children() == []
    # Every rank's temporary folder was in the run's scratch, now removed.
    folders = [Path(line) for line in note.read_text().split()]
    assert len(folders) == 3
    for folder in folders:
        assert folder.parent.name.startswith("graphwire-run-"), folder
        assert not folder.parent.exists(), folder


def test_survivors_name_the_lost_ranks_after_rank_0_has_ended() -> None:
    """Rank 0 hosted the rendezvous store, so once it had ended (first to
    fail, first to exit: on a loaded machine, often) the others could no
    longer ask whose heartbeat stopped, and said only gloo's words. The
    launcher hosts it now, as torchrun's agent does."""
    with pytest.raises(WorkerFailed) as caught:
        run_workers(leave_and_kill, 4, 3, timeout_s=120)
    # Each survivor fails in the barrier or in the all-to-all after it, or
    # is still waiting when the launcher stops it; one that reports names.
    failures = caught.value.failures
    named = r"failed: (rank 0|ranks 0, 3) stopped beating \(died,"
    assert any(re.search(named, failures[rank]) for rank in (1, 2)), failures


def test_of_two_ranks_the_survivor_names_the_one_that_died() -> None:
    """Under torchrun no launcher names the rank another node lost, so the
    survivor's own error must: gloo's names an address, but of two ranks the
    peer is the other one."""
    with pytest.raises(WorkerFailed) as caught:
        run_workers(kill_on_rank, 2, 1, timeout_s=120)
    survivor = caught.value.failures[0]
    named = r"rank 0 \(doomed\): all_to_all( \(split check\))? with rank 1 failed: "
    assert re.search(named, survivor), survivor


def test_timeout_kills_a_hung_run() -> None:
    start = time.monotonic()
    with pytest.raises(WorkerFailed, match=r"rank 0 did not finish within 1s"):
        launch_local(sleep_forever, 1, run_timeout_s=1)
    elapsed = time.monotonic() - start
    assert elapsed < 20, f"took {elapsed:.1f}s"
    assert worker_children() == []


def test_the_collective_timeout_does_not_bound_the_run() -> None:
    """``timeout_s`` bounds each collective, not the run: a run longer than it
    whose collectives are quick finishes (a training run may take hours)."""
    start = time.monotonic()
    steps = run_workers(quick_steps, 2, 12, 0.5, timeout_s=4, run_timeout_s=math.inf)
    assert steps == [12, 12]
    assert time.monotonic() - start > 6  # longer than the timeout, well past it


def test_a_hung_worker_is_named_when_its_peers_time_out() -> None:
    """Rank 1 hangs outside any collective; rank 0 times out waiting for it.
    The error names rank 1, not the peer that reported the timeout."""
    start = time.monotonic()
    with pytest.raises(WorkerFailed) as caught:
        run_workers(hang_on_rank, 2, 1, timeout_s=5, run_timeout_s=math.inf)
    elapsed = time.monotonic() - start
    error = caught.value
    assert error.rank == 1 and error.exitcode is None
    assert str(error).startswith("rank 1 stopped responding: its peers timed out")
    assert error.failures[0].startswith("raised TransportError")
    assert elapsed < 40, f"took {elapsed:.1f}s"
    assert worker_children() == []


def test_unpicklable_function_fails_before_spawning() -> None:
    # The message names the caller's function, not run_workers' own wrapper.
    with pytest.raises(TypeError) as raised:
        run_workers(lambda transport: None, 2)
    message = str(raised.value)
    assert message.startswith("run_workers: fn must be a module-level function")
    assert f"got {__name__}.test_unpicklable_function_fails_before_spawning." in message
    assert "<lambda>" in message and "_with_transport" not in message
    with pytest.raises(TypeError, match=r"launch_local: args must be picklable: "):
        launch_local(sleep_forever, 2, threading.Lock())
    assert worker_children() == []


def test_invalid_arguments() -> None:
    with pytest.raises(ValueError, match="world_size"):
        launch_local(sleep_forever, 0)
    with pytest.raises(ValueError, match="timeout_s"):
        launch_local(sleep_forever, 1, timeout_s=0)
    with pytest.raises(ValueError, match="timeout_s"):
        launch_local(sleep_forever, 1, timeout_s=float("inf"))
    with pytest.raises(ValueError, match="run_timeout_s"):
        launch_local(sleep_forever, 1, run_timeout_s=-1)


def test_nccl_without_a_gpu_per_rank_fails_before_spawning() -> None:
    """Each child failed in torch.cuda.set_device (on a CPU-only torch:
    "module 'torch._C' has no attribute '_cuda_setDevice'")."""
    ranks = torch.cuda.device_count() + 1
    with pytest.raises(ValueError, match=f"'nccl' needs one GPU per rank, but {ranks}"):
        run_workers(sleep_forever, ranks, backend="nccl")
    assert worker_children() == []


def test_ranks_beyond_the_gpus_default_to_gloo(monkeypatch: pytest.MonkeyPatch) -> None:
    """On a one-GPU machine two workers used to be refused (NCCL by default,
    which needs a GPU per rank); they run over gloo instead, and NCCL asked
    for by name is still refused."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    assert launch_local(backend_of, 2, timeout_s=60) == ["gloo", "gloo"]
    with pytest.raises(ValueError, match="'nccl' needs one GPU per rank, but 2"):
        launch_local(backend_of, 2, backend="nccl")


def test_free_port_is_a_loopback_port() -> None:
    assert 0 < free_port() < 65536


# The launcher's first launch starts its fork server with another
# environment, folder and standard output and error than its second has.
_TWO_LAUNCHES = """
import multiprocessing, os, sys
import graphwire.comm.launch.start
from graphwire.comm.launch import launch_local
from tests.comm.probes import what_a_child_sees

name, first, later, how = sys.argv[1:]
if how == "spawn":  # as under NCCL
    spawn = multiprocessing.get_context("spawn")
    graphwire.comm.launch.start.start_context = lambda backend: spawn
saved = os.dup(1), os.dup(2)
with open(os.path.join(first, "output"), "w") as elsewhere:
    os.dup2(elsewhere.fileno(), 1)
    os.dup2(elsewhere.fileno(), 2)
    os.chdir(first)
    launch_local(what_a_child_sees, 1, name)
    os.dup2(saved[0], 1)
    os.dup2(saved[1], 2)
os.environ[name] = "set after the first launch"
os.chdir(later)
print("seen", launch_local(what_a_child_sees, 2, name), flush=True)
"""


def test_a_child_has_the_launchers_environment_folder_and_output(
    tmp_path: Path,
) -> None:
    """As a spawned child had them at its start, though the fork server its
    child is forked from started at the launcher's first launch, with
    another environment, folder and standard output and error. (A spawned
    child closed its standard output and error: they were 'passed along'
    onto themselves.) Both start methods, at once."""
    name = "GRAPHWIRE_TEST_LAUNCH_VARIABLE"
    env = with_repo_on_path({k: v for k, v in os.environ.items() if k != name})
    runs = {}
    for how in ("forkserver", "spawn"):
        first, later = tmp_path / how / "first", tmp_path / how / "later"
        first.mkdir(parents=True)
        later.mkdir()
        script = [sys.executable, "-c", _TWO_LAUNCHES, name, str(first), str(later)]
        runs[how] = subprocess.Popen(
            [*script, how],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
        )
    try:
        done = {how: run.communicate(timeout=120) for how, run in runs.items()}
    finally:
        for run in runs.values():
            if run.poll() is None:
                run.kill()
                run.communicate()
    for how, (stdout, stderr) in done.items():
        assert runs[how].returncode == 0, (how, stderr[-3000:])
        later = tmp_path / how / "later"
        seen = [("set after the first launch", str(later))] * 2
        assert f"seen {seen}" in stdout, (how, stdout)
        for rank in range(2):
            assert f"rank {rank} on its standard output" in stdout, how
            assert f"rank {rank} on its standard error" in stderr, how
        assert "rank 1" not in (tmp_path / how / "first" / "output").read_text()


# A launcher whose fork server imports only a module that exits (the server
# dies), then only one that hangs (the server never answers); then a launch
# with the usual imports.
_BROKEN_SERVERS = """
import time
import psutil
from multiprocessing import forkserver
import graphwire.comm.launch as launch
import graphwire.comm.launch.start as launch_start
from tests.comm.probes import backend_of
usual = launch_start._PRELOAD
launch_start.FORK_START_S = 1.0
for module in ("server_exits", "server_hangs"):
    launch_start._PRELOAD = [module]
    start = time.monotonic()
    try:
        launch.launch_local(backend_of, 2)
    except launch.WorkerFailed as error:
        print(module, "after", round(time.monotonic() - start), "s:", error, flush=True)
    pid = forkserver._forkserver._forkserver_pid
    gone = not psutil.pid_exists(pid) or psutil.Process(pid).status() == "zombie"
    print(module, "server gone:", gone, flush=True)
launch_start._PRELOAD, launch_start.FORK_START_S = usual, 120.0
print("then:", launch.launch_local(backend_of, 2), flush=True)
"""


def test_a_fork_server_that_never_starts_a_child_fails_the_launch_promptly(
    tmp_path: Path,
) -> None:
    """The start of a forked child waits on the fork server: one that died is
    reported at once, one stuck in its imports is stopped after
    FORK_START_S; either way the launch names the rank, and the next launch
    starts another server."""
    (tmp_path / "server_exits.py").write_text("import os\nos._exit(3)\n")
    (tmp_path / "server_hangs.py").write_text("import time\ntime.sleep(600)\n")
    # found through PYTHONPATH: the server does not take the launcher's sys.path
    env = with_repo_on_path({**os.environ, "PYTHONPATH": str(tmp_path)})
    done = subprocess.run(
        [sys.executable, "-c", _BROKEN_SERVERS],
        capture_output=True,
        text=True,
        env=env,
        timeout=180,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    out = done.stdout
    failed = "rank 0 could not be started: multiprocessing's fork server"
    # EOFError, or ConnectionRefusedError if it died before the launcher called
    died = re.search(rf"server_exits after (\d+) s: {failed} failed \(\w+Error", out)
    assert died is not None and int(died.group(1)) < 30, out
    stuck = rf"server_hangs after (\d+) s: {failed} did not start it in 1s"
    hung = re.search(stuck, out)
    assert hung is not None and 1 <= int(hung.group(1)) < 60, out
    assert "server_exits server gone: True" in out, out
    assert "server_hangs server gone: True" in out, out
    assert "then: ['gloo', 'gloo']" in out, out


def test_a_spawned_child_that_cannot_start_fails_the_launch_naming_its_rank(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A spawned child (NCCL's way of starting) whose start fails in the OS,
    here rank 1's fork refused (EAGAIN: out of processes), ends the launch
    with WorkerFailed naming the rank, and rank 0, already started, is
    stopped (the OSError used to propagate bare)."""
    monkeypatch.setattr(
        start, "start_context", lambda backend: multiprocessing.get_context("spawn")
    )
    spawnv_passfds = multiprocessing.util.spawnv_passfds
    children: list[int] = []

    def refuse_the_second_child(path: bytes, args: list[Any], passfds: Any) -> int:
        if any("spawn_main" in os.fsdecode(arg) for arg in args):  # no tracker
            if children:
                raise OSError(errno.EAGAIN, os.strerror(errno.EAGAIN))
            children.append(0)
        return int(spawnv_passfds(path, args, passfds))

    monkeypatch.setattr(multiprocessing.util, "spawnv_passfds", refuse_the_second_child)
    with pytest.raises(WorkerFailed, match="rank 1 could not be started: ") as failed:
        launch_local(backend_of, 2, timeout_s=60)
    assert failed.value.rank == 1
    assert "Resource temporarily unavailable" in str(failed.value)
    assert isinstance(failed.value.__cause__, BlockingIOError)
    assert worker_children() == []
