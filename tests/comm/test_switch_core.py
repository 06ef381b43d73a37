"""The switch's data plane and wire format, frame by frame (no sockets).

Two workers: worker 0 owns nodes 0-1, worker 1 owns 2-3. One block with
edges 0 -> 2, 1 -> 2, 0 -> 3 (worker 0's rows feed worker 1's aggregators).
Rows are 4 floats: one 128-byte aggregator each, so 128 bytes of memory
hold one row.
"""

from __future__ import annotations

import numpy as np
import pytest

from graphwire.comm.switch.core import SwitchCore, pool_rows
from graphwire.comm.switch.frames import (
    BYPASS,
    RESEND,
    Frame,
    FrameReader,
    Kind,
    encode,
)

SRC = np.array([0, 1, 0], dtype=np.int64)
DST = np.array([2, 2, 3], dtype=np.int64)
ROWS = np.arange(8, dtype=np.float32).reshape(2, 4) + 1  # rows of nodes 0 and 1


def _core(mem_bytes: int, loss: float = 0.0) -> SwitchCore:
    core = SwitchCore(2, [0, 2, 4], mem_bytes, loss, seed=0)
    table = Frame(
        Kind.TABLE, plan=0, seq=1, block=0, ids1=SRC, ids2=DST,
        rows=np.zeros((0, 4), dtype=np.float32),
    )  # fmt: skip
    assert [(r, f.kind) for r, f in core.handle(table)] == [(0, Kind.READY)]
    return core


def _data(ids: list[int], rows: np.ndarray, flags: int = 0, **kw) -> Frame:
    return Frame(
        Kind.DATA, flags, 0, sender=0, seq=5, block=0,
        ids1=np.array(ids, dtype=np.int64), rows=rows, **kw,
    )  # fmt: skip


def test_frames_round_trip_and_a_corrupt_stream_is_refused() -> None:
    frame = _data([0, 1], ROWS, ids2=np.array([2, 3], dtype=np.int64))
    wire = encode(frame) + encode(Frame(Kind.STATS, body={"a": 1}))
    reader = FrameReader()
    assert reader.feed(wire[:10]) == []  # a frame in pieces waits for the rest
    (got, size), (stats, _) = reader.feed(wire[10:])
    assert size == len(encode(frame))
    assert got.kind == Kind.DATA and got.seq == 5 and got.ids2.tolist() == [2, 3]
    np.testing.assert_array_equal(got.rows, ROWS)
    assert stats.body == {"a": 1}
    with pytest.raises(ValueError, match="impossible length"):
        FrameReader().feed(b"\x01\x00\x00\x00" + bytes(40))
    bad = bytearray(encode(frame))
    bad[0] += 8  # the length says 8 bytes more than the arrays hold
    with pytest.raises(ValueError, match="arrays of"):
        FrameReader().feed(bytes(bad) + bytes(8))


def test_pool_rows_count_128_byte_aggregators() -> None:
    assert pool_rows(10 * 128, 4) == 10  # 16 bytes: one aggregator
    assert pool_rows(10 * 128, 33) == 5  # 132 bytes: two
    assert pool_rows(0, 100) > 1 << 40  # unlimited


def test_unlimited_memory_sums_every_destination_in_the_switch() -> None:
    core = _core(0)
    out = core.handle(_data([0, 1], ROWS))
    assert [(r, f.kind) for r, f in out] == [(1, Kind.RESULT)]
    result = out[0][1]
    assert result.ids1.tolist() == [2, 3] and result.ids2.tolist() == [2, 1]
    np.testing.assert_array_equal(result.rows, [ROWS[0] + ROWS[1], ROWS[0]])
    stats = core.take_stats(5, 6)
    assert stats["aggregated"] == 3 and stats["raw"] == 0 and stats["peak_slots"] == 2


