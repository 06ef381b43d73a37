"""`StallWatch`: a worker's word when a wait on its peers goes quiet.

A frozen peer (stopped with SIGSTOP, swapped out, hung in a driver) holds every
other rank in its next exchange until the run's timeout ends the run, ten
minutes by default, and nothing tells the user why. So each rank of a
:class:`~graphwire.comm.dist.TorchTransport` notes every blocking call it
makes (:meth:`StallWatch.waiting`), and a daemon thread looks at them once a
second. A call that has waited ``notice_s`` gets one line on standard error,
unless another of the rank's calls (a loader thread's) was told of and still
waits: one stall, one line::

    graphwire: rank 0 has waited 30 s in epoch 21 on all_to_all (fwd.L1):
    rank 2 stopped beating (frozen or dead; rank 2 last seen in epoch 21,
    computing);
    the timeout (600 s) ends the run in 568 s unless it moves

(one line). Which rank it waits on comes from the run's
:class:`~graphwire.comm.heartbeat.Heartbeat`: a point-to-point call's peer, or,
of a collective, the ranks whose heartbeat stopped, else the ranks that are not
in the same exchange (slow or stuck, but alive). Each rank's heartbeat
publishes where it is (:meth:`StallWatch.status`), so the line says where the
rank it waits on was last seen. The timeout itself is unchanged; the notice
only says what it waits for. A call that ends before the heartbeat could be
read (``_SILENT_S``) gets no notice.
"""

from __future__ import annotations

import itertools
import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass

from graphwire.comm.base import name_ranks
from graphwire.comm.heartbeat import Heartbeat

__all__ = ["StallWatch"]

_TICK_S = 1.0  # how often the watch looks at the waits in progress


def _to_stderr(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


@dataclass
class _Wait:
    """One blocking call in progress."""

    op: str  # "all_to_all", "irecv from rank 2", ...
    tag: str
    peers: tuple[int, ...] | None  # None: a collective of every rank
    phase: str  # the rank's phase when the call began ("epoch 21")
    since: float  # time.monotonic() at its start
    told: bool = False

    def where(self) -> str:
        """``epoch 21, waiting in all_to_all (fwd.L1)``."""
        lead = f"{self.phase}, " if self.phase else ""
        return f"{lead}waiting in {self.op} ({self.tag})"


class StallWatch:
    """Notes one rank's blocking calls and tells of any that waits too long.

    Args:
        rank: this rank.
        world_size: the number of ranks.
        notice_s: how long a call waits before its notice (> 0).
        timeout_s: the run's timeout, which ends a call that waits on.
        heartbeat: the run's heartbeat (None: the store cannot be reached,
            and the notice names the call's peers, or none); settable, as
            :attr:`heartbeat`, for a heartbeat made after the watch.
        phase: this rank's phase now (``"epoch 21"``), read as a call begins.
        write: where a notice goes (standard error).
    """

    def __init__(
        self,
        rank: int,
        world_size: int,
        notice_s: float,
        timeout_s: float,
        heartbeat: Heartbeat | None,
        phase: Callable[[], str],
        write: Callable[[str], None] = _to_stderr,
    ) -> None:
        if not notice_s > 0:
            raise ValueError(f"notice_s: expected > 0, got {notice_s}")
        self.rank, self.world_size = rank, world_size
        self.notice_s, self.timeout_s = notice_s, timeout_s
        self.heartbeat, self._phase, self._write = heartbeat, phase, write
        self._waits: dict[int, _Wait] = {}
        self._tokens = itertools.count()
        self._lock = threading.Lock()
        self._stopped = threading.Event()
        self._thread = threading.Thread(
            target=self._watch, name="graphwire-stall-watch", daemon=True
        )
        self._thread.start()

    @contextmanager
    def waiting(
        self, op: str, tag: str, peers: Sequence[int] | None = None
    ) -> Iterator[None]:
        """Note the blocking call ``op`` (on ``peers``; None: all) while it runs."""
        token = next(self._tokens)
        on = None if peers is None else tuple(peers)
        wait = _Wait(op, tag, on, self._phase(), time.monotonic())
        with self._lock:
            self._waits[token] = wait
        try:
            yield
        finally:
            with self._lock:
                del self._waits[token]

    def status(self) -> str:
        """Where this rank is: its oldest call in progress, or its phase."""
        with self._lock:
            oldest = min(self._waits.values(), key=lambda w: w.since, default=None)
        if oldest is not None:
            return oldest.where()
        phase = self._phase()
        return f"{phase}, computing" if phase else "computing"

    def stop(self) -> None:
        self._stopped.set()

    # ----------------------------------------------------------------- watch
    def _watch(self) -> None:
        while not self._stopped.wait(min(_TICK_S, self.notice_s / 2)):
            now = time.monotonic()
            with self._lock:
                # One stall, one line: while a told wait is held up, the
                # rank's other waits (a loader thread's request to the same
                # peer) are the same stall; of several due at once, the
                # oldest is told.
                told = any(wait.told for wait in self._waits.values())
                due = [
                    (token, wait)
                    for token, wait in self._waits.items()
                    if not wait.told and now - wait.since >= self.notice_s
                ]
                for _, wait in due:
                    wait.told = True
            if told or not due:
                continue
            token, wait = min(due, key=lambda item: item[1].since)
            blame = self._blame(wait)
            with self._lock:  # ended while the heartbeat was read: no word
                waiting = self._waits.get(token) is wait
                if not waiting:  # the others wait on: look at them again
                    for _, other in due:
                        other.told = other is wait
            if waiting and not self._stopped.is_set():
                self._write(self._notice(wait, blame))

    def _notice(self, wait: _Wait, blame: str) -> str:
        waited = time.monotonic() - wait.since
        left = max(0.0, self.timeout_s - waited)
        phase = f" in {wait.phase}" if wait.phase else ""
        return (
            f"graphwire: rank {self.rank} has waited {waited:.0f} s{phase} on "
            f"{wait.op} ({wait.tag}): {blame}; the timeout ({self.timeout_s:g} s) "
            f"ends the run in {left:.0f} s unless it moves"
        )

    def _blame(self, wait: _Wait) -> str:
        """Which ranks ``wait`` is held up by, and where they are."""
        others = [r for r in range(self.world_size) if r != self.rank]
        peers = list(wait.peers) if wait.peers is not None else others
        heart = self.heartbeat
        silent = heart.silent() if heart is not None else None
        where = heart.statuses() if heart is not None else None
        if silent is None or where is None:  # no store: the call's peers, if any
            if wait.peers is None and len(others) > 1:
                return "the heartbeat store cannot be reached to tell which rank"
            return f"waiting on {name_ranks(peers)}"
        stopped = [r for r in peers if r in silent]
        if stopped:
            seen = "; ".join(
                f"rank {r} last seen in {where.get(r, 'no phase yet')}" for r in stopped
            )
            return f"{name_ranks(stopped)} stopped beating (frozen or dead; {seen})"
        elsewhere = [r for r in peers if where.get(r) != wait.where()]
        if wait.peers is None and not elsewhere:
            return "every rank is in this call, so the network is slow or stuck"
        held = elsewhere or peers
        seen = "; ".join(f"rank {r}: {where.get(r, 'not seen yet')}" for r in held)
        return f"waiting on {name_ranks(held)}, alive but not here ({seen})"
