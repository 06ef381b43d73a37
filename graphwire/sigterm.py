"""SIGTERM and SIGHUP as Ctrl-C.

SIGTERM is what ``timeout``, job schedulers and ``kill PID`` send, and how
``torchrun`` stops its workers (one has failed, or the agent was told to stop);
SIGHUP is what a process gets when its terminal goes (an ssh session drops, a
terminal window is closed). The default of either ends the process with no
clean-up: a half-written folder's temporary twin (``.NAME.*.tmp``) stays beside
it, rapid's presampled batches in the temporary folder, a benchmark's network
namespace. A signal that is ignored (``nohup`` ignores SIGHUP) stays ignored.
Kept apart from :mod:`graphwire.comm.launch` so that the command line can
install it without importing torch."""

from __future__ import annotations

import signal
import threading
from typing import Any

__all__ = ["STOP_SIGNALS", "interrupt_on_stop_signals", "restore_stop_signals"]

# Signals whose default ends the process with no clean-up, taken as Ctrl-C.
STOP_SIGNALS = (signal.SIGTERM, signal.SIGHUP)


def interrupt_on_stop_signals() -> None:
    """Make each of :data:`STOP_SIGNALS` raise ``KeyboardInterrupt``, as Ctrl-C does.

    It is raised in this process's main thread, so ``finally`` blocks and
    ``except`` clean-ups run. Nothing is installed off the main thread, or
    for a signal that is ignored or handled already (in Python or outside
    it)."""
    if threading.current_thread() is not threading.main_thread():
        return
    for signum in STOP_SIGNALS:
        if signal.getsignal(signum) is signal.SIG_DFL:
            signal.signal(signum, _interrupt)


def restore_stop_signals() -> None:
    """Put back the defaults that :func:`interrupt_on_stop_signals` took over.

    For each of :data:`STOP_SIGNALS` it took, once the command is done and
    nothing is left to clean up: a signal that comes while the process exits
    (``torchrun`` stops the workers still up once one has failed, maybe just
    after it ended its run) then ends it as it would have, where a
    ``KeyboardInterrupt`` raised outside the command would print a traceback
    after its one-line error."""
    if threading.current_thread() is not threading.main_thread():
        return
    for signum in STOP_SIGNALS:
        if signal.getsignal(signum) is _interrupt:
            signal.signal(signum, signal.SIG_DFL)


def _interrupt(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt(f"signal {signum}")
