"""Turns: at most N in-process ranks run at once.

A hundred ranks as threads of one process (the simulator's traces) all
competing for two cores and the GIL spend most of their time handing the GIL
over: every torch call releases it, and each release wakes another of the
hundred. With turns, a rank runs only while it holds one and gives it up for
as long as it blocks (waiting for a message, for the switch, or sleeping), so
no more ranks compete than there are turns.

:func:`run_local` (``running=N``) hands every rank thread its turns;
:func:`waiting` is what a blocking call wraps. Outside such a thread it does
nothing.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager

__all__ = ["Turns", "waiting"]

_local = threading.local()


class Turns:
    """``slots`` turns shared by the threads that :meth:`hold` them."""

    def __init__(self, slots: int) -> None:
        if slots < 1:
            raise ValueError(f"turns: expected at least 1 slot, got {slots}")
        self._free = threading.Semaphore(slots)

    @contextmanager
    def hold(self) -> Iterator[None]:
        """Run the calling thread's body in turn (given up in :func:`waiting`)."""
        self._free.acquire()
        _local.turns = self
        try:
            yield
        finally:
            _local.turns = None
            self._free.release()


@contextmanager
def waiting() -> Iterator[None]:
    """Give up the calling thread's turn while the body blocks."""
    turns: Turns | None = getattr(_local, "turns", None)
    if turns is None:
        yield
        return
    turns._free.release()
    try:
        yield
    finally:
        turns._free.acquire()
