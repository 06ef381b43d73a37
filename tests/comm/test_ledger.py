"""Ledger: per-(src, dst, tag) counts, tag prefixes, self-transfers, merge."""

from __future__ import annotations

import threading

import pytest

from graphwire.comm.ledger import Ledger, LedgerEntry, merge


def test_counts_bytes_and_messages_per_peer_and_tag() -> None:
    ledger = Ledger(rank=1)
    ledger.record_send(0, "fwd.L0", 40)
    ledger.record_send(0, "fwd.L0", 8)
    ledger.record_send(2, "fwd.L1", 12)
    ledger.record_recv(2, "bwd.L0", 16)
    assert ledger.bytes_sent() == 60
    assert ledger.bytes_sent(peer=0) == 48
    assert ledger.messages_sent(tag="fwd.L0", peer=0) == 2
    assert ledger.bytes_recv(tag="bwd.L0", peer=2) == 16
    assert ledger.bytes_recv(peer=0) == 0
    assert ledger.snapshot() == {
        "sent": [[1, 0, "fwd.L0", 48, 2], [1, 2, "fwd.L1", 12, 1]],
        "recv": [[2, 1, "bwd.L0", 16, 1]],
    }
    assert ledger.tags() == ["bwd.L0", "fwd.L0", "fwd.L1"]


def test_tag_prefix_needs_trailing_dot() -> None:
    ledger = Ledger(rank=0)
    ledger.record_send(1, "fwd.L0", 4)
    ledger.record_send(1, "fwd.L1", 8)
    ledger.record_send(1, "fwdx", 16)
    assert ledger.bytes_sent(tag="fwd.") == 12
    assert ledger.bytes_sent(tag="fwd") == 0  # exact tag, not a prefix
    assert ledger.bytes_sent(tag="fwdx") == 16


def test_empty_payload_is_no_message_and_self_is_no_transfer() -> None:
    ledger = Ledger(rank=0)
    ledger.record_send(1, "t", 0)
    ledger.record_recv(1, "t", 0)
    assert ledger.snapshot() == {"sent": [], "recv": []}
    with pytest.raises(ValueError, match="0 -> 0"):
        ledger.record_send(0, "t", 8)
    with pytest.raises(ValueError, match="not a transfer"):
        ledger.record_recv(0, "t", 8)


def test_reset_clears_everything() -> None:
    ledger = Ledger(rank=0)
    ledger.record_send(1, "t", 8)
    ledger.reset()
    assert ledger.bytes_sent() == 0 and ledger.tags() == []


def test_concurrent_records_are_not_lost() -> None:
    ledger = Ledger(rank=0)

    def record() -> None:
        for _ in range(2000):
            ledger.record_send(1, "t", 3)

    threads = [threading.Thread(target=record) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert ledger.bytes_sent() == 4 * 2000 * 3
    assert ledger.messages_sent() == 4 * 2000


def test_merge_sums_senders_view() -> None:
    a, b = Ledger(rank=0), Ledger(rank=1)
    a.record_send(1, "t", 10)
    b.record_recv(0, "t", 10)  # the same transfer, seen by the receiver
    b.record_send(0, "t", 6)
    b.record_send(0, "t", 1)
    merged = merge([a.snapshot(), b.snapshot()])
    assert merged == {
        (0, 1, "t"): LedgerEntry(bytes=10, messages=1),
        (1, 0, "t"): LedgerEntry(bytes=7, messages=2),
    }
