"""For tests that stop a child process with SIGTERM or SIGHUP."""

from __future__ import annotations

import signal

from graphwire.sigterm import STOP_SIGNALS

__all__ = ["default_stop_signals"]


def default_stop_signals() -> None:
    """A ``preexec_fn``: the child starts with SIGTERM and SIGHUP unblocked
    and at their defaults, whatever this process has (``nohup`` ignores
    SIGHUP; a child inherits an ignored signal, and graphwire then leaves it
    ignored)."""
    signal.pthread_sigmask(signal.SIG_UNBLOCK, set(STOP_SIGNALS))
    for signum in STOP_SIGNALS:
        signal.signal(signum, signal.SIG_DFL)
