"""`SwitchLink`: a worker's connection to the switch process.

One TCP connection, driven without threads: :meth:`SwitchLink.poll` sends
what the socket takes of the output queue and returns the frames that
arrived, so a worker can keep sending a block while the switch's results
come back (neither side ever blocks on a full buffer).

Every byte is counted in the transport's ledger, with the switch as peer
``world_size`` (one past the last rank): the rows under the caller's data
tag (``fwd.L1``, ``bwd.L1``, ...), headers, IDs and control frames under its
control tag (``switch.L1``, ...).

A connection the switch closes, or a switch silent for ``timeout_s`` while a
worker waits on it, raises :class:`SwitchError` naming the switch.
"""

from __future__ import annotations

import select
import socket
import time
from collections.abc import Callable
from contextlib import nullcontext
from typing import Any

from graphwire.comm.ledger import Ledger
from graphwire.comm.switch.frames import (
    Frame,
    FrameReader,
    Kind,
    encode,
    payload_bytes,
)
from graphwire.comm.turns import waiting

__all__ = ["SwitchError", "SwitchLink"]


# Frames of a pass, counted under that pass's tags whenever they arrive.
_PASS_KINDS = {Kind.RESULT, Kind.RAW, Kind.ACK, Kind.FETCH, Kind.COMPLETE}


class SwitchError(RuntimeError):
    """The switch process is gone, silent, or ended the run."""


