"""The local launcher: run a function on N worker processes, as torchrun would.

The parent hosts the run's rendezvous store on a fresh loopback port, as
torchrun's agent does (``TORCHELASTIC_USE_AGENT_STORE``: every rank joins it
as a client, so it outlives any of them and a survivor can still ask it whose
heartbeat stopped), starts ``world_size`` processes (forked by
multiprocessing's fork server, which has imported torch once, under gloo;
spawned under NCCL: see :func:`.start.start_context`), and gives each the ``torchrun``
variables (``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``, ``MASTER_ADDR=127.0.0.1``,
``MASTER_PORT``). Each child builds its
:class:`~graphwire.comm.context.WorkerContext` from them and calls
``fn(ctx, *args)``; its return value or its traceback comes back through a
pipe.

The parent watches every child's pipe and exit sentinel, never a bare
``join()``. When a child fails (raises, exits non-zero, is killed by a signal),
the parent gives the others a moment to report what they saw (under gloo a
peer's death fails their pending collectives at once, with a
:class:`~graphwire.comm.base.TransportError`), then terminates the rest by PID
(SIGTERM, then SIGKILL after a grace period) and raises :class:`WorkerFailed`
naming the rank that failed first: when every failure is a peer's timeout
(``TransportError``) and exactly one rank never reported, that rank, which
stopped responding. Each child's collectives are bounded by ``timeout_s``;
its start, under the fork server, by :data:`.start.FORK_START_S`; the whole run only
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
the interpreter's teardown is skipped (freeing torch takes seconds a process,
and a process group left open aborts it), and threads ``fn`` left running end
with the process.

``fn`` and ``args`` must be picklable: ``fn`` a module-level function of an
importable module (a script's ``__main__`` guarded by ``if __name__ ==
"__main__":`` also works).

Modules: :mod:`.local` (:func:`launch_local` and its checks), :mod:`.start`
(the fork server, or spawn), :mod:`.child` (a worker's set-up, run and
report), :mod:`.watch` (results, failures, stopping the workers),
:mod:`.signals` (stop signals, dying with the launcher), :mod:`.errors`.

``torch.distributed.elastic`` is not used; only its protocol is kept (the
``torchrun`` variables, the agent's store). Its ``start_processes`` can fork
from the fork server too, but starts every worker in one unbounded call (a
server stuck in its imports hangs the launch), then polls them and reports
the first that exited non-zero: the others get no moment to report, and a
root cause is not told from a peer's ``TransportError``, so the rank that
stopped responding goes unnamed. Its workers' death signal follows their
parent, which under the fork server is the server, not the launcher, and
they write to the server's standard output unless sent to files. It
replaces the caller's SIGTERM, SIGINT and SIGHUP handlers for good, so the
command line's Ctrl-C exit (130) is lost. Its ``create_c10d_store`` picks a
port by binding ``localhost`` and retries, where a ``TCPStore`` on port 0
of 127.0.0.1 has the OS choose one.
"""

from graphwire.comm.launch.child import exit_now
from graphwire.comm.launch.errors import WorkerFailed
from graphwire.comm.launch.local import (
    LOOPBACK,
    check_importable,
    check_local_backend,
    free_port,
    launch_local,
)
from graphwire.comm.launch.signals import die_with_parent
from graphwire.comm.launch.start import start_fork_server
from graphwire.sigterm import interrupt_on_stop_signals

__all__ = [
    "LOOPBACK",
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
