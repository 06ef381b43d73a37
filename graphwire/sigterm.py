"""SIGTERM as Ctrl-C: what ``timeout``, job schedulers and ``kill PID`` send,
and how ``torchrun`` stops its workers (one has failed, or the agent was told
to stop). Its default ends the process with no clean-up: a half-written
folder's temporary twin (``.NAME.*.tmp``) stayed beside it, rapid's
presampled batches in the temporary folder, a benchmark's network namespace.
Kept apart from :mod:`graphwire.comm.launch` so that the command line can
install it without importing torch."""

from __future__ import annotations

import signal
import threading
from typing import Any

__all__ = ["interrupt_on_sigterm"]


def interrupt_on_sigterm() -> None:
    """Make SIGTERM raise ``KeyboardInterrupt`` in this process's main
    thread, as Ctrl-C does, so ``finally`` blocks and ``except`` clean-ups
    run. Nothing is installed off the main thread, or where SIGTERM is
    ignored or handled already (in Python or outside it)."""
    if threading.current_thread() is not threading.main_thread():
        return
    if signal.getsignal(signal.SIGTERM) is not signal.SIG_DFL:
        return

    def interrupt(signum: int, frame: Any) -> None:
        raise KeyboardInterrupt(f"signal {signum}")

    signal.signal(signal.SIGTERM, interrupt)
