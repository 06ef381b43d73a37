"""`Heartbeat`: each rank's liveness in the run's rendezvous store.

gloo's error for a failed collective names an address, not a rank, and under
``torchrun --nnodes`` no launcher on the other nodes knows which rank died.
So each rank (of two or more) beats in the store the run already has
(``MASTER_ADDR:MASTER_PORT``: the launcher's under ``--workers``, node 0's
agent's under torchrun), and a survivor of a failed collective, or a rank
held up in one (:mod:`~graphwire.comm.stall`), asks which ranks stopped
beating. Keys, per torchrun run and restart::

    graphwire/heartbeat/<run id>/<restart>/beat/<rank>     counter, +1 per beat
    graphwire/heartbeat/<run id>/<restart>/failed/<rank>   set on a failure
    graphwire/heartbeat/<run id>/<restart>/status/<rank>   where it is, when told

With a ``status`` callable a rank also publishes where it is (``epoch 21,
waiting in all_to_all (fwd.L1)``) whenever that changed, at most once a beat:
a rank held up by a peer (:mod:`~graphwire.comm.stall`) reads where the peer
was last seen.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import torch.distributed as dist

from graphwire.comm.context import WorkerContext

__all__ = ["Heartbeat"]

_BEAT_S = 0.5  # each rank's heartbeat period
_SILENT_S = 2.0  # a rank whose heartbeat did not move in this long is gone


class Heartbeat:
    """This rank's heartbeat in the rendezvous store.

    A daemon thread adds 1 to the rank's counter in the store every ``_BEAT_S``.

    After a failed collective, :meth:`lost` tells which ranks are gone: those
    whose counter did not move in ``_SILENT_S`` and that did not report a
    failure of their own (a survivor that has already given up and exited
    is not lost).

    Args:
        rank: this rank.
        world_size: the number of ranks.
        store: the run's rendezvous store (a ``torch.distributed.Store``).
        status: where this rank is now (None: it publishes nothing).
    """

    def __init__(
        self,
        rank: int,
        world_size: int,
        store: Any,
        status: Callable[[], str] | None = None,
    ) -> None:
        self.rank, self.world_size, self._store = rank, world_size, store
        self.status = status
        run = os.environ.get("TORCHELASTIC_RUN_ID", "")
        restart = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
        self._prefix = f"graphwire/heartbeat/{run}/{restart}/"
        self._stopped = threading.Event()
        self._thread = threading.Thread(
            target=self._beat, name="graphwire-heartbeat", daemon=True
        )
        self._thread.start()

    @classmethod
    def start(
        cls, ctx: WorkerContext, status: Callable[[], str] | None = None
    ) -> Heartbeat | None:
        """Beat for ``ctx``'s rank; None if the store cannot be reached."""
        try:
            store = dist.TCPStore(
                ctx.master_addr,
                ctx.master_port,
                is_master=False,
                timeout=timedelta(seconds=5),
                wait_for_workers=False,
            )
        except (RuntimeError, OSError):
            return None
        return cls(ctx.rank, ctx.world_size, store, status)

    def _beat(self) -> None:
        key = f"{self._prefix}beat/{self.rank}"
        told = None
        while not self._stopped.is_set():
            try:
                self._store.add(key, 1)
                now = self.status() if self.status is not None else None
                if now is not None and now != told:
                    self._store.set(f"{self._prefix}status/{self.rank}", now)
                    told = now
            except (RuntimeError, OSError):  # the store went with its host
                return
            self._stopped.wait(_BEAT_S)

    def lost(self) -> list[int] | None:
        """The other ranks whose heartbeat stopped; None if the store cannot tell.

        Seen over ``_SILENT_S`` (this rank's goes on meanwhile)."""
        self.mark_failed()
        silent = self.silent()
        if silent is None:
            return None
        try:
            return [
                rank
                for rank in silent
                if not self._store.check([f"{self._prefix}failed/{rank}"])
            ]
        except (RuntimeError, OSError):
            return None

    def silent(self) -> list[int] | None:
        """The other ranks whose heartbeat did not move over ``_SILENT_S``;
        None if the store cannot tell."""
        try:
            before = self._counts()
            time.sleep(_SILENT_S)
            after = self._counts()
        except (RuntimeError, OSError):
            return None
        return [
            rank
            for rank in range(self.world_size)
            if rank != self.rank and before[rank] == after[rank]
        ]

    def statuses(self) -> dict[int, str] | None:
        """Where each rank that published its status was last seen; None if
        the store cannot tell."""
        seen = {}
        try:
            for rank in range(self.world_size):
                key = f"{self._prefix}status/{rank}"
                if self._store.check([key]):
                    seen[rank] = self._store.get(key).decode("utf-8", "replace")
        except (RuntimeError, OSError):
            return None
        return seen

    def mark_failed(self) -> None:
        """Say that this rank has met a failure of its own (it is not lost)."""
        try:
            self._store.set(f"{self._prefix}failed/{self.rank}", "1")
        except (RuntimeError, OSError):
            pass  # lost() will find the store gone as well

    def _counts(self) -> list[int]:
        return [
            self._store.add(f"{self._prefix}beat/{rank}", 0)
            for rank in range(self.world_size)
        ]

    def stop(self) -> None:
        self._stopped.set()
