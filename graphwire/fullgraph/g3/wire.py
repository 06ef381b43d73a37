"""`Wire`: G3's messages in flight on one rank, forward and backward.

Layer ``l``'s halo rows arrive as the messages of
:class:`~graphwire.fullgraph.g3.messages.Messages` (tag ``fwd.L{l}``, one per
(peer, sender bin)). Their receives are posted once per forward
(:meth:`Wire.post`), each into a buffer of its own; a bin waits for the
messages carrying its halo rows (:meth:`Wire.wait`), which copies them into
the layer's halo buffer (:attr:`Wire.halo`, in halo positions), or a summed
layer takes each as it is in (:meth:`Wire.arrivals`). The rows a rank
computes leave bin by bin (:meth:`Wire.send_bin`) or a layer's all at once
(:meth:`Wire.send_all`); every ``isend``, the backward's returns too
(:meth:`Wire.send`), stays in :attr:`Wire.sends` until :meth:`Wire.drain`.
Waits count in the engine's ``comm_s``. Under ``--staleness``
(:mod:`graphwire.fullgraph.g3.stale`) a skipped message is neither sent nor
received: its receiver reads the rows it cached when the message last came.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from functools import partial

import torch

from graphwire.comm.base import Work
from graphwire.fullgraph.base import Engine
from graphwire.fullgraph.g3.messages import Messages
from graphwire.fullgraph.g3.stale import StaleMessages

__all__ = ["Wire"]

Key = tuple[int, int]  # a message: (peer, sender bin)
# A message to take in: its receive (None: the rows are the cached copy) and rows.
_Entry = tuple[Work | None, torch.Tensor]


class Wire:
    """One rank's G3 messages in flight (see the module docstring).

    Args:
        engine: the engine (its transport, tag ``phase`` and ``timed``).
        messages: how each layer's halo rows travel, input layer first.
        halo_rows: rows of layer ``l``'s halo buffer (0 for a layer that sums
            its messages straight from their receive buffers).
        stale: the messages' staleness (None: every message every forward).

    Attributes:
        halo: per layer, float [halo_rows(l), width], its halo rows (halo
            positions), written as their messages are waited for.
        sends: every ``isend`` not yet known to be complete.
    """

    def __init__(
        self,
        engine: Engine,
        messages: list[Messages],
        halo_rows: Callable[[int], int],
        stale: StaleMessages | None = None,
    ) -> None:
        self._engine, self._messages, self._halo_rows = engine, messages, halo_rows
        self.stale = stale
        self.halo: dict[int, torch.Tensor] = {}
        self._pending: dict[int, dict[Key, _Entry]] = {}
        self.sends: list[Work] = []

    def reset(self) -> None:
        """Forget the last forward's halo buffers and receives (each forward)."""
        self.halo.clear()
        self._pending.clear()

    def _tag(self, layer: int) -> str:
        return f"{self._engine.phase}fwd.L{layer}"

    def post(
        self,
        layer: int,
        width: int,
        like: torch.Tensor,
        halo: torch.Tensor | None = None,
    ) -> None:
        """Post the receives of ``layer``'s halo rows (once per forward; again
        is a no-op), into buffers of ``width`` columns and ``like``'s dtype, to
        land in ``halo`` (default: a new buffer of ``halo_rows(layer)`` rows)."""
        if layer in self.halo:
            return
        if halo is None:
            halo = like.new_empty((self._halo_rows(layer), width))
        self.halo[layer] = halo
        tag = self._tag(layer)
        transport = self._engine.transport
        pending = self._pending[layer] = {}
        messages, stale = self._messages[layer], self.stale
        if stale is not None:
            stale.posted(layer, width, like)
        for key in messages.keys:
            cached = None if stale is None else stale.incoming(layer, key)
            if cached is not None:
                pending[key] = (None, cached)
                continue
            buf = like.new_empty((messages.recv_pos[key].numel(), width))
            pending[key] = (transport.irecv(buf, key[0], tag), buf)

    def wait(self, layer: int, keys: frozenset[Key] | None) -> None:
        """Wait for the messages ``keys`` of ``layer`` (all when None) and put
        their rows in its halo buffer."""
        pending = self._pending.get(layer, {})
        wanted = list(pending) if keys is None else [k for k in keys if k in pending]
        if not wanted:
            return
        # Each row is written once, before any bin reads it; the buffer is
        # outside autograd (each bin's graph starts from its gathered rows).
        halo = self.halo[layer]
        recv_pos = self._messages[layer].recv_pos

        def wait() -> None:
            for key in wanted:
                rows = self._take(layer, key, pending.pop(key))
                halo.index_copy_(0, recv_pos[key], rows)

        self._engine.timed(wait)

    def _take(self, layer: int, key: Key, entry: _Entry) -> torch.Tensor:
        """Message ``key``'s rows, once in (cached under staleness)."""
        work, rows = entry
        if work is not None:
            work.wait()
            if self.stale is not None:
                self.stale.arrived(layer, key, rows)
        return rows

    def arrivals(self, layer: int) -> Iterator[tuple[Key, torch.Tensor]]:
        """``layer``'s messages and their rows, in send order, each as it is in
        (its receive buffer; nothing is written to the halo buffer)."""
        pending = self._pending.pop(layer, {})
        for key in self._messages[layer].keys:
            if key in pending:
                take = partial(self._take, layer, key, pending.pop(key))
                yield key, self._engine.timed(take)

    def send_bin(self, layer: int, b: int, rows: torch.Tensor) -> None:
        """Send every peer the rows of sender bin ``b`` it reads at ``layer``;
        ``rows`` holds the bin's rows in bin order."""
        messages = self._messages[layer]
        if b not in messages.bins_sent:
            return
        for peer, chunks in enumerate(messages.send_rows):
            if b in chunks:
                self._send_rows(
                    layer, peer, b, partial(rows.index_select, 0, chunks[b][1])
                )

    def send_all(self, layer: int, h: torch.Tensor) -> None:
        """Send every peer all the owned rows of ``h`` it reads at ``layer``,
        message by message in send order."""
        for peer, chunks in enumerate(self._messages[layer].send_rows):
            for b, (rows, _) in chunks.items():
                self._send_rows(layer, peer, b, partial(h.index_select, 0, rows))

    def _send_rows(
        self, layer: int, peer: int, b: int, select: Callable[[], torch.Tensor]
    ) -> None:
        """Send ``peer`` message ``b`` of ``layer``, its rows ``select()``,
        unless staleness keeps them home."""
        stale = self.stale
        rows = select() if stale is None else stale.outgoing(layer, peer, b, select)
        if rows is not None:
            self.send(rows, peer, self._tag(layer))

    def send(self, tensor: torch.Tensor, peer: int, tag: str) -> None:
        """``isend`` ``tensor`` to ``peer``; complete by :meth:`drain`."""
        self.sends.append(self._engine.transport.isend(tensor, peer, tag))

    def drain(self) -> None:
        """Wait for every send (timed)."""

        def drain() -> None:
            for work in self.sends:
                work.wait()
            self.sends.clear()

        self._engine.timed(drain)
