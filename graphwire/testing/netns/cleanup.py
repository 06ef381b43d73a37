"""Removing the namespaces this process made, whatever ends it.

A :class:`~graphwire.testing.netns.ShapedNetwork` is live from just before
``ip netns add`` until its namespace is deleted; this module holds the live
names, kills what runs inside a namespace and deletes it, makes SIGTERM and
SIGHUP interrupt (rather than end the process with no clean-up) while any
namespace is live, and deletes at exit what was never closed.
"""

from __future__ import annotations

import atexit
import os
import shutil
import signal
import subprocess
import threading
import time
from collections.abc import Sequence
from typing import Any

from graphwire.sigterm import STOP_SIGNALS, interrupt_on_stop_signals

__all__ = [
    "LIVE",
    "delete_namespace",
    "find_tool",
    "hold_stop_signals",
    "kill_namespace",
    "namespace_pids",
    "register_atexit",
    "release_stop_signals",
    "run_or_raise",
]

LIVE: set[str] = set()  # namespaces made by this process and not yet deleted
_ATEXIT_REGISTERED = False
_HELD: dict[int, Any] = {}  # signal -> what hold_stop_signals installed


def find_tool(name: str) -> str:
    """The path of the program ``name``; RuntimeError if it is not on PATH."""
    path = shutil.which(name)
    if path is None:
        raise RuntimeError(f"`{name}` not found on PATH (install iproute2)")
    return path


def run_or_raise(argv: Sequence[str]) -> str:
    """The stdout of ``argv``; RuntimeError naming it if it exits non-zero."""
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=30)
    if proc.returncode != 0:
        raise RuntimeError(
            f"`{' '.join(argv)}` exited {proc.returncode}: {proc.stderr.strip()}"
        )
    return proc.stdout


def namespace_pids(name: str, ip: str) -> list[int]:
    """PIDs of the processes now in namespace ``name``."""
    proc = subprocess.run(
        [ip, "netns", "pids", name], capture_output=True, text=True, timeout=30
    )
    return [int(p) for p in proc.stdout.split()]


def _signal(pid: int, sig: signal.Signals) -> None:
    try:
        os.kill(pid, sig)
    except ProcessLookupError:
        pass


def kill_namespace(
    name: str, ip: str, procs: Sequence[subprocess.Popen[Any]], grace_s: float
) -> None:
    """SIGTERM every process in the namespace, SIGKILL survivors; reap ours."""
    mine = [p for p in procs if p.poll() is None]
    pids = set(namespace_pids(name, ip)) | {p.pid for p in mine}
    for pid in pids:
        _signal(pid, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    try:
        while pids and time.monotonic() < deadline:
            time.sleep(0.02)
            for p in mine:
                p.poll()  # reap, so an exited child leaves the namespace
            pids = set(namespace_pids(name, ip)) & pids
    finally:  # a Ctrl-C in the grace period cuts it short, not the SIGKILL
        for pid in pids | set(namespace_pids(name, ip)):
            _signal(pid, signal.SIGKILL)
        for p in mine:
            p.wait()


def delete_namespace(name: str, ip: str) -> None:
    """Delete namespace ``name``; one that does not exist is already gone.

    It may not exist when an interrupt came before ``ip netns add`` made it."""
    try:
        run_or_raise([ip, "netns", "del", name])
    except RuntimeError:
        if name in run_or_raise([ip, "netns", "list"]).split():
            raise
    LIVE.discard(name)


def hold_stop_signals() -> None:
    """Make SIGTERM and SIGHUP interrupt until :func:`release_stop_signals`.

    Each signal is taken over as
    :func:`graphwire.sigterm.interrupt_on_stop_signals` does, where it has its
    default (which deletes no namespace) and this is the main thread; else it
    is left be."""
    if _HELD:
        return
    before = {signum: signal.getsignal(signum) for signum in STOP_SIGNALS}
    interrupt_on_stop_signals()
    for signum, handler in before.items():
        if handler is signal.SIG_DFL:
            installed = signal.getsignal(signum)
            if installed is not signal.SIG_DFL:
                _HELD[signum] = installed


def release_stop_signals() -> None:
    """Put the stop signals' defaults back once no namespace is live.

    Only for each signal whose handler is still the one
    :func:`hold_stop_signals` installed."""
    if LIVE or not _HELD:
        return
    if threading.current_thread() is not threading.main_thread():
        return  # signal.signal works only there; a later release may
    for signum, handler in _HELD.items():
        if signal.getsignal(signum) is handler:
            signal.signal(signum, signal.SIG_DFL)
    _HELD.clear()


def register_atexit() -> None:
    """Delete at exit, once, the namespaces still live then."""
    global _ATEXIT_REGISTERED
    if not _ATEXIT_REGISTERED:
        atexit.register(_cleanup_at_exit)
        _ATEXIT_REGISTERED = True


def _cleanup_at_exit() -> None:
    """Safety net for namespaces left by a `ShapedNetwork` never closed."""
    ip = shutil.which("ip") or "ip"
    for name in sorted(LIVE):
        try:
            kill_namespace(name, ip, [], grace_s=0.2)
            delete_namespace(name, ip)
        except (RuntimeError, OSError, subprocess.SubprocessError):
            pass
