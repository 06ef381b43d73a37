"""`run_workers`: the one multi-process harness (STYLE §4).

``run_workers(fn, world_size, *args)`` runs ``fn(transport, *args)`` on
``world_size`` worker processes (forked by the launcher's fork server, or
spawned for NCCL), each with a ready :class:`TorchTransport`
(its process group set up before ``fn`` and torn down after), and returns the
results by rank. It is :func:`~graphwire.comm.launch.launch_local` plus the
transport: a fresh free loopback port per call, child tracebacks re-raised in
the parent as :class:`~graphwire.comm.launch.WorkerFailed` naming the rank,
every exit code checked, stragglers killed at the timeout.

``fn`` must be a module-level function of an importable module: a child
imports it by name. Test modules collected with ``--import-mode=importlib`` are
not importable that way, so the tests' worker functions live in plain modules
beside them, such as ``tests/comm/probes.py``, imported as ``tests.comm.probes``
(pytest's ``pythonpath`` puts the repository root on ``sys.path``, which each
child is given).

Example::

    def exchange(transport: Transport, rows: int) -> dict:
        ...
        return transport.ledger.snapshot()

    snapshots = run_workers(exchange, 3, 7)   # one per rank
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import Any, TypeVar

from graphwire.comm.context import WorkerContext
from graphwire.comm.dist import TorchTransport
from graphwire.comm.launch import WorkerFailed, check_importable, launch_local

__all__ = ["WorkerFailed", "run_workers"]

T = TypeVar("T")


def run_workers(
    fn: Callable[..., T],
    world_size: int,
    *args: Any,
    timeout_s: float = 120.0,
    run_timeout_s: float | None = None,
    backend: str = "gloo",
    threads: int = 1,
) -> list[T]:
    """Run ``fn(transport, *args)`` on ``world_size`` worker processes.

    Args:
        fn: module-level ``fn(transport: TorchTransport, *args) -> T``; ``T``
            must be picklable (return ledger snapshots, lists, CPU tensors).
        world_size: number of ranks.
        *args: passed to ``fn`` on every rank.
        timeout_s: bound on each collective.
        run_timeout_s: bound on the whole run (None: ``timeout_s``;
            ``math.inf``: none).
        backend: ``"gloo"`` (CPU) or ``"nccl"``.
        threads: torch intra-op threads per worker.

    Returns:
        ``fn``'s result on each rank, by rank.

    Raises:
        WorkerFailed: a rank raised (its traceback is in the message), exited
            non-zero, was killed, or the run exceeded ``run_timeout_s``.
        TypeError: ``fn`` is not a module-level function, or ``args`` cannot
            be pickled.
    """
    # launch_local checks the function it runs, which is _with_transport:
    # name the caller's instead.
    check_importable(fn, "run_workers")
    return launch_local(
        _with_transport,
        world_size,
        fn,
        *args,
        timeout_s=timeout_s,
        run_timeout_s=timeout_s if run_timeout_s is None else run_timeout_s,
        backend=backend,
        threads=threads,
    )


def _with_transport(ctx: WorkerContext, fn: Callable[..., T], *args: Any) -> T:
    """In the child: open the transport, run ``fn``, close it."""
    transport = TorchTransport.open(ctx)
    try:
        result = fn(transport, *args)
    except BaseException:
        # The original error matters; a group broken by a dead peer may not
        # close cleanly, and the process is about to exit anyway.
        with contextlib.suppress(Exception):
            transport.close()
        raise
    transport.close()
    return result
