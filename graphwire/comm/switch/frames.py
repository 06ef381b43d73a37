"""The switch's wire format: length-prefixed frames over one TCP connection.

Every frame is a 4-byte little-endian length, a 32-byte header and a payload
of up to three arrays::

    header  kind u8, flags u8, plan u16, sender u16, (pad u16), seq u32,
            block u32, n1 u32, n2 u32, rows u32, width u32
    payload ids1 int64 [n1], ids2 int64 [n2], rows float32 [rows, width]
            (or, for CONFIG, STATS and ABORT, UTF-8 JSON in place of ids1)

SwitchGNN's packet carries one vertex (Src_id, Dst_id, Block_id, Count and
four flag bits, 100 bits); a frame here carries up to
:data:`PACKET_BYTES` of rows of one block, which keeps the Python data plane
to one vectorised step per frame. The rows are the payload a worker's link
carries; the header and ID arrays are the protocol's overhead and are counted
apart (:func:`payload_bytes`, :func:`overhead_bytes`).
"""

from __future__ import annotations

import json
import struct
from dataclasses import dataclass, field
from typing import Any

import numpy as np

__all__ = [
    "ECN",
    "BACKWARD",
    "BYPASS",
    "HEADER",
    "PACKET_BYTES",
    "RESEND",
    "Frame",
    "FrameReader",
    "Kind",
    "encode",
    "overhead_bytes",
    "payload_bytes",
]

PACKET_BYTES = 8192  # rows payload of a DATA frame: within a 9000-byte jumbo frame
HEADER = struct.Struct("<BBHHHIIIIII")
_LENGTH = struct.Struct("<I")
MAX_FRAME = 1 << 30  # a longer frame is a corrupt stream

# Flag bits (SwitchGNN's ECN and Resend; ours: bypass, direction).
ECN = 1
RESEND = 2
BYPASS = 4
BACKWARD = 8


class Kind:
    """Frame kinds. w: worker, s: switch."""

    HELLO = 1  # w->s: rank and world size (JSON); rank 0 adds the config
    TABLE = 2  # w->s: one block's edges: ids1 = sources, ids2 = destinations
    DATA = 3  # w->s: rows of ids1 (RESEND: one per (ids1, ids2) pair)
    RESULT = 4  # s->w: finished aggregates of ids1, ids2 = rows summed in each
    RAW = 5  # s->w: rows not aggregated, pairs (ids1 -> ids2): a row per pair,
    # or (as many rows as runs of equal ids1) one per run
    ACK = 6  # w->s->w: destinations ids1 have their aggregates
    FETCH = 7  # w->s->w: resend pairs (ids1 -> ids2), bypassing aggregation
    DONE = 8  # w->s: this worker has finished block ``block`` of ``seq``
    COMPLETE = 9  # s->w: every worker has (the block-complete multicast)
    STATS = 10  # w->s request, s->w reply (JSON): the data plane's counters
    ABORT = 11  # s->w: the run cannot go on (JSON: why)
    READY = 12  # s->w: HELLO answered, or every TABLE of a plan stored
    BYE = 13  # w->s: this worker is leaving
    SENT = 14  # w->s: this worker's DATA of the block is out; s->w: all is in

    NAMES = {
        1: "HELLO",
        2: "TABLE",
        3: "DATA",
        4: "RESULT",
        5: "RAW",
        6: "ACK",
        7: "FETCH",
        8: "DONE",
        9: "COMPLETE",
        10: "STATS",
        11: "ABORT",
        12: "READY",
        13: "BYE",
        14: "SENT",
    }


_EMPTY_IDS = np.zeros(0, dtype=np.int64)
_EMPTY_ROWS = np.zeros((0, 0), dtype=np.float32)


@dataclass(slots=True)
class Frame:
    """One decoded frame (see the module docstring)."""

    kind: int
    flags: int = 0
    plan: int = 0
    sender: int = 0
    seq: int = 0
    block: int = 0
    ids1: np.ndarray = field(default_factory=lambda: _EMPTY_IDS)
    ids2: np.ndarray = field(default_factory=lambda: _EMPTY_IDS)
    rows: np.ndarray = field(default_factory=lambda: _EMPTY_ROWS)
    body: Any = None  # JSON payload (CONFIG-like kinds)
    # Never on the wire: the frame's number on its link (each end counts the
    # frames it sent and received), and, in the switch when it traces
    # causality for the simulator, per worker the last frame of that
    # worker's this frame needed (int64 [world], -1: none).
    number: int = -1
    deps: np.ndarray | None = None

    @property
    def name(self) -> str:
        return Kind.NAMES.get(self.kind, f"kind {self.kind}")

    def reply(self, kind: int, flags: int = 0, **arrays: np.ndarray) -> Frame:
        """A frame of ``kind`` about this one's pass, block and direction,
        with ``flags`` added and ``arrays`` (``ids1``, ``ids2``, ``rows``)."""
        out = Frame(kind, flags | (self.flags & BACKWARD), self.plan)
        out.seq, out.block = self.seq, self.block
        for name, array in arrays.items():
            setattr(out, name, array)
        return out


