"""`launch_local`: run a function on N local worker processes, as torchrun would.

The parent hosts the run's rendezvous store on a fresh loopback port, as
torchrun's agent does (``TORCHELASTIC_USE_AGENT_STORE``: every rank joins it
as a client, so it outlives any of them and a survivor can still ask it whose
heartbeat stopped), starts ``world_size`` processes (forked by
multiprocessing's fork server, which has imported torch once, under gloo;
spawned under NCCL: see :func:`_start_context`), and gives each the ``torchrun``
variables (``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``, ``MASTER_ADDR=127.0.0.1``,
``MASTER_PORT``). Each child builds its
:class:`WorkerContext` from them and calls ``fn(ctx, *args)``; its return value
or its traceback comes back through a pipe.

The parent watches every child's pipe and exit sentinel, never a bare
``join()``. When a child fails (raises, exits non-zero, is killed by a signal),
the parent gives the others a moment to report what they saw (under gloo a
peer's death fails their pending collectives at once, with a
:class:`~graphwire.comm.base.TransportError`), then terminates the rest by PID
(SIGTERM, then SIGKILL after a grace period) and raises :class:`WorkerFailed`
naming the rank that failed first: when every failure is a peer's timeout
(``TransportError``) and exactly one rank never reported, that rank, which
stopped responding. Each child's collectives are bounded by ``timeout_s``;
its start, under the fork server, by :data:`FORK_START_S`; the whole run only
by ``run_timeout_s``, when given (a training run may take hours). SIGTERM
or SIGHUP ends the launcher as Ctrl-C does: under the command line (whose
handler raises ``KeyboardInterrupt``) with ``graphwire: interrupted`` and
exit 130, elsewhere with ``SystemExit(128 + signal)``.
Children also die with the parent (Linux ``PR_SET_PDEATHSIG``, or a
thread that waits for the launcher's end: :func:`die_with_parent`).

Each run gets a scratch folder (``graphwire-run-*`` in the system's temporary
folder) that the children use as theirs (``TMPDIR``, ``tempfile.tempdir``);
the parent removes it when every child has ended, so a worker that was killed
leaves none of its temporary files behind; the folder of a parent that was
killed is removed by the next (:mod:`graphwire.comm.scratch`).

A child that returns runs its ``atexit`` handlers and then ``os._exit(0)``:
the interpreter's teardown is skipped (freeing torch takes 1-2 s per process,
and a process group left open aborts it), and threads ``fn`` left running end
with the process.

``fn`` and ``args`` must be picklable: ``fn`` a module-level function of an
importable module (a script's ``__main__`` guarded by ``if __name__ ==
"__main__":`` also works).
"""

from __future__ import annotations

import atexit
import contextlib
import ctypes
import math
import multiprocessing
import os
import pickle
import select
import signal
import socket
import sys
import tempfile
import threading
import time
import traceback
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from functools import partial
from multiprocessing import connection, forkserver, get_context, reduction
from multiprocessing.context import ForkServerContext, SpawnContext
from multiprocessing.process import BaseProcess
from typing import Any, TypeVar

import psutil
import torch
import torch.distributed as dist

from graphwire.allocator import check_keep_freed_mb, keep_freed_memory
from graphwire.comm.base import JoinFailed, TransportError
from graphwire.comm.context import (
    DEFAULT_TIMEOUT_S,
    MAX_TIMEOUT_S,
    WorkerContext,
    default_backend,
)
from graphwire.comm.scratch import Scratch
from graphwire.sigterm import STOP_SIGNALS, interrupt_on_stop_signals

__all__ = [
    "WorkerFailed",
    "check_importable",
    "check_local_backend",
    "die_with_parent",
    "exit_now",
    "free_port",
    "interrupt_on_stop_signals",
    "launch_local",
    "start_fork_server",
]

T = TypeVar("T")

