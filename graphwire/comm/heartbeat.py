"""`Heartbeat`: each rank's liveness in the run's rendezvous store.

gloo's error for a failed collective names an address, not a rank, and under
``torchrun --nnodes`` no launcher on the other nodes knows which rank died.
So of more than two ranks each beats in the store the run already has
(``MASTER_ADDR:MASTER_PORT``: the launcher's under ``--workers``, node 0's
agent's under torchrun), and a survivor of a failed collective asks which
ranks stopped beating. Keys, per torchrun run and restart::

    graphwire/heartbeat/<run id>/<restart>/beat/<rank>     counter, +1 per beat
    graphwire/heartbeat/<run id>/<restart>/failed/<rank>   set on a failure
"""

from __future__ import annotations

import os
import threading
import time
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
    """

    def __init__(self, rank: int, world_size: int, store: Any) -> None:
        self.rank, self.world_size, self._store = rank, world_size, store
        run = os.environ.get("TORCHELASTIC_RUN_ID", "")
        restart = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
        self._prefix = f"graphwire/heartbeat/{run}/{restart}/"
        self._stopped = threading.Event()
        self._thread = threading.Thread(
            target=self._beat, name="graphwire-heartbeat", daemon=True
        )
        self._thread.start()

    @classmethod
    def start(cls, ctx: WorkerContext) -> Heartbeat | None:
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
        return cls(ctx.rank, ctx.world_size, store)

    def _beat(self) -> None:
        key = f"{self._prefix}beat/{self.rank}"
        while not self._stopped.is_set():
            try:
                self._store.add(key, 1)
            except (RuntimeError, OSError):  # the store went with its host
                return
            self._stopped.wait(_BEAT_S)

    def lost(self) -> list[int] | None:
        """The other ranks whose heartbeat stopped; None if the store cannot tell.

        Seen over ``_SILENT_S`` (this rank's goes on meanwhile)."""
        try:
            self.mark_failed()
            before = self._counts()
            time.sleep(_SILENT_S)
            after = self._counts()
            failed = [
                self._store.check([f"{self._prefix}failed/{rank}"])
                for rank in range(self.world_size)
            ]
        except (RuntimeError, OSError):
            return None
        return [
            rank
            for rank in range(self.world_size)
            if rank != self.rank and before[rank] == after[rank] and not failed[rank]
        ]

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
