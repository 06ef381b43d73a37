"""`capture_epoch`: one training step of a real engine, with every transfer traced.

The simulators' traffic is the engines' own: the strategy's engine is built
on each part of a partitioned folder, exactly as ``graphwire train`` builds
it, and runs one training step (forward, backward, gradient sum) on
in-process ranks (:func:`~graphwire.comm.local.run_local`, threads of this
process, one torch thread each). Each rank's ledger also keeps, in order,
every message it sent or received, with the CPU time the rank's thread had
used by then, so the CPU between two transfers is that rank's compute there,
measured one part at a time on this machine's cores.

The CPU a rank spends inside the engine's communication calls (framing,
polling, copying rows: what ``Engine.timed`` wraps) is not compute: the
simulated network stands for it. A receive posted ahead (``irecv``, G3's
pipelined bins) counts where the rank waits for it, not where it was
posted, so overlap is kept. The switch of
``--exchange switch`` is a real process here too (peer ``world_size`` in
the ledger), which writes down for every frame it sent the frames it needed
(:mod:`graphwire.comm.switch.server`); each rank numbers the frames on its
link the same way. A lossless switch's recovery timer is set to the
capture's timeout: ranks that take turns on a few cores are slow, not lost.

A warm-up step runs first and is not traced (first-call allocations are not
an epoch's cost); then ``repeats`` traced steps, of which the last is kept,
with each rank's least compute over the repeats (CPU time on a shared machine
only ever grows with interference).
"""

from __future__ import annotations

import gc
import os
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, TypeVar

import numpy as np
import torch

from graphwire.comm.base import Transport, Work
from graphwire.comm.ledger import Ledger, recv_between, sent_between
from graphwire.comm.local import run_local
from graphwire.comm.switch.frames import Frame
from graphwire.comm.switch.link import SwitchLink
from graphwire.comm.switch.server import TRACE_ENV
from graphwire.fullgraph.base import Engine
from graphwire.fullgraph.distributed import build_engine, forward_loss
from graphwire.fullgraph.engines import EXCHANGES
from graphwire.fullgraph.switch import SwitchConfig
from graphwire.partition import load_part
from graphwire.run.collective import seeded_model, split_sizes
from graphwire.run.config import TrainConfig

__all__ = ["Capture", "Event", "RankTrace", "TraceLedger", "capture_epoch"]

# The hashed dropout's seed of the traced step (any fixed value: same masks
# on every run, so the same rows cross the wire).
_DROPOUT_SEED = 0
T = TypeVar("T")


@dataclass(slots=True)
class Event:
    """One transfer of one rank.

    Attributes:
        kind: ``send``; ``recv`` (the rank has the message now); ``posted`` (a
            receive posted ahead: the rank waits for it at the ``wait`` event
            whose ``ref`` is this event's index).
        peer: the other rank (``world_size``: the switch).
        tag: the ledger's tag.
        nbytes: payload bytes.
        cpu: the rank's thread CPU seconds since the trace began.
        wall: ``time.perf_counter()`` at the event (comparable across ranks).
        ref: for ``wait``, the index of its ``posted`` event.
        frame: a switch frame's number on the rank's link (-1: not one).
    """

    kind: str
    peer: int
    tag: str
    nbytes: int
    cpu: float
    wall: float
    ref: int = -1
    frame: int = -1