LOOPBACK = "127.0.0.1"
# Errors that report a bad input or setting, not a fault of graphwire's.
_USAGE_ERRORS = (ValueError, FileNotFoundError, FileExistsError)
PEER_REPORT_S = 3.0  # after a failure, how long the others get to report theirs
# (of more than two ranks, a survivor takes 2 s to see which stopped beating)
TERMINATE_GRACE_S = 2.0  # SIGTERM, then SIGKILL after this
# How long the fork server may take to start one child: its first start
# waits for the server's imports (torch: 3-10 s on a loaded machine).
FORK_START_S = 120.0


class WorkerFailed(RuntimeError):
    """A worker process of :func:`launch_local` failed, or the run timed out.

    Attributes:
        rank: the rank that failed first (a root cause is preferred over a
            peer's resulting ``TransportError``).
        exitcode: its exit code (negative: killed by that signal), or None if
            it was still running (timeout).
        failures: a one-line description of what happened to every rank that
            did not finish cleanly, by rank.
        usage: the first failure is a bad input or setting (``ValueError``,
            ``FileNotFoundError``, ``FileExistsError``), which its first line
            says in full: a command line reports that line alone.
    """

    def __init__(
        self,
        message: str,
        rank: int,
        exitcode: int | None = None,
        failures: dict[int, str] | None = None,
        usage: bool = False,
    ) -> None:
        super().__init__(message)
        self.rank = rank
        self.exitcode = exitcode
        self.failures = dict(failures or {})
        self.usage = usage

    def __reduce__(self) -> tuple[Any, ...]:
        args = (str(self), self.rank, self.exitcode, self.failures, self.usage)
        return (type(self), args)


