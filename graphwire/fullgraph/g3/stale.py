"""`StaleMessages`: bounded embedding staleness on G3's messages (``--staleness``).

G3 sends layer ``l``'s halo rows as one message per (peer, sender bin)
(:class:`~graphwire.fullgraph.g3.messages.Messages`). With ``--staleness``
other than ``none`` (the bounds: :mod:`graphwire.fullgraph.staleness`) a
sender skips a message while its rows are within the bound, and the peer
reads the copy it cached when the message last arrived. Each message is a
block of the staleness rule, keyed ``(layer, sender, receiver, sender bin)``
on both ends; its owner (``adaptive``'s phase) is the sender.

- ``epoch:K`` and ``adaptive:K``: both ends decide from the same stamps when
  an epoch begins (:meth:`StaleMessages.begin_epoch`), without a message.
- ``gap:X`` is one epoch behind. Only the sender can measure a move, and G3
  posts its receives up front, matched in send order per pair, so a skip
  cannot be told in-band. In epoch ``e``'s training forward the sender
  measures each message's rows against the copy the peer held when ``e``
  began; after ``e``, one ``all_to_all`` (tag ``flags``: one uint8 per
  message, to its receiver) says which messages are sent in ``e + 1``: those
  that moved more than ``X``, or of which the peer held no copy. So the rows
  a peer reads in epoch ``e + 1`` were within ``X`` of the sender's rows of
  epoch ``e`` (the broadcast engine's bound holds for the rows of ``e + 1``),
  ``gap:0`` sends every message whose rows changed, and epoch 1 sends every
  message (a move is measured between two sends).
- Epoch 0 sends everything; evaluation forwards send everything and leave
  caches and stamps alone; gradients are never skipped (the backward returns
  the gradients of stale rows to their owners as usual).
- The layers concerned are those whose halo rows are exchanged: from layer 1
  with ``cache_input`` (the input layer reads rows fetched once), else all.

Each rank caches every message it receives (all its halo rows, per layer
concerned) and, under ``gap``, keeps the rows it last sent in each message.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch

from graphwire.comm.base import Transport
from graphwire.fullgraph.g3.messages import Messages
from graphwire.fullgraph.staleness import Staleness, StalenessSpec

__all__ = ["Block", "StaleMessages"]

Key = tuple[int, int]  # a message as Messages names it: (peer, sender bin)
Block = tuple[int, int, int, int]  # (layer, sender, receiver, sender bin)


class StaleMessages:
    """One rank's G3 messages under a staleness bound (module docstring).

    Args:
        spec: the bound.
        norm: how ``gap`` measures a move.
        messages: every layer's messages, input layer first.
        rank: this rank.
        world_size: the number of ranks.
        first: the first layer whose halo rows are exchanged.
        halo_sizes: every rank's halo rows (for the cache each holds).

    Attributes:
        rule: the stamps (epoch each block was last sent) and ``adaptive``'s
            due blocks.
        cache: block -> float [rows, width], the rows of a message this rank
            receives, as they last arrived.
        sent: ``gap``: block -> float [rows, width], the rows of a message
            this rank sends, as last sent (the copy its peer holds).
        flags: ``gap``: block -> whether it is sent next epoch, agreed by
            both ends after each epoch.
        skipped: the blocks this epoch's training forwards skip.
        training: whether the forward running is a training forward (set by
            the engine before each forward).
    """

    def __init__(
        self,
        spec: StalenessSpec,
        norm: str,
        messages: Sequence[Messages],
        *,
        rank: int,
        world_size: int,
        first: int,
        halo_sizes: Sequence[int],
    ) -> None:
        self.rule = Staleness(spec, norm, world_size=world_size)
        self.rank, self.first = rank, first
        self._num_layers, self._world = len(messages), world_size
        self._halo_sizes = list(halo_sizes)
        # Per peer, the blocks this rank sends it and receives from it, in
        # the order of gap's flags (layers, then sender bins).
        self._out: list[list[Block]] = [[] for _ in range(world_size)]
        self._in: list[list[Block]] = [[] for _ in range(world_size)]
        for layer in range(first, len(messages)):
            for peer, chunks in enumerate(messages[layer].send_rows):
                self._out[peer] += [(layer, rank, peer, b) for b in sorted(chunks)]
            for peer, b in sorted(messages[layer].recv_pos):
                self._in[peer].append((layer, peer, rank, b))
        self.cache: dict[Block, torch.Tensor] = {}
        self.sent: dict[Block, torch.Tensor] = {}
        self.flags: dict[Block, bool] = {}
        self.skipped: frozenset[Block] = frozenset()
        self.training = False
        self.epoch = 0
        self._moved: dict[Block, bool] = {}  # gap: measured this epoch
        self._used: dict[Block, tuple[bool, int]] = {}  # sent?, age
        self._row_bytes: dict[int, int] = {}  # per layer concerned

    @property
    def _gap(self) -> bool:
        return self.rule.spec.kind == "gap"

    # ----------------------------------------------------------------- epochs
    def begin_epoch(self, epoch: int) -> None:
        """Before epoch ``epoch``'s training forward: which blocks it skips,
        from what both ends of each know alike."""
        self.epoch = epoch
        self._moved, self._used = {}, {}
        blocks = [b for per_peer in (*self._out, *self._in) for b in per_peer]
        self.skipped = frozenset(b for b in blocks if self._skips(b, epoch))

    def _skips(self, block: Block, epoch: int) -> bool:
        if self.rule.must_send(block, epoch, block[1]):
            return False  # never sent, or too old
        return not (self._gap and self.flags.get(block, True))

    def end_epoch(self, transport: Transport) -> dict[str, Any]:
        """After the epoch: ``adaptive``'s checks, ``gap``'s flags for the
        next epoch (collective, tag ``flags``); returns the epoch's report
        (:meth:`report`)."""
        self.rule.end_epoch(self.epoch, [(b, b[1]) for b in self._used])
        if self._gap:
            send = [
                torch.tensor(
                    [self._moved.get(b, True) for b in blocks], dtype=torch.uint8
                )
                for blocks in self._out
            ]
            recv = transport.all_to_all(send, [len(b) for b in self._in], "flags")
            for blocks, flags in zip(self._out + self._in, send + recv, strict=True):
                self.flags.update(zip(blocks, flags.bool().tolist(), strict=True))
        return self.report()

    def report(self) -> dict[str, Any]:
        """The epoch's messages as this rank saw them (those it sent and
        received).

        Returns ``{"skipped": [[sender, layer], ...] with a skipped message,
        "messages": [[sender, layer, skipped, total], ...], "age": [[the
        oldest copy per sender] per layer concerned], "cache_bytes": [per
        rank], "first_layer": the first layer concerned}``.
        """
        counts: dict[tuple[int, int], list[int]] = {}
        ages = [[0] * self._world for _ in range(self.first, self._num_layers)]
        for (layer, sender, _, _), (sent, age) in self._used.items():
            count = counts.setdefault((sender, layer), [0, 0])
            count[0] += not sent
            count[1] += 1
            row = ages[layer - self.first]
            row[sender] = max(row[sender], age)
        order = sorted(counts, key=lambda sl: (sl[1], sl[0]))
        per_row = sum(self._row_bytes.values())
        return {
            "skipped": [[s, layer] for s, layer in order if counts[(s, layer)][0]],
            "messages": [[s, layer, *counts[(s, layer)]] for s, layer in order],
            "age": ages,
            "cache_bytes": [per_row * num_halo for num_halo in self._halo_sizes],
            "first_layer": self.first,
        }

    # ---------------------------------------------------------------- forward
    def _concerned(self, layer: int) -> bool:
        return self.training and layer >= self.first

    def posted(self, layer: int, width: int, like: torch.Tensor) -> None:
        """Layer ``layer``'s receives are posted, for rows ``width`` wide of
        ``like``'s dtype (the cache's row size)."""
        if self._concerned(layer):
            self._row_bytes[layer] = width * like.element_size()

    def outgoing(
        self, layer: int, peer: int, b: int, select: Callable[[], torch.Tensor]
    ) -> torch.Tensor | None:
        """The rows to send ``peer`` in message ``b`` of ``layer``
        (``select()``), or None when the message is skipped; ``gap`` measures
        the move here."""
        if not self._concerned(layer):
            return select()
        block = (layer, self.rank, peer, b)
        if block in self.skipped:
            self._used[block] = (False, self.rule.age(block, self.epoch))
            if self._gap:
                self._moved[block] = self.rule.moved(select(), self.sent[block])
            return None
        rows = select()
        self._mark(block)
        if self._gap:  # moved since the copy the peer held when the epoch began
            last = self.sent.get(block)
            self._moved[block] = last is None or self.rule.moved(rows, last)
            self.sent[block] = rows
        return rows

    def incoming(self, layer: int, key: Key) -> torch.Tensor | None:
        """The cached rows of message ``key`` of ``layer`` when it is
        skipped; None when it is to be received."""
        if not self._concerned(layer):
            return None
        block = (layer, key[0], self.rank, key[1])
        if block in self.skipped:
            self._used[block] = (False, self.rule.age(block, self.epoch))
            return self.cache[block]
        self._mark(block)
        return None

    def arrived(self, layer: int, key: Key, rows: torch.Tensor) -> None:
        """Message ``key`` of ``layer`` arrived with ``rows`` (its own
        buffer, written no more): cache them."""
        if self._concerned(layer):
            self.cache[(layer, key[0], self.rank, key[1])] = rows

    def _mark(self, block: Block) -> None:
        self.rule.sent(block, self.epoch)
        self._used[block] = (True, 0)

    # ------------------------------------------------------------- checkpoint
    def state_dict(self) -> dict[str, Any]:
        return {
            "staleness": self.rule.state_dict(),
            "cache": dict(self.cache),
            "sent": dict(self.sent),
            "flags": dict(self.flags),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.rule.load_state_dict(state["staleness"])
        self.cache = dict(state["cache"])
        self.sent = dict(state["sent"])
        self.flags = dict(state["flags"])