class TraceLedger(Ledger):
    """A :class:`Ledger` that also keeps its rank's transfers in order while on."""

    def __init__(self, rank: int) -> None:
        super().__init__(rank)
        self.events: list[Event] = []
        self.on = False
        self._cpu0 = 0.0
        self._paused = 0.0  # CPU spent in communication calls
        self._depth = 0
        self._entered = 0.0
        self.frame = -1  # the switch frame being counted, if any
        self.traced = 0  # steps traced so far

    def start(self) -> None:
        self.traced += 1
        self.events.clear()
        self._cpu0 = time.thread_time()
        self._paused = 0.0
        self.on = True

    def cpu(self) -> float:
        """Thread CPU seconds since :meth:`start` outside communication calls
        (call on the rank's thread)."""
        now = self._entered if self._depth else time.thread_time()
        return now - self._cpu0 - self._paused

    def enter_comm(self) -> None:
        """A communication call begins: its CPU is not compute."""
        if self._depth == 0:
            self._entered = time.thread_time()
        self._depth += 1

    def exit_comm(self) -> None:
        self._depth -= 1
        if self._depth == 0:
            self._paused += time.thread_time() - self._entered

    def record_send(self, dst: int, tag: str, num_bytes: int) -> None:
        super().record_send(dst, tag, num_bytes)
        self.keep("send", dst, tag, num_bytes)

    def record_recv(self, src: int, tag: str, num_bytes: int) -> None:
        super().record_recv(src, tag, num_bytes)
        self.keep("recv", src, tag, num_bytes)

    def keep(
        self, kind: str, peer: int, tag: str, num_bytes: int, ref: int = -1
    ) -> None:
        """Append an event while tracing (an empty transfer is none)."""
        if self.on and (num_bytes > 0 or kind == "wait"):
            now = time.perf_counter()
            event = Event(kind, peer, tag, num_bytes, self.cpu(), now, ref, self.frame)
            self.events.append(event)


class _Waited:
    """A posted receive whose ``wait`` is kept in the trace."""

    def __init__(self, work: Work, ledger: TraceLedger, ref: int) -> None:
        self._work, self._ledger, self._ref = work, ledger, ref
        self._traced = ledger.traced  # the step it was posted in
        self._done = False

    def wait(self) -> None:
        self._work.wait()
        if not self._done and self._ledger.traced == self._traced:
            self._done = True
            event = self._ledger.events[self._ref]
            self._ledger.keep("wait", event.peer, event.tag, 0, self._ref)


def _trace(transport: Transport) -> TraceLedger:
    """Swap in a tracing ledger and make posted receives count at their wait."""
    ledger = TraceLedger(transport.rank)
    transport.ledger = ledger
    post = transport.irecv

    def irecv(tensor: torch.Tensor, src: int, tag: str) -> Work:
        count = len(ledger.events)
        work = post(tensor, src, tag)
        if len(ledger.events) == count:
            return work  # not traced (off, or empty)
        ledger.events[-1].kind = "posted"
        return _Waited(work, ledger, len(ledger.events) - 1)

    transport.irecv = irecv  # type: ignore[method-assign]
    return ledger


def _number_frames(engine: Engine, ledger: TraceLedger) -> None:
    """Give the ledger each switch frame's number as the link counts it."""
    link: SwitchLink | None = getattr(engine, "link", None)
    if link is None:
        return

    def numbered(frame: Frame) -> None:
        ledger.frame = frame.number

    link.on_count = numbered


def _uncount_comm(engine: Engine, ledger: TraceLedger) -> None:
    """Keep the CPU of ``engine``'s communication calls out of its compute."""
    timed = engine.timed

    def uncounted(fn: Callable[[], T]) -> T:
        ledger.enter_comm()
        try:
            return timed(fn)
        finally:
            ledger.exit_comm()

    engine.timed = uncounted  # type: ignore[method-assign]


@dataclass(slots=True)
class RankTrace:
    """What one rank did in the traced step.

    Attributes:
        rank: the rank (= part).
        events: its transfers, in order.
        cpu_s: its compute seconds in the kept step (CPU outside
            communication calls).
        least_cpu_s: the least of that over the repeated steps.
        extra: the engine's end-of-epoch report (the switch's counters, ...).
        counted: ``(src, dst, tag) -> bytes`` the rank's ledger counted in
            the kept step: what it sent, and what it received from the
            switch (peer ``world_size``).
    """

    rank: int
    events: list[Event]
    cpu_s: float
    least_cpu_s: float
    extra: dict[str, Any] = field(default_factory=dict)
    counted: dict[tuple[int, int, str], int] = field(default_factory=dict)


@dataclass(slots=True)
class Capture:
    """A traced step: every rank's trace, and the switch's causality.

    Attributes:
        ranks: by rank.
        switch: int64 [frames, 2 + world] the switch's trace (see
            :mod:`graphwire.comm.switch.server`), or None without a switch.
    """

    ranks: list[RankTrace]
    switch: np.ndarray | None = None