def free_port(host: str = LOOPBACK) -> int:
    """A TCP port on ``host`` that was free a moment ago (the OS picks it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind((host, 0))
        return int(probe.getsockname()[1])


_PICKLE_ERRORS = (pickle.PicklingError, AttributeError, TypeError)


def check_importable(fn: Callable[..., Any], caller: str) -> None:
    """Refuse a ``fn`` that a spawned child cannot import by name.

    Pickling a function stores its module and qualified name only, so this is
    cheap; it fails for lambdas, nested functions and bound methods of
    unpicklable objects.

    Raises:
        TypeError: naming ``fn`` (its module and qualified name) and ``caller``.
    """
    try:
        pickle.dumps(fn, protocol=pickle.HIGHEST_PROTOCOL)
    except _PICKLE_ERRORS as error:
        name = getattr(fn, "__qualname__", None) or repr(fn)
        module = getattr(fn, "__module__", None)
        where = f"{module}.{name}" if module else name
        raise TypeError(
            f"{caller}: fn must be a module-level function of an importable "
            f"module (spawned workers import it by name), got {where}: {error}"
        ) from error


def check_local_backend(backend: str, world_size: int) -> None:
    """Refuse NCCL for ``world_size`` ranks on this machine unless it has a
    GPU for each: rank ``r`` drives ``cuda:r``, and without it each child
    would fail in ``torch.cuda.set_device``.

    Raises:
        ValueError: naming the ranks and the GPUs seen.
    """
    if backend == "nccl" and torch.cuda.device_count() < world_size:
        raise ValueError(
            f"backend: 'nccl' needs one GPU per rank, but {world_size} ranks "
            f"were asked for and {torch.cuda.device_count()} CUDA device(s) are "
            "visible; use 'gloo' on CPU"
        )


def launch_local(
    fn: Callable[..., T],
    world_size: int,
    *args: Any,
    timeout_s: float = DEFAULT_TIMEOUT_S,
    run_timeout_s: float | None = None,
    backend: str | None = None,
    threads: int = 1,
    keep_freed_mb: int = 0,
) -> list[T]:
    """Run ``fn(ctx, *args)`` on ``world_size`` local processes.

    Args:
        fn: module-level function ``fn(ctx: WorkerContext, *args) -> T``; ``T``
            must be picklable.
        world_size: number of processes (ranks ``0..world_size-1``).
        *args: passed to ``fn`` on every rank (pickled once).
        timeout_s: each child's collective (and rendezvous) timeout.
        run_timeout_s: bound on the whole run (None: none).
        backend: ``"gloo"`` or ``"nccl"``; default :func:`default_backend`
            of ``world_size`` ranks.
        threads: ``torch.set_num_threads`` in each child.
        keep_freed_mb: :func:`graphwire.allocator.keep_freed_memory` in each
            child (0: malloc left as it is).

    Returns:
        ``fn``'s return value on each rank, by rank.

    Raises:
        WorkerFailed: a child raised, exited non-zero, was killed, or the run
            took longer than ``run_timeout_s``. No child outlives this call.
        TypeError: ``fn`` or ``args`` cannot be pickled.
        ValueError: an argument is out of range, or the backend is NCCL with
            fewer GPUs than ranks.
    """
    if world_size < 1:
        raise ValueError(f"world_size: expected >= 1, got {world_size}")
    if not 0 < timeout_s <= MAX_TIMEOUT_S:
        raise ValueError(
            f"timeout_s: expected > 0 and <= {MAX_TIMEOUT_S:g}, got {timeout_s}"
        )
    if run_timeout_s is not None and not run_timeout_s > 0:
        raise ValueError(f"run_timeout_s: expected > 0 or None, got {run_timeout_s}")
    if threads < 1:
        raise ValueError(f"threads: expected >= 1, got {threads}")
    check_keep_freed_mb(keep_freed_mb)
    check_importable(fn, "launch_local")
    try:
        job = pickle.dumps((fn, args), protocol=pickle.HIGHEST_PROTOCOL)
    except _PICKLE_ERRORS as error:
        raise TypeError(f"launch_local: args must be picklable: {error}") from error
    backend = backend if backend is not None else default_backend(world_size)
    check_local_backend(backend, world_size)
    # The rendezvous store, hosted here as torchrun's agent hosts it: rank 0
    # hosting it took it down when rank 0 ended, while the others asked it
    # whose heartbeat had stopped (comm.dist._Heartbeat).
    store = dist.TCPStore(LOOPBACK, 0, is_master=True, wait_for_workers=False)
    port = store.port
    scratch = Scratch.create()
    env = {**_loopback_env(), "TMPDIR": str(scratch.path)}
    env["TORCHELASTIC_USE_AGENT_STORE"] = "True"  # join it, do not host it
    mp = _start_context(backend)
    # A spawned child has the launcher's standard output and error already.
    forked = isinstance(mp, ForkServerContext)
    stdio = [_InheritedFd(fd) for fd in _STDIO if forked and _is_open(fd)]
    run_bound = run_timeout_s or math.inf
    deadline = time.monotonic() + run_bound
    processes: list[BaseProcess] = []
    pipes: list[connection.Connection] = []
    term = _StopAsExit()
    try:
        for rank in range(world_size):
            ctx = WorkerContext(
                rank, world_size, rank, LOOPBACK, port, backend, timeout_s
            )
            reader, writer = mp.Pipe(duplex=False)
            child = mp.Process(
                target=_child_main,
                args=(
                    ctx,
                    {**os.environ, **env},
                    (threads, keep_freed_mb),
                    os.getpid(),
                    job,
                    writer,
                    stdio,
                ),
                name=f"graphwire-rank{rank}",
            )
            processes.append(child)  # stopped on the way out once started
            with _quiet_torch_log():
                if forked:
                    _start_forked(child, rank)
                else:
                    _start_spawned(child, rank)
            writer.close()  # the parent keeps only the read end: EOF on death
            pipes.append(reader)
        watch = _Watch(processes, pipes, deadline, run_bound)
        return watch.run()
    finally:
        term.hold()  # the clean-up runs to its end
        try:
            _stop(processes)
            for pipe in pipes:
                pipe.close()
            scratch.remove()
            del store  # its server stops with it
        finally:
            term.restore()


class _StopAsExit:
    """While a launcher runs, SIGTERM (what ``timeout`` and job schedulers
    send) and SIGHUP (its terminal gone) end it as Ctrl-C does: it stops its
    workers and removes its scratch folder. A Python handler installed
    before (the command line's,
    :func:`~graphwire.sigterm.interrupt_on_stop_signals`, which raises
    ``KeyboardInterrupt``) is called first, so its exception is the one that
    propagates and the caller ends as it would on Ctrl-C; if it returns, or
    the signal had its default action, ``SystemExit(128 + signal)`` is
    raised: the launcher never carries on after one. Nothing is installed
    off the main thread, or for a signal that is ignored or handled outside
    Python."""

    def __init__(self) -> None:
        self.before: dict[int, Any] = {}
        if threading.current_thread() is not threading.main_thread():
            return
        for signum in STOP_SIGNALS:
            before = signal.getsignal(signum)
            if before is None or before is signal.SIG_IGN:
                continue
            signal.signal(signum, partial(_terminate, before))
            self.before[signum] = before

    def hold(self) -> None:
        """Ignore the signals while the clean-up runs (a second one would cut
        it)."""
        for signum in self.before:
            signal.signal(signum, signal.SIG_IGN)

    def restore(self) -> None:
        for signum, before in self.before.items():
            signal.signal(signum, before)


def _terminate(before: Any, signum: int, frame: Any) -> None:
    """:class:`_StopAsExit`'s handler: ``before`` first when it is a Python
    handler (SIG_DFL is not callable), then ``SystemExit``."""
    if callable(before):
        before(signum, frame)
    raise SystemExit(128 + signum)


# Modules the fork server imports once, so that its children start with
# them: torch (2-3 s a process) and torch._dynamo, which torch.optim imports
# at its first optimizer (as long again).
_PRELOAD = ["torch", "torch._dynamo", "graphwire.comm.dist"]

_STDIO = (1, 2)


def _start_context(backend: str) -> ForkServerContext | SpawnContext:
    """How children start: under gloo, forked from multiprocessing's fork
    server, which has imported :data:`_PRELOAD` (one per launching process,
    started at its first launch; single-threaded but for torch's idle
    thread, no process group); under NCCL, or where there is no fork
    server, spawned. A spawned child imports torch itself: a run of 2 ranks
    took 3-5 s before its first line, where a forked one takes a fraction
    of a second. NCCL runs are spawned so that no CUDA state can be forked
    (the server initialises none, but a fork after CUDA's initialisation
    leaves the child unable to use it); their start-up is small beside
    them. Either way a child starts with the launcher's environment,
    standard output and error, working folder and ``sys.path``
    (:func:`_child_main`). What is read as torch and its libraries load
    (``TORCH_CPP_LOG_LEVEL``, which :func:`_quiet_torch_log` sets for the
    server, the OpenMP and MKL variables) is read once, by the server, as
    it starts: a process's later changes to them do not reach its forked
    children. (Their threads are set by ``torch.set_num_threads``.)"""
    if backend == "nccl" or "forkserver" not in multiprocessing.get_all_start_methods():
        return get_context("spawn")
    context = get_context("forkserver")
    context.set_forkserver_preload(_PRELOAD)
    return context


def start_fork_server(backend: str) -> None:
    """Start now the fork server that :func:`launch_local`'s children of a
    ``backend`` run will be forked by (:func:`_start_context`; nothing if
    they will be spawned), so that its imports go on while the caller reads
    and splits its graph: it is started at the first launch otherwise, and
    the launch waits for them."""
    if isinstance(_start_context(backend), ForkServerContext):
        with _quiet_torch_log():  # the server's torch reads it as it loads
            forkserver.ensure_running()


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
        raise _not_started(rank, f"multiprocessing's fork server {why}") from cause
    if isinstance(cause, OSError | EOFError):  # the server died
        why = f"failed ({type(cause).__name__}: {cause})"
        raise _not_started(rank, f"multiprocessing's fork server {why}") from cause
    if cause is not None:
        raise cause


def _start_spawned(child: BaseProcess, rank: int) -> None:
    """``child.start()`` of a spawned child: an ``OSError`` (the interpreter
    missing, file descriptors or processes exhausted) fails the launch as
    ``WorkerFailed`` naming the rank, as a forked start's does."""
    try:
        child.start()
    except OSError as error:
        raise _not_started(rank, f"{type(error).__name__}: {error}") from error


