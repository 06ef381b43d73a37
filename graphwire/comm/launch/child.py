"""A worker's life in the child: its set-up, its run, its report, its end."""

from __future__ import annotations

import atexit
import os
import pickle
import sys
import tempfile
import traceback
from multiprocessing import connection
from typing import Any

import torch

from graphwire.allocator import keep_freed_memory
from graphwire.comm.base import JoinFailed, TransportError
from graphwire.comm.context import WorkerContext
from graphwire.comm.launch.errors import USAGE_ERRORS
from graphwire.comm.launch.signals import die_with_parent


def child_main(
    ctx: WorkerContext,
    env: dict[str, str],
    settings: tuple[int, int],
    parent_pid: int,
    job: bytes,
    pipe: connection.Connection,
    stdio: list[tuple[int, int]],
) -> None:
    """A worker process of :func:`~graphwire.comm.launch.launch_local`.

    It takes on the launcher's environment, standard output and error
    (``stdio``: the received descriptor and its number), runs ``fn(ctx, *args)``
    of ``job``, sends its result or traceback through ``pipe`` and exits (0, or
    1 when ``fn`` raised), never outliving ``parent_pid``."""
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
        context = WorkerContext.from_env(
            backend=ctx.backend,
            timeout_s=ctx.timeout_s,
            stall_notice_s=ctx.stall_notice_s,
        )
        result = fn(context, *args)
        _send(pipe, ("ok", result))
    except BaseException as error:
        report = (
            "error",
            f"{type(error).__qualname__}: {error}",
            "" if isinstance(error, JoinFailed) else traceback.format_exc(),
            isinstance(error, TransportError),
            isinstance(error, USAGE_ERRORS),
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
    """End this worker process with ``code`` once its work is done.

    atexit handlers (logging, multiprocessing finalizers) run as usual, but the
    interpreter's teardown is skipped. Freeing torch's modules takes seconds,
    and gloo's threads can abort it (SIGABRT, "terminate called without an
    active exception") after the run has finished and written its output,
    even once the process group is destroyed: a clean run must not end as a
    failed worker."""
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