class SwitchLink:
    """This worker's connection to the switch at ``address`` (``HOST:PORT``).

    Args:
        address: where the switch listens.
        rank: this worker's rank.
        world_size: the number of workers.
        ledger: the transport's ledger (None: nothing counted).
        timeout_s: how long a wait on the switch may last (connecting included).
        config: rank 0's settings for the switch (the other ranks: None).
    """

    def __init__(
        self,
        address: str,
        rank: int,
        world_size: int,
        ledger: Ledger | None,
        timeout_s: float,
        config: dict[str, Any] | None = None,
    ) -> None:
        from graphwire.comm.switch.server import parse_address

        self.address = address
        self.rank = rank
        self.peer = world_size
        self.ledger = ledger
        self.timeout_s = timeout_s
        self.ecn = 0  # ECN-marked frames received
        self._reader = FrameReader()
        self._out = bytearray()
        self._held: list[Frame] = []
        self._tags = ("switch", "switch")
        self._pass_tags: dict[int, tuple[str, str]] = {}
        self._uncounted: list[tuple[Frame, int]] = []
        self.frames_out = 0  # frames sent and received: each one's number
        self.frames_in = 0
        # Called with each frame just before the ledger counts it (the
        # simulator's capture keeps the frame numbers).
        self.on_count: Callable[[Frame], None] | None = None
        host, port = parse_address(address)
        with waiting():
            self.sock = _connect(address, host, port, timeout_s)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.sock.setblocking(False)
        hello: dict[str, Any] = {"rank": rank, "world": world_size}
        if config is not None:
            hello["config"] = config
        self.send(Frame(Kind.HELLO, body=hello))
        self.wait_for(Kind.READY)

    # ------------------------------------------------------------- frames
    def tags(self, data: str, control: str, seq: int | None = None) -> None:
        """Count the frames from now on under ``data`` (rows) and ``control``;
        with ``seq``, also the frames of pass ``seq`` received before or after
        (a pass's frames can arrive while the previous pass ends)."""
        self._tags = (data, control)
        if seq is None:
            return
        self._pass_tags[seq] = (data, control)
        for old in [q for q in self._pass_tags if q < seq - 16]:
            del self._pass_tags[old]  # long over: no frame of it comes any more
        waiting = [(f, n) for f, n in self._uncounted if f.seq == seq]
        self._uncounted = [(f, n) for f, n in self._uncounted if f.seq != seq]
        for frame, size in waiting:
            self._count(frame, size, sent=False)

    def send(self, frame: Frame) -> None:
        """Queue ``frame`` (sent by :meth:`poll` and :meth:`flush`)."""
        frame.sender = self.rank
        frame.number = self.frames_out
        self.frames_out += 1
        data = encode(frame)
        self._count(frame, len(data), sent=True)
        self._out += data

    def _count(self, frame: Frame, size: int, *, sent: bool) -> None:
        if self.ledger is None:
            return
        rows = payload_bytes(frame)
        data_tag, control_tag = self._tags
        if not sent and frame.kind in _PASS_KINDS:
            tags = self._pass_tags.get(frame.seq)
            if tags is None:  # a pass not yet begun here: counted when it is
                self._uncounted.append((frame, size))
                return
            data_tag, control_tag = tags
        if self.on_count is not None:
            self.on_count(frame)
        record = self.ledger.record_send if sent else self.ledger.record_recv
        record(self.peer, data_tag, rows)
        record(self.peer, control_tag, size - rows)

    def unread(self, frames: list[Frame]) -> None:
        """Give ``frames`` back: the next :meth:`poll` returns them first."""
        self._held = frames + self._held

    def poll(self, wait_s: float) -> list[Frame]:
        """Send what the socket takes; return the frames that arrived within
        ``wait_s`` (possibly none), after any given back (:meth:`unread`)."""
        if self._held:
            held, self._held = self._held, []
            if self._out:
                self._write_some()
            return held
        if self.sock.fileno() < 0:
            raise SwitchError(
                f"the connection to the switch at {self.address} is closed"
            )
        readable, writable = _ready(self.sock, bool(self._out), wait_s)
        if writable:
            self._write()
        if not readable:
            return []
        try:
            data = self.sock.recv(1 << 20)
        except (BlockingIOError, InterruptedError):
            return []
        except OSError as error:
            raise self._gone(error) from error
        if not data:
            raise self._gone(None)
        frames = []
        for frame, size in self._reader.feed(data):
            frame.number = self.frames_in
            self.frames_in += 1
            self._count(frame, size, sent=False)
            if frame.flags & 1:
                self.ecn += 1
            if frame.kind == Kind.ABORT:
                raise SwitchError(
                    f"the switch at {self.address} ended the run: "
                    f"{frame.body.get('error', '?')}"
                )
            frames.append(frame)
        return frames

    def _write_some(self) -> None:
        if _ready(self.sock, True, 0.0)[1]:
            self._write()

    def _write(self) -> None:
        try:
            sent = self.sock.send(self._out)
        except (BlockingIOError, InterruptedError):
            return
        except OSError as error:
            raise self._gone(error) from error
        del self._out[:sent]

    def _gone(self, error: OSError | None) -> SwitchError:
        why = f": {error}" if error is not None else ""
        return SwitchError(
            f"the switch at {self.address} closed the connection{why} (did the "
            "switch process die?)"
        )

    @property
    def pending(self) -> int:
        """Bytes queued and not yet taken by the socket."""
        return len(self._out)

    def flush(self) -> None:
        """Send the whole output queue (frames that arrive meanwhile are kept)."""
        deadline = time.monotonic() + self.timeout_s
        while self._out:
            if time.monotonic() > deadline:
                raise SwitchError(
                    f"the switch at {self.address} took no data for {self.timeout_s:g}s"
                )
            if _ready(self.sock, True, 0.5)[1]:
                self._write()

    def wait_for(self, kind: int) -> Frame:
        """The next frame of ``kind`` (frames of other kinds are refused)."""
        deadline = time.monotonic() + self.timeout_s
        while time.monotonic() < deadline:
            frames = self.poll(0.5)
            for frame in frames:
                if frame.kind != kind:
                    raise SwitchError(
                        f"the switch at {self.address} sent {frame.name} where "
                        f"{Kind.NAMES[kind]} was expected"
                    )
            if frames:
                return frames[0]
        raise SwitchError(
            f"no {Kind.NAMES[kind]} from the switch at {self.address} in "
            f"{self.timeout_s:g}s"
        )

    def close(self) -> None:
        """Say BYE and close (quietly, if the switch is already gone)."""
        try:
            self.send(Frame(Kind.BYE))
            self.flush()
        except (SwitchError, OSError):
            pass
        self.sock.close()


def _connect(address: str, host: str, port: int, timeout_s: float) -> socket.socket:
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            return socket.create_connection((host, port), timeout=5.0)
        except OSError as error:
            if time.monotonic() > deadline:
                raise SwitchError(
                    f"cannot reach the switch at {address}: {error}"
                ) from error
            time.sleep(0.1)


def _ready(sock: socket.socket, write: bool, wait_s: float) -> tuple[bool, bool]:
    """Whether ``sock`` can be read, and written (asked only if ``write``),
    within ``wait_s``. ``poll``, not ``select``: a process with many ranks
    (the simulator's in-process ones) has descriptors past select's 1024."""
    poller = select.poll()
    poller.register(sock, select.POLLIN | (select.POLLOUT if write else 0))
    events = 0
    with waiting() if wait_s > 0 else nullcontext():  # graphwire.comm.turns
        ready = poller.poll(wait_s * 1000)
    for _, mask in ready:
        events |= mask
    readable = bool(events & (select.POLLIN | select.POLLHUP | select.POLLERR))
    return readable, bool(events & select.POLLOUT)