def _not_started(rank: int, why: str) -> WorkerFailed:
    """The error of a launch whose rank ``rank`` could not be started."""
    return WorkerFailed(f"rank {rank} could not be started: {why}", rank)


def _kill_fork_server() -> None:
    """SIGKILL this process's fork server, by the PID multiprocessing keeps
    (the next ``ensure_running`` reaps it and starts another)."""
    pid = getattr(forkserver._forkserver, "_forkserver_pid", None)
    if pid is not None:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


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


# ---------------------------------------------------------------- the child
def _child_main(
    ctx: WorkerContext,
    env: dict[str, str],
    settings: tuple[int, int],
    parent_pid: int,
    job: bytes,
    pipe: connection.Connection,
    stdio: list[tuple[int, int]],
) -> None:
    die_with_parent(parent_pid, forked_by_server=True)
    for received, fd in stdio:  # the launcher's, as a spawned child has them
        _flush_stdio()
        os.dup2(received, fd)
        if received != fd:
            os.close(received)
    os.environ.clear()  # the launcher's environment, not the fork server's
    os.environ.update(env)
    tempfile.tempdir = env["TMPDIR"]  # the run's scratch, removed by the parent
    os.environ.update(ctx.to_env())
    os.environ["LOCAL_WORLD_SIZE"] = str(ctx.world_size)
    threads, keep_freed_mb = settings
    torch.set_num_threads(threads)
    keep_freed_memory(keep_freed_mb)
    try:
        fn, args = pickle.loads(job)
        context = WorkerContext.from_env(backend=ctx.backend, timeout_s=ctx.timeout_s)
        result = fn(context, *args)
        _send(pipe, ("ok", result))
    except BaseException as error:
        report = (
            "error",
            f"{type(error).__qualname__}: {error}",
            "" if isinstance(error, JoinFailed) else traceback.format_exc(),
            isinstance(error, TransportError),
            isinstance(error, _USAGE_ERRORS),
        )
        try:
            _send(pipe, report)
        finally:
            _flush_stdio()
            # No teardown: the threads of a broken process group can block it.
            os._exit(1)
    pipe.close()
    exit_now(0)


