"""`Ledger`: bytes and messages one rank sent and received, per (src, dst, tag).

Every transport records into its ledger as it moves data, so the ledger is the
account of what crossed process boundaries: a rank's own rows never count, and
an empty chunk is no message. Tags name what moved and why, dotted from
general to specific: ``fwd.L1``, ``bwd.L0``, ``sync.grad``, ``setup.degree``.

A ledger holds only its own rank's traffic; :func:`merge` adds several ranks'
ledgers (as plain dicts, after an all-gather) into one cluster-wide account.
:func:`ledger_delta` gives what moved between two snapshots, and
:class:`LedgerWindows` cuts a run into consecutive windows (set-up, each
epoch, teardown) that add up to the ledger's totals.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

__all__ = [
    "Ledger",
    "LedgerEntry",
    "LedgerWindows",
    "ledger_delta",
    "merge",
    "recv_between",
    "sent_between",
]


@dataclass(slots=True)
class LedgerEntry:
    """Totals for one (src, dst, tag)."""

    bytes: int = 0
    messages: int = 0


Key = tuple[int, int, str]


class Ledger:
    """Per-(src, dst, tag) byte and message counts of one rank.

    Thread-safe: a communication thread and the main thread may record at once.

    Args:
        rank: the rank whose traffic this is (the src of sends, the dst of
            receives).
    """

    def __init__(self, rank: int) -> None:
        self.rank = rank
        self._sent: dict[Key, LedgerEntry] = {}
        self._recv: dict[Key, LedgerEntry] = {}
        self._lock = threading.Lock()

    # --------------------------------------------------------------- record
    def record_send(self, dst: int, tag: str, num_bytes: int) -> None:
        """Count one message of ``num_bytes`` from this rank to ``dst``."""
        self._add(self._sent, (self.rank, dst, tag), num_bytes)

    def record_recv(self, src: int, tag: str, num_bytes: int) -> None:
        """Count one message of ``num_bytes`` from ``src`` to this rank."""
        self._add(self._recv, (src, self.rank, tag), num_bytes)

    def _add(self, table: dict[Key, LedgerEntry], key: Key, num_bytes: int) -> None:
        if key[0] == key[1]:
            raise ValueError(f"ledger: {key[0]} -> {key[1]} is not a transfer")
        if num_bytes <= 0:
            return  # nothing crossed
        with self._lock:
            entry = table.setdefault(key, LedgerEntry())
            entry.bytes += num_bytes
            entry.messages += 1

    # ---------------------------------------------------------------- query
    def bytes_sent(self, tag: str | None = None, peer: int | None = None) -> int:
        """Bytes sent, optionally only under ``tag`` (prefix) / to ``peer``.

        ``tag`` may be a prefix such as ``fwd.``."""
        return _total(self._sent, tag, dst=peer)

    def bytes_recv(self, tag: str | None = None, peer: int | None = None) -> int:
        """Bytes received, optionally only under ``tag`` (prefix) / from ``peer``."""
        return _total(self._recv, tag, src=peer)

    def messages_sent(self, tag: str | None = None, peer: int | None = None) -> int:
        return _total(self._sent, tag, dst=peer, field="messages")

    def tags(self) -> list[str]:
        with self._lock:
            return sorted({k[2] for k in (*self._sent, *self._recv)})

    def snapshot(self) -> dict[str, Any]:
        """Every count, JSON-ready and sorted.

        ``{"sent": [[src, dst, tag, bytes, messages], ...], "recv": [...]}``."""
        with self._lock:
            return {
                "sent": _rows(self._sent),
                "recv": _rows(self._recv),
            }

    def reset(self) -> None:
        with self._lock:
            self._sent.clear()
            self._recv.clear()


def _matches(tag: str, want: str | None) -> bool:
    if want is None:
        return True
    return tag == want or (want.endswith(".") and tag.startswith(want))


def _total(
    table: Mapping[Key, LedgerEntry],
    tag: str | None,
    src: int | None = None,
    dst: int | None = None,
    field: str = "bytes",
) -> int:
    total = 0
    for (s, d, t), entry in list(table.items()):
        if _matches(t, tag) and src in (None, s) and dst in (None, d):
            total += getattr(entry, field)
    return total


def _rows(table: Mapping[Key, LedgerEntry]) -> list[list[Any]]:
    return [[s, d, t, e.bytes, e.messages] for (s, d, t), e in sorted(table.items())]


def merge(snapshots: Iterable[Mapping[str, Any]]) -> dict[Key, LedgerEntry]:
    """Sum the ``sent`` rows of several ranks' :meth:`Ledger.snapshot` s.

    Returns:
        ``(src, dst, tag) -> LedgerEntry`` over all ranks (each transfer once,
        counted by its sender).
    """
    out: dict[Key, LedgerEntry] = {}
    for snapshot in snapshots:
        for src, dst, tag, num_bytes, messages in snapshot["sent"]:
            entry = out.setdefault((src, dst, tag), LedgerEntry())
            entry.bytes += num_bytes
            entry.messages += messages
    return out


def sent_between(
    before: Mapping[str, Any], after: Mapping[str, Any]
) -> Iterator[tuple[int, str, int]]:
    """``(dst, tag, bytes)`` a rank sent between two of its ledger's snapshots.

    Each ``(dst, tag)`` that sent bytes comes once."""
    old = {(r[1], r[2]): r[3] for r in before["sent"]}
    for _, dst, tag, num_bytes, _ in after["sent"]:
        delta = num_bytes - old.get((dst, tag), 0)
        if delta:
            yield dst, tag, delta


def recv_between(
    before: Mapping[str, Any], after: Mapping[str, Any]
) -> Iterator[tuple[int, str, int]]:
    """``(src, tag, bytes)`` a rank received between two of its ledger's
    snapshots. Each ``(src, tag)`` that received bytes comes once."""
    old = {(r[0], r[2]): r[3] for r in before["recv"]}
    for src, _, tag, num_bytes, _ in after["recv"]:
        delta = num_bytes - old.get((src, tag), 0)
        if delta:
            yield src, tag, delta


def ledger_delta(before: Mapping[str, Any], after: Mapping[str, Any]) -> dict[str, Any]:
    """What a rank's ledger counted between two snapshots.

    ``bytes_sent``, ``bytes_recv``, and the bytes sent ``by_tag`` and
    ``by_peer`` (a str)."""
    by_tag: dict[str, int] = {}
    by_peer: dict[str, int] = {}
    for dst, tag, delta in sent_between(before, after):
        by_tag[tag] = by_tag.get(tag, 0) + delta
        by_peer[str(dst)] = by_peer.get(str(dst), 0) + delta
    old_recv = {(r[0], r[2]): r[3] for r in before["recv"]}
    recv = sum(r[3] - old_recv.get((r[0], r[2]), 0) for r in after["recv"])
    return {
        "bytes_sent": sum(by_tag.values()),
        "bytes_recv": recv,
        "by_tag": by_tag,
        "by_peer": by_peer,
    }


class LedgerWindows:
    """Cuts a ledger's count into consecutive windows that add up to the totals.

    Each window starts where the one before ended (the first, where the ledger
    started), so every byte falls in exactly one window.

    Args:
        ledger: the rank's ledger.
    """

    def __init__(self, ledger: Ledger) -> None:
        self.ledger = ledger
        self.last: dict[str, Any] = {"sent": [], "recv": []}  # the last cut's

    def cut(self, snapshot: dict[str, Any] | None = None) -> dict[str, Any]:
        """:func:`ledger_delta` since the last cut.

        Args:
            snapshot: the ledger's snapshot now, if the caller has taken it
                (the run's last, which it reports as its totals).
        """
        after = self.ledger.snapshot() if snapshot is None else snapshot
        window = ledger_delta(self.last, after)
        self.last = after
        return window
