"""Stop signals in the launcher, and workers that die with their launcher."""

from __future__ import annotations

import ctypes
import os
import select
import signal
import sys
import threading
import time
from functools import partial
from typing import Any

import psutil

from graphwire.sigterm import STOP_SIGNALS


class StopAsExit:
    """SIGTERM and SIGHUP as an exit of the launcher, while it runs.

    SIGTERM (what ``timeout`` and job schedulers send) and SIGHUP (its terminal
    gone) end it as Ctrl-C does: it stops its workers and removes its scratch
    folder. A Python handler installed
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
        """Ignore the signals while the clean-up runs (a second one would cut it)."""
        for signum in self.before:
            signal.signal(signum, signal.SIG_IGN)

    def restore(self) -> None:
        for signum, before in self.before.items():
            signal.signal(signum, before)


def _terminate(before: Any, signum: int, frame: Any) -> None:
    """:class:`StopAsExit`'s handler: ``before`` first when it is a Python
    handler (SIG_DFL is not callable), then ``SystemExit``."""
    if callable(before):
        before(signum, frame)
    raise SystemExit(128 + signum)


def die_with_parent(parent_pid: int, forked_by_server: bool = False) -> None:
    """Ask Linux to SIGKILL this process when its parent, ``parent_pid``, dies.

    It uses ``PR_SET_PDEATHSIG`` (elsewhere it does nothing) and exits at once
    if the parent has died already. A worker whose launcher was killed would
    otherwise go on alone, a stray process its peers keep waiting for.

    With ``forked_by_server``, ``parent_pid`` is the launcher, and the
    parent multiprocessing's fork server
    (:func:`~graphwire.comm.launch.start.start_context`), which lives on
    while any of its children does: a daemon thread waits for the
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
