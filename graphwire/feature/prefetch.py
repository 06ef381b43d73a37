"""RapidGNN's prefetcher: batches assembled ahead of the trainer, Q at most.

:class:`Prefetcher` is a thread that walks the run's batch keys ahead of the
trainer and assembles each batch's input features: cache first, then local
rows, then ONE batched pull per owner for the misses (``kv.prefetch``). At
most ``Q`` assembled batches are alive at once (taken by the trainer and not
yet released included, and the trainer's own), so cache plus prefetch memory
stays within ``(2 n_hot + Q max_batch_inputs) F 4`` bytes. If the trainer asks
for a batch the prefetcher has not started, the trainer makes it (the
on-demand fallback), under one of the ``Q`` permits, and the prefetcher skips
it; one it has started, the trainer waits for.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Hashable, Iterable
from dataclasses import dataclass, field

from graphwire.feature.cache import from_thread

__all__ = ["Prefetcher"]


@dataclass
class _Slot:
    item: object = None
    ready: bool = False


@dataclass
class Prefetcher:
    """Assembles batches ahead of the trainer, at most ``depth`` alive.

    Every alive batch holds one of ``depth`` permits, from when it is
    started until the trainer releases it: the prefetcher's, and the ones
    the trainer makes itself when it outruns the prefetcher (the counters
    ``peak_alive`` and ``peak_bytes`` count both). The trainer asks for the
    keys in the prefetcher's order, so when it outruns the prefetcher, every
    permit in use is one the trainer holds: its own batch never waits for one.

    Args:
        keys: the batch keys in the order the trainer will ask for them.
        make: ``key -> item`` (runs on the prefetcher thread).
        depth: Q, the most assembled batches alive at once.
        nbytes: ``item -> bytes`` it holds (for the memory counter).
    """

    keys: Iterable[Hashable]
    make: Callable[[Hashable], object]
    depth: int
    nbytes: Callable[[object], int] = lambda item: 0
    counters: dict[str, int] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.depth < 1:
            raise ValueError(f"prefetch depth Q: expected >= 1, got {self.depth}")
        self._slots: dict[Hashable, _Slot] = {}
        self._taken: set[Hashable] = set()  # keys the trainer made itself
        self._own: dict[Hashable, int] = {}  # the trainer's alive ones: bytes
        self._given: set[Hashable] = set()  # prefetched, handed out, alive
        self._cond = threading.Condition()
        self._permits = 0  # in use: started and not yet released
        self._alive = 0
        self._alive_bytes = 0
        self._stop = False
        self._error: BaseException | None = None
        self.counters.update(
            prefetched=0, fallbacks=0, waited=0, peak_bytes=0, peak_alive=0
        )
        self._thread = threading.Thread(target=self._run, name="prefetch", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        try:
            for key in self.keys:
                with self._cond:
                    while self._permits >= self.depth and not self._stop:
                        self._cond.wait(timeout=0.05)
                    if self._stop:
                        return
                    if key in self._taken:  # the trainer made it itself
                        self._taken.discard(key)
                        continue
                    self._permits += 1
                    self._slots[key] = _Slot()
                item = self.make(key)
                with self._cond:
                    slot = self._slots[key]
                    slot.item, slot.ready = item, True
                    self._count_alive(self.nbytes(item))
                    self.counters["prefetched"] += 1
                    self._cond.notify_all()
        except BaseException as error:  # re-raised to the trainer by get()
            with self._cond:
                self._error = error
                self._cond.notify_all()

    def _count_alive(self, nbytes: int) -> None:
        """One more batch alive (called holding the lock)."""
        self._alive += 1
        self._alive_bytes += nbytes
        self.counters["peak_alive"] = max(self.counters["peak_alive"], self._alive)
        self.counters["peak_bytes"] = max(
            self.counters["peak_bytes"], self._alive_bytes
        )

    def get(
        self, key: Hashable, own: Callable[[Hashable], object]
    ) -> tuple[object, bool]:
        """``key``'s item, and whether the prefetcher made it.

        If the prefetcher has not started ``key``, it never will: the
        trainer makes it here with ``own``, under a permit of its own.

        Raises:
            RuntimeError: ``key`` is the trainer's own already (not
                released), or no permit is free: the trainer holds all Q,
                or skipped keys the prefetcher made (asked out of order).
        """
        with self._cond:
            if self._error is not None:
                raise from_thread("prefetcher failed", self._error)
            if key in self._own:
                raise RuntimeError(
                    f"prefetcher: batch {key} is the trainer's own already; "
                    "release it before asking for it again"
                )
            slot = self._slots.get(key)
            if slot is None:
                if self._permits >= self.depth:
                    raise RuntimeError(self._no_permit(key))
                self._taken.add(key)
                self._permits += 1
            elif not slot.ready:
                self.counters["waited"] += 1
            while slot is not None and not slot.ready:
                if self._error is not None:
                    raise from_thread("prefetcher failed", self._error)
                self._cond.wait(timeout=0.05)
            if slot is not None:
                self._given.add(key)
                return slot.item, True
        try:
            item = own(key)
        except BaseException:
            with self._cond:  # as if never asked: the prefetcher may make it
                self._taken.discard(key)
                self._permits -= 1
                self._cond.notify_all()
            raise
        with self._cond:
            self._own[key] = self.nbytes(item)
            self._count_alive(self._own[key])
            self.counters["fallbacks"] += 1
        return item, False

    def _no_permit(self, key: Hashable) -> str:
        """Why no permit is free for ``key`` (called holding the lock)."""
        held = len(self._own) + len(self._given)
        ahead = len(self._slots) - len(self._given)
        return (
            f"prefetcher: no permit free for batch {key}: the trainer holds {held} "
            f"of Q={self.depth} batches and {ahead} made ahead were never asked "
            "for (ask for the keys in order, and release each)"
        )

    def release(self, key: Hashable) -> None:
        """The trainer is done with ``key``'s item: free its permit."""
        with self._cond:
            slot = self._slots.get(key)
            if slot is not None and not slot.ready:
                raise RuntimeError(
                    f"prefetcher: batch {key} is still being assembled; get it "
                    "before releasing it"
                )
            if slot is not None:
                del self._slots[key]
                nbytes = self.nbytes(slot.item)
                self._given.discard(key)
            elif key in self._own:
                nbytes = self._own.pop(key)
            else:
                return  # released already
            self._alive -= 1
            self._alive_bytes -= nbytes
            self._permits -= 1
            self._cond.notify_all()

    def close(self) -> None:
        with self._cond:
            self._stop = True
            self._cond.notify_all()
        self._thread.join(timeout=30)