def _patient(exchange: Any, timeout: float) -> Any:
    """``exchange``, with a lossless switch's recovery timer at ``timeout``.

    A hundred ranks taking turns on two cores can leave one unscheduled for
    longer than the switch's timeout (1 s): it would then fetch and resend
    rows nothing lost, which a run on a machine per worker never does. A
    lossless switch (``switch_loss`` 0) loses nothing, so its timer never
    needs to fire here."""
    _, config = EXCHANGES.resolve(exchange or EXCHANGES.default)
    if isinstance(config, SwitchConfig) and config.switch_loss == 0:
        return replace(config, switch_timeout=timeout)
    return exchange


def capture_epoch(
    folder: str | Path,
    num_parts: int,
    config: TrainConfig,
    exchange: Any,
    options: dict[str, Any] | None = None,
    *,
    repeats: int = 3,
    timeout: float = 600.0,
) -> Capture:
    """Trace one training step of ``exchange`` on every part of ``folder``.

    Args:
        folder: a partitioned graph of ``num_parts`` parts.
        config: the model (``--model``, ``--hidden``, ``--layers``, ``--seed``).
        exchange: the engine's name or config (as :func:`build_engine`).
        options: the engine's own keywords (as :func:`build_engine`).
        repeats: traced steps (see the module docstring).

    Returns:
        Every rank's trace, and the switch's (with ``--exchange switch``).
    """
    if repeats < 1:
        raise ValueError(f"repeats: expected >= 1, got {repeats}")
    exchange = _patient(exchange, timeout)

    def step(transport: Transport) -> RankTrace:
        ledger = _trace(transport)
        part = load_part(folder, transport.rank)
        assert part.x is not None
        engine = build_engine(part, transport, config, exchange, options)
        _uncount_comm(engine, ledger)
        _number_frames(engine, ledger)
        if hasattr(engine, "close_timeout_s"):  # the switch writes its trace
            engine.close_timeout_s = timeout  # as it ends: big ones take time
        model = seeded_model(part.x.shape[1], int(part.meta["num_classes"]), config)
        model.train()
        engine.prepare(model)
        num_train = split_sizes(part, transport)["train"]
        spent = []
        try:
            for epoch in range(1 + repeats):  # epoch 0 warms up
                transport.barrier()
                if epoch > 0:
                    ledger.start()
                counted_from = ledger.snapshot()
                engine.begin_epoch(epoch)
                _, loss = forward_loss(engine, model, num_train, _DROPOUT_SEED)
                model.zero_grad(set_to_none=True)
                loss.backward()
                engine.sync_gradients(model)
                extra = engine.end_epoch()
                spent.append(ledger.cpu())
                ledger.on = False
                counted_to = ledger.snapshot()
        finally:
            engine.close()
        rank, world = transport.rank, transport.world_size
        window = (counted_from, counted_to)
        counted = {(rank, dst, tag): n for dst, tag, n in sent_between(*window)}
        for src, tag, n in recv_between(*window):
            if src == world:  # the switch's frames to this rank
                counted[(src, rank, tag)] = n
        return RankTrace(
            rank, list(ledger.events), spent[-1], min(spent[1:]), extra, counted
        )

    with tempfile.TemporaryDirectory(prefix="graphwire-capture-") as scratch:
        trace_file = os.path.join(scratch, "switch.npy")
        before = os.environ.get(TRACE_ENV)
        os.environ[TRACE_ENV] = trace_file  # read by a switch rank 0 starts
        # A full collection inside a traced step stops whichever rank
        # allocated at that moment (300 ms of its "compute" at 128 ranks):
        # none runs until the capture ends.
        gc.collect()
        collecting = gc.isenabled()
        gc.disable()
        try:
            ranks = run_local(
                step, num_parts, timeout=timeout, running=os.cpu_count() or 1
            )
        finally:
            if collecting:
                gc.enable()
            if before is None:
                del os.environ[TRACE_ENV]
            else:
                os.environ[TRACE_ENV] = before
        switch = np.load(trace_file) if os.path.exists(trace_file) else None
    return Capture(ranks, switch)