def exit_now(code: int) -> None:
    """End this worker process with ``code`` once its work is done: atexit
    handlers (logging, multiprocessing finalizers) run as usual, but the
    interpreter's teardown is skipped. Freeing torch's modules takes 1-2 s,
    and gloo's threads can abort it (SIGABRT, "terminate called without an
    active exception") after the run has finished and written its output,
    even once the process group is destroyed: a clean run must not end as a
    failed worker (seen under ``torchrun``)."""
    atexit._run_exitfuncs()
    _flush_stdio()
    os._exit(code)


def _send(pipe: connection.Connection, message: tuple[Any, ...]) -> None:
    # Plain pickle, not the pipe's own ForkingPickler: torch registers that to
    # pass tensors as shared memory handed over by this process, which is gone
    # by the time the parent unpickles them.
    pipe.send_bytes(pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL))


def _flush_stdio() -> None:
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass


def die_with_parent(parent_pid: int, forked_by_server: bool = False) -> None:
    """Ask Linux to SIGKILL this process when its parent, ``parent_pid``,
    dies (``PR_SET_PDEATHSIG``; elsewhere, nothing); exit at once if it
    already has. A worker whose launcher was killed would otherwise go on
    alone, a stray process its peers keep waiting for.

    With ``forked_by_server``, ``parent_pid`` is the launcher, and the
    parent multiprocessing's fork server (:func:`_start_context`), which
    lives on while any of its children does: a daemon thread waits for the
    launcher's end (on a pidfd; where there is none, it checks every
    second) and then SIGKILLs this process, as the parent's death would.
    """
    if not sys.platform.startswith("linux"):
        return
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, int(signal.SIGKILL))  # 1 = PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        return
    if forked_by_server:
        _die_with(parent_pid)
    elif os.getppid() != parent_pid:  # the parent died before prctl
        os._exit(1)


