"""How a worker process is started: forked by the fork server, or spawned."""

from __future__ import annotations

import contextlib
import multiprocessing
import os
import signal
import threading
from collections.abc import Iterator
from multiprocessing import forkserver, get_context, reduction
from multiprocessing.context import ForkServerContext, SpawnContext
from multiprocessing.process import BaseProcess
from typing import Any

from graphwire.comm.launch.errors import not_started
from graphwire.comm.launch.watch import TERMINATE_GRACE_S

# How long the fork server may take to start one child: its first start
# waits for the server's imports (seconds, many more on a loaded machine).
FORK_START_S = 120.0
# Modules the fork server imports once, so that its children start with
# them: torch, and torch._dynamo, which torch.optim imports at its first
# optimizer; each takes seconds a process.
_PRELOAD = ["torch", "torch._dynamo", "graphwire.comm.dist"]

_STDIO = (1, 2)


def start_context(backend: str) -> ForkServerContext | SpawnContext:
    """The context children start in: the fork server under gloo, else spawn.

    Under gloo, children are forked from multiprocessing's fork server, which
    has imported :data:`_PRELOAD` (one per launching process, started at its
    first launch; single-threaded but for torch's idle thread, no process
    group); under NCCL, or where there is no fork server, spawned. A spawned
    child imports torch itself, which takes seconds, where a forked one starts
    in a fraction of one. NCCL runs are spawned so
    that no CUDA state can be forked (the server initialises none, but a
    fork after CUDA's initialisation leaves the child unable to use it);
    their start-up is small beside them. Either way a child starts with the
    launcher's environment, standard output and error, working folder and
    ``sys.path`` (:func:`~graphwire.comm.launch.child.child_main`). What is
    read as torch and its libraries load (``TORCH_CPP_LOG_LEVEL``, which
    :func:`_quiet_torch_log` sets for the server, the OpenMP and MKL
    variables) is read once, by the server, as it starts: a process's later
    changes to them do not reach its forked children. (Their threads are set
    by ``torch.set_num_threads``.)"""
    if backend == "nccl" or "forkserver" not in multiprocessing.get_all_start_methods():
        return get_context("spawn")
    context = get_context("forkserver")
    context.set_forkserver_preload(_PRELOAD)
    return context


def start_fork_server(backend: str) -> None:
    """Start now the fork server a ``backend`` run's children will be forked by.

    The children are those of :func:`~graphwire.comm.launch.launch_local`
    (:func:`start_context`; nothing if they will be spawned). Started now, its
    imports go on while the caller reads and splits its graph: it is started
    at the first launch otherwise, and the launch waits for them."""
    if isinstance(start_context(backend), ForkServerContext):
        with _quiet_torch_log():  # the server's torch reads it as it loads
            forkserver.ensure_running()


def start_worker(child: BaseProcess, rank: int, forked: bool) -> None:
    """``child.start()`` of rank ``rank``, with torch's C++ log quiet.

    The child is forked by the fork server or spawned (:func:`start_context`)."""
    with _quiet_torch_log():
        if forked:
            _start_forked(child, rank)
        else:
            _start_spawned(child, rank)


def _start_forked(child: BaseProcess, rank: int) -> None:
    """``child.start()`` under the fork server, bounded by
    :data:`FORK_START_S`: the start waits for the server to fork the child,
    which it does once its imports (:data:`_PRELOAD`) are done. A server
    that has not answered in time (stuck in them) is killed by its PID,
    which ends the start with an error; so is one still silent a moment
    after the wait is interrupted (Ctrl-C, SIGTERM). The next launch starts
    another server."""
    errors: list[BaseException] = []

    def start() -> None:
        try:
            child.start()
        except BaseException as error:  # raised below, in the caller's thread
            errors.append(error)

    thread = threading.Thread(target=start, name=f"graphwire-start-{rank}", daemon=True)
    thread.start()
    killed = False
    try:
        thread.join(FORK_START_S)
    except BaseException:  # interrupted: a start under way ends in a moment
        thread.join(TERMINATE_GRACE_S)
        raise
    finally:
        if thread.is_alive():
            _kill_fork_server()
            killed = True
            thread.join(TERMINATE_GRACE_S)
    cause = errors[0] if errors else None
    if killed:
        why = f"did not start it in {FORK_START_S:g}s (it was stopped)"
        raise not_started(rank, f"multiprocessing's fork server {why}") from cause
    if isinstance(cause, OSError | EOFError):  # the server died
        why = f"failed ({type(cause).__name__}: {cause})"
        raise not_started(rank, f"multiprocessing's fork server {why}") from cause
    if cause is not None:
        raise cause


def _start_spawned(child: BaseProcess, rank: int) -> None:
    """``child.start()`` of a spawned child: an ``OSError`` (the interpreter
    missing, file descriptors or processes exhausted) fails the launch as
    ``WorkerFailed`` naming the rank, as a forked start's does."""
    try:
        child.start()
    except OSError as error:
        raise not_started(rank, f"{type(error).__name__}: {error}") from error


def _kill_fork_server() -> None:
    """SIGKILL this process's fork server, by the PID multiprocessing keeps
    (the next ``ensure_running`` reaps it and starts another)."""
    pid = getattr(forkserver._forkserver, "_forkserver_pid", None)
    if pid is not None:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


def passed_stdio(forked: bool) -> list[_InheritedFd]:
    """The launcher's open standard output and error, for a forked child to take.

    A child of the fork server puts them in place of its own; a spawned child
    gets none, as it has them already."""
    return [_InheritedFd(fd) for fd in _STDIO if forked and _is_open(fd)]


def _is_open(fd: int) -> bool:
    try:
        os.fstat(fd)
    except OSError:
        return False
    return True


class _InheritedFd:
    """A file descriptor of the launcher that a child puts in place of its
    own of the same number (its standard output and error): a child of the
    fork server has the server's, set when the server started."""

    def __init__(self, fd: int) -> None:
        self.fd = fd

    def __reduce__(self) -> tuple[Any, ...]:
        # DupFd works only while the child is being started (its Popen
        # sends the descriptor along).
        return (_received_fd, (reduction.DupFd(self.fd), self.fd))


def _received_fd(dup: Any, fd: int) -> tuple[int, int]:
    return dup.detach(), fd


@contextlib.contextmanager
def _quiet_torch_log() -> Iterator[None]:
    """Start a child with torch's C++ log at FATAL, unless the user set
    ``TORCH_CPP_LOG_LEVEL``. c10d logs a failed join or a lost peer as
    ``[E ... socket.cpp] [c10d] ...`` with a page of C++ frames, then raises
    the same message, which the child reports (one line, naming the rank).
    The level is read when torch is imported, before the child's code runs,
    so it goes in the environment the child (or the fork server it is
    forked from, :func:`start_context`) starts with."""
    if "TORCH_CPP_LOG_LEVEL" in os.environ:
        yield
        return
    os.environ["TORCH_CPP_LOG_LEVEL"] = "FATAL"
    try:
        yield
    finally:
        os.environ.pop("TORCH_CPP_LOG_LEVEL", None)