def encode(frame: Frame) -> bytes:
    """``frame`` as bytes on the wire (length prefix included)."""
    if frame.body is not None:
        ids1 = json.dumps(frame.body).encode()
        n1, ids2, rows = len(ids1), b"", np.zeros((0, 0), dtype=np.float32)
        width = 0
        parts = [ids1]
        flags = frame.flags | 0x80  # JSON payload
    else:
        a = np.ascontiguousarray(frame.ids1, dtype=np.int64)
        b = np.ascontiguousarray(frame.ids2, dtype=np.int64)
        rows = np.ascontiguousarray(frame.rows, dtype=np.float32)
        if rows.ndim != 2:
            raise ValueError(f"frame rows: expected [rows, width], found {rows.shape}")
        n1, width = a.size, rows.shape[1]
        parts = [a.tobytes(), b.tobytes(), rows.tobytes()]
        ids2 = parts[1]
        flags = frame.flags
    header = HEADER.pack(
        frame.kind,
        flags,
        frame.plan,
        frame.sender,
        0,
        frame.seq,
        frame.block,
        n1,
        len(ids2) // 8,
        rows.shape[0],
        width,
    )
    length = HEADER.size + sum(len(p) for p in parts)
    return b"".join([_LENGTH.pack(length), header, *parts])


def payload_bytes(frame: Frame) -> int:
    """The rows' bytes of ``frame`` (what the link carries for the model)."""
    return int(frame.rows.size) * 4 if frame.body is None else 0


def overhead_bytes(frame: Frame, total: int) -> int:
    """The rest of a frame of ``total`` bytes: length, header, IDs, JSON."""
    return total - payload_bytes(frame)


class FrameReader:
    """Cuts a byte stream into frames.

    Raises:
        ValueError: a frame longer than :data:`MAX_FRAME` or whose arrays do not
            add up to its length (a corrupt stream).
    """

    def __init__(self) -> None:
        self._buf = bytearray()

    def feed(self, data: bytes) -> list[tuple[Frame, int]]:
        """Add ``data``; returns the frames it completed, each with its size."""
        self._buf += data
        out: list[tuple[Frame, int]] = []
        view = self._buf
        start = 0
        while len(view) - start >= _LENGTH.size:
            (length,) = _LENGTH.unpack_from(view, start)
            if length > MAX_FRAME or length < HEADER.size:
                raise ValueError(f"switch frame: impossible length {length}")
            end = start + _LENGTH.size + length
            if len(view) < end:
                break
            body = bytes(view[start + _LENGTH.size : end])
            out.append((_decode(body), end - start))
            start = end
        if start:
            del self._buf[:start]
        return out


def _decode(body: bytes) -> Frame:
    kind, flags, plan, sender, _, seq, block, n1, n2, nrows, width = HEADER.unpack_from(
        body, 0
    )
    at = HEADER.size
    if flags & 0x80:
        if at + n1 != len(body):
            raise ValueError(f"switch frame {kind}: JSON length {n1} does not fit")
        value = json.loads(body[at : at + n1].decode())
        return Frame(kind, flags & 0x7F, plan, sender, seq, block, body=value)
    need = at + 8 * (n1 + n2) + 4 * nrows * width
    if need != len(body):
        raise ValueError(
            f"switch frame {Kind.NAMES.get(kind, kind)}: arrays of {need - at} "
            f"bytes in a payload of {len(body) - at}"
        )
    ids1 = np.frombuffer(body, dtype=np.int64, count=n1, offset=at)
    at += 8 * n1
    ids2 = np.frombuffer(body, dtype=np.int64, count=n2, offset=at)
    at += 8 * n2
    rows = np.frombuffer(body, dtype=np.float32, count=nrows * width, offset=at)
    return Frame(
        kind, flags, plan, sender, seq, block, ids1, ids2, rows.reshape(nrows, width)
    )