def _die_with(pid: int) -> None:
    """SIGKILL this process when process ``pid`` ends (see
    :func:`die_with_parent`); exit at once if it has."""
    handle: int | None = None
    try:
        handle = os.pidfd_open(pid)
    except ProcessLookupError:
        os._exit(1)
    except (OSError, AttributeError):  # before Linux 5.3, or not Linux
        if not psutil.pid_exists(pid):
            os._exit(1)

    def watch() -> None:
        if handle is not None:
            watcher = select.poll()
            watcher.register(handle, select.POLLIN)
            watcher.poll()  # readable once it has ended
        else:
            while psutil.pid_exists(pid):
                time.sleep(1.0)
        os.kill(os.getpid(), signal.SIGKILL)

    threading.Thread(target=watch, name="graphwire-launcher", daemon=True).start()


@contextlib.contextmanager
def _quiet_torch_log() -> Iterator[None]:
    """Start a child with torch's C++ log at FATAL, unless the user set
    ``TORCH_CPP_LOG_LEVEL``. c10d logs a failed join or a lost peer as
    ``[E ... socket.cpp] [c10d] ...`` with a page of C++ frames, then raises
    the same message, which the child reports (one line, naming the rank).
    The level is read when torch is imported, before the child's code runs,
    so it goes in the environment the child (or the fork server it is
    forked from, :func:`_start_context`) starts with."""
    if "TORCH_CPP_LOG_LEVEL" in os.environ:
        yield
        return
    os.environ["TORCH_CPP_LOG_LEVEL"] = "FATAL"
    try:
        yield
    finally:
        os.environ.pop("TORCH_CPP_LOG_LEVEL", None)


def _loopback_env() -> dict[str, str]:
    """Keep gloo's connections on the loopback interface (it otherwise picks
    the interface of the host name, which may not be loopback)."""
    if "GLOO_SOCKET_IFNAME" in os.environ:
        return {}
    for name, addresses in psutil.net_if_addrs().items():
        if any(a.family == socket.AF_INET and a.address == LOOPBACK for a in addresses):
            return {"GLOO_SOCKET_IFNAME": name}
    return {}


# --------------------------------------------------------------- the parent
@dataclass
class _Failure:
    rank: int
    summary: str
    traceback: str = ""
    exitcode: int | None = None
    from_peer: bool = False  # a TransportError: most likely another rank's fault
    usage: bool = False  # a bad input or setting (_USAGE_ERRORS)


