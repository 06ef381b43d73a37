"""`launch_local`: run a function on N local worker processes, as torchrun would."""

from __future__ import annotations

import math
import os
import pickle
import socket
import time
from collections.abc import Callable
from multiprocessing import connection
from multiprocessing.context import ForkServerContext
from multiprocessing.process import BaseProcess
from typing import Any, TypeVar

import psutil
import torch
import torch.distributed as dist

from graphwire.allocator import check_keep_freed_mb
from graphwire.comm.context import (
    DEFAULT_STALL_NOTICE_S,
    DEFAULT_TIMEOUT_S,
    MAX_TIMEOUT_S,
    WorkerContext,
    default_backend,
)
from graphwire.comm.launch import start
from graphwire.comm.launch.child import child_main
from graphwire.comm.launch.signals import StopAsExit
from graphwire.comm.launch.watch import Watch, stop
from graphwire.comm.scratch import Scratch

T = TypeVar("T")

LOOPBACK = "127.0.0.1"


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
    """Refuse NCCL for ``world_size`` ranks unless this machine has a GPU for each.

    Rank ``r`` drives ``cuda:r``, and without it each child would fail in
    ``torch.cuda.set_device``.

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
    stall_notice_s: float = DEFAULT_STALL_NOTICE_S,
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
        stall_notice_s: how long a child's call waits before it says on
            which rank (0: never; :attr:`WorkerContext.stall_notice_s`).
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
    # The rendezvous store, hosted here as torchrun's agent hosts it, so that
    # it outlives every rank: survivors ask it whose heartbeat stopped
    # (comm.heartbeat.Heartbeat).
    store = dist.TCPStore(LOOPBACK, 0, is_master=True, wait_for_workers=False)
    port = store.port
    scratch = Scratch.create()
    env = {**_loopback_env(), "TMPDIR": str(scratch.path)}
    env["TORCHELASTIC_USE_AGENT_STORE"] = "True"  # join it, do not host it
    mp = start.start_context(backend)
    forked = isinstance(mp, ForkServerContext)
    stdio = start.passed_stdio(forked)
    run_bound = run_timeout_s or math.inf
    deadline = time.monotonic() + run_bound
    processes: list[BaseProcess] = []
    pipes: list[connection.Connection] = []
    term = StopAsExit()
    try:
        for rank in range(world_size):
            ctx = WorkerContext(
                rank,
                world_size,
                rank,
                LOOPBACK,
                port,
                backend,
                timeout_s,
                stall_notice_s,
            )
            reader, writer = mp.Pipe(duplex=False)
            child = mp.Process(
                target=child_main,
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
            start.start_worker(child, rank, forked)
            writer.close()  # the parent keeps only the read end: EOF on death
            pipes.append(reader)
        watch = Watch(processes, pipes, deadline, run_bound)
        return watch.run()
    finally:
        term.hold()  # the clean-up runs to its end
        try:
            stop(processes)
            for pipe in pipes:
                pipe.close()
            scratch.remove()
            del store  # its server stops with it
        finally:
            term.restore()


def _loopback_env() -> dict[str, str]:
    """Keep gloo's connections on the loopback interface (it otherwise picks
    the interface of the host name, which may not be loopback)."""
    if "GLOO_SOCKET_IFNAME" in os.environ:
        return {}
    for name, addresses in psutil.net_if_addrs().items():
        if any(a.family == socket.AF_INET and a.address == LOOPBACK for a in addresses):
            return {"GLOO_SOCKET_IFNAME": name}
    return {}