def test_a_full_pool_forwards_rows_raw_to_the_owner() -> None:
    """One aggregator: destination 2 takes it (first come); 0 -> 3 overflows
    and goes raw to worker 1, which sums it on the host."""
    core = _core(128)
    out = core.handle(_data([0, 1], ROWS))
    kinds = {f.kind: f for _, f in out}
    raw, result = kinds[Kind.RAW], kinds[Kind.RESULT]
    assert (raw.ids1.tolist(), raw.ids2.tolist()) == ([0], [3])
    np.testing.assert_array_equal(raw.rows, ROWS[:1])
    assert result.ids1.tolist() == [2] and result.ids2.tolist() == [2]
    assert core.take_stats(5, 6)["raw"] == 1


def test_a_resend_releases_the_aggregator_and_bypasses_it() -> None:
    """Row 0 waits in destination 2's aggregator; a resend of 0 -> 2 drops
    that partial sum (no row counted twice) and every later row of 2 goes
    straight to its owner."""
    core = _core(0)
    core.handle(_data([0], ROWS[:1]))  # 2 has 1 of 2 rows; 3 completes
    resend = _data([0], ROWS[:1], RESEND, ids2=np.array([2], dtype=np.int64))
    ((rank, raw),) = core.handle(resend)
    assert rank == 1 and raw.kind == Kind.RAW and raw.flags & BYPASS
    ((_, late),) = core.handle(_data([1], ROWS[1:]))
    assert late.kind == Kind.RAW and late.flags & BYPASS
    assert (late.ids1.tolist(), late.ids2.tolist()) == ([1], [2])
    stats = core.take_stats(5, 6)
    assert stats["bypassed"] == 2 and stats["results"] == 1  # only 3's


def test_fetch_ack_and_block_complete_go_where_they_belong() -> None:
    core = _core(0)
    core.handle(_data([0], ROWS[:1]))
    fetch = Frame(
        Kind.FETCH, 0, 0, sender=1, seq=5, block=0,
        ids1=np.array([1], dtype=np.int64), ids2=np.array([2], dtype=np.int64),
    )  # fmt: skip
    assert [(r, f.kind) for r, f in core.handle(fetch)] == [(0, Kind.FETCH)]
    ack = Frame(Kind.ACK, 0, 0, sender=1, seq=5, block=0, ids1=np.array([3]))
    ((rank, forwarded),) = core.handle(ack)
    assert rank == 0 and forwarded.ids1.tolist() == [3]  # to 3's sources' owner
    assert core.handle(Frame(Kind.DONE, 0, 0, sender=0, seq=5, block=0)) == []
    done = core.handle(Frame(Kind.DONE, 0, 0, sender=1, seq=5, block=0))
    assert sorted((r, f.kind) for r, f in done) == [
        (0, Kind.COMPLETE),
        (1, Kind.COMPLETE),
    ]
    assert core.handle(_data([1], ROWS[1:])) == []  # a straggler of that block
    assert core.take_stats(5, 6)["late_frames"] == 1


def test_loss_drops_data_frames_only() -> None:
    core = _core(0, loss=1.0)
    assert core.handle(_data([0, 1], ROWS)) == []
    resend = _data([0], ROWS[:1], RESEND, ids2=np.array([2], dtype=np.int64))
    assert len(core.handle(resend)) == 1  # retransmissions get through
    stats = core.take_stats(0, 10)
    assert stats["dropped_frames"] == 1 and stats["dropped_rows"] == 2


def test_frames_queued_past_the_threshold_are_marked_ecn() -> None:
    """The server marks ECN on a frame queued behind more than its threshold
    (SwitchGNN §3.4); the first frame, on an empty queue, is not marked."""
    import selectors
    import socket

    from graphwire.comm.switch.frames import ECN
    from graphwire.comm.switch.server import _Conn, _Server

    listener = socket.create_server(("127.0.0.1", 0))
    near, far = socket.socketpair()
    try:
        server = _Server(listener)
        server.ecn_bytes = 100
        conn = _Conn(near)
        server.sel.register(near, selectors.EVENT_READ, conn)
        server.send(conn, Frame(Kind.ACK, ids1=np.arange(20)))  # 196 bytes
        server.send(conn, Frame(Kind.ACK, ids1=np.arange(1)))
        frames = FrameReader().feed(bytes(conn.out))
        assert [f.flags & ECN for f, _ in frames] == [0, ECN]
    finally:
        for sock in (listener, near, far):
            sock.close()