@dataclass
class _Watch:
    """Follows every child's pipe and exit sentinel until all are done, one
    fails, or the deadline passes."""

    processes: list[BaseProcess]
    pipes: list[connection.Connection]
    deadline: float
    timeout_s: float
    results: dict[int, Any] = field(default_factory=dict)
    failures: dict[int, _Failure] = field(default_factory=dict)
    exited: set[int] = field(default_factory=set)
    open_pipes: set[int] = field(default_factory=set)

    def run(self) -> list[Any]:
        world = len(self.processes)
        self.open_pipes = set(range(world))
        first_failure: float | None = None
        while len(self.exited) < world:
            now = time.monotonic()
            if first_failure is None and self.failures:
                first_failure = now
            until = self.deadline
            if first_failure is not None:
                until = min(until, first_failure + PEER_REPORT_S)
            if now >= until:
                break
            waitables: dict[Any, tuple[str, int]] = {}
            for rank in self.open_pipes:
                waitables[self.pipes[rank]] = ("pipe", rank)
            for rank, process in enumerate(self.processes):
                if rank not in self.exited:
                    waitables[process.sentinel] = ("exit", rank)
            wait_s = None if until == math.inf else until - now
            for ready in connection.wait(list(waitables), timeout=wait_s):
                kind, rank = waitables[ready]
                if kind == "pipe":
                    self._receive(rank)
                else:
                    self._reap(rank)
        if not self.failures and len(self.exited) < world:
            for rank in range(world):
                if rank not in self.exited:
                    self.failures[rank] = _Failure(
                        rank, f"did not finish within {self.timeout_s:g}s"
                    )
        if self.failures:
            raise self._error()
        return [self.results[rank] for rank in range(world)]

    def _receive(self, rank: int) -> None:
        try:
            data = self.pipes[rank].recv_bytes()
        except (EOFError, OSError):
            self.open_pipes.discard(rank)
            return
        try:
            message = pickle.loads(data)
        except Exception as error:  # e.g. the result's class cannot be imported
            self._fail(rank, f"sent a result that cannot be unpickled: {error!r}")
            return
        if message[0] == "ok":
            self.results[rank] = message[1]
        else:
            _, summary, text, from_peer, usage = message
            self._fail(rank, f"raised {summary}", text, from_peer, usage=usage)

    def _reap(self, rank: int) -> None:
        process = self.processes[rank]
        # The sentinel closes as the child's files close, a moment before the
        # kernel reports its exit status: wait for that moment.
        process.join(TERMINATE_GRACE_S)
        self.exited.add(rank)
        while rank in self.open_pipes and self.pipes[rank].poll():
            self._receive(rank)  # what it sent just before exiting
        code = process.exitcode
        if rank in self.failures:
            self.failures[rank].exitcode = code
        elif code != 0:
            self._fail(rank, _describe_exit(code), exitcode=code)
        elif rank not in self.results:
            self._fail(
                rank, "exited with code 0 without returning a result", exitcode=0
            )

    def _fail(
        self,
        rank: int,
        summary: str,
        text: str = "",
        from_peer: bool = False,
        exitcode: int | None = None,
        usage: bool = False,
    ) -> None:
        self.failures.setdefault(
            rank, _Failure(rank, summary, text, exitcode, from_peer, usage)
        )

    def _error(self) -> WorkerFailed:
        # dicts keep insertion order: the first failure seen comes first
        ordered = sorted(self.failures.values(), key=lambda f: f.from_peer)
        world = len(self.processes)
        reported = self.exited | set(self.failures) | set(self.results)
        silent = [rank for rank in range(world) if rank not in reported]
        if ordered[0].from_peer and len(silent) == 1:
            # Every failure is a peer's, and one rank never reported (hung,
            # or stopped): that is the rank they waited for.
            summary = "stopped responding: its peers timed out waiting for it"
            ordered = [_Failure(silent[0], summary), *ordered]
        first = ordered[0]
        lines = [f"rank {first.rank} {first.summary}"]
        others = {f.rank: f.summary for f in ordered[1:]}
        for rank in range(world):
            listed = rank == first.rank or rank in others
            if rank not in self.exited and rank not in self.failures and not listed:
                done = "returned, not yet exited" if rank in self.results else "running"
                others[rank] = f"{done}; stopped by the launcher"
        for rank in sorted(others):
            lines.append(f"  rank {rank}: {others[rank]}")
        if first.traceback:
            lines.append(f"--- traceback of rank {first.rank} ---")
            lines.append(first.traceback.rstrip())
        failures = {f.rank: f.summary for f in ordered} | others
        message = "\n".join(lines)
        return WorkerFailed(message, first.rank, first.exitcode, failures, first.usage)


def _describe_exit(code: int | None) -> str:
    if code is not None and code < 0:
        try:
            name = signal.Signals(-code).name
        except ValueError:
            name = f"signal {-code}"
        return f"was killed by {name} (exit code {code})"
    return f"exited with code {code}"


def _stop(processes: list[BaseProcess]) -> None:
    """Terminate every child still running (by PID), SIGKILL after a grace
    period, and reap them all."""
    alive = [p for p in processes if p.is_alive()]
    for process in alive:
        process.terminate()
    deadline = time.monotonic() + TERMINATE_GRACE_S
    for process in alive:
        process.join(max(0.0, deadline - time.monotonic()))
    for process in alive:
        if process.is_alive():
            process.kill()
            process.join(TERMINATE_GRACE_S)
    for process in processes:
        if process.exitcode is not None:
            process.close()
