"""The switch process: :class:`~.core.SwitchCore` behind a TCP listener.

``graphwire switch --listen 127.0.0.1:PORT`` runs :func:`serve`; so does
``graphwire train --exchange switch`` on rank 0 when no ``--switch-addr`` is
given (:func:`start_switch`). Workers connect, say HELLO (rank 0 with the
run's settings: ownership ranges, aggregator memory, loss, ECN threshold);
once every worker has, each gets READY and the data plane runs until every
worker has said BYE.

Why TCP and not ``torch.distributed``: the switch is not a rank. A rank in
the process group would join every collective (the gradient all-reduce, the
barriers), and point-to-point receives there must name their source and
size in advance, where the switch serves whichever worker sends next. A
socket per worker, read by one ``selectors`` loop, is what a switch port is.

Each connection has an output queue. A frame queued behind more than
``ecn_bytes`` gets the ECN bit (SwitchGNN §3.4: marking above a queue
threshold); the senders halve their window on it.

A worker that disconnects without BYE ends the run: every other worker gets
ABORT naming it, and the switch exits with status 1.

For ``graphwire simulate``: with ``GRAPHWIRE_SWITCH_TRACE=FILE`` in its
environment (set by the simulator's capture, read here only), the switch
writes ``FILE`` (``.npy``, int64) as it exits: a row per frame it sent,
``[worker, frame number on that link, then per worker the last of its frames
this one needed, -1: none]``. A frame needs the frame that made the switch
send it; a result also every frame whose rows were summed into it; a
multicast that waited for every worker, every frame seen so far.
"""

from __future__ import annotations

import os
import select
import selectors
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from graphwire.comm.switch.core import SwitchCore, SwitchProtocolError
from graphwire.comm.switch.frames import ECN, Frame, FrameReader, Kind, encode
from graphwire.fsutil import atomic_file

__all__ = ["TRACE_ENV", "die_with", "parse_address", "serve", "start_switch"]

TRACE_ENV = "GRAPHWIRE_SWITCH_TRACE"

DEFAULT_ECN_BYTES = 256 * 1024
_READY_LINE = "graphwire switch: listening on "


def parse_address(text: str) -> tuple[str, int]:
    """``"HOST:PORT"`` -> ``(host, port)``.

    Raises:
        ValueError: naming ``text`` when it is not one.
    """
    host, sep, port = text.rpartition(":")
    if not sep or not host or not port.isdigit() or int(port) > 65535:
        raise ValueError(f"switch address: expected HOST:PORT, got {text!r}")
    return host, int(port)


@dataclass
class _Conn:
    sock: socket.socket
    reader: FrameReader = field(default_factory=FrameReader)
    out: bytearray = field(default_factory=bytearray)
    rank: int = -1
    bye: bool = False
    frames_in: int = 0  # frames received on this link (numbers, as the worker's)
    frames_out: int = 0


class _Server:
    def __init__(self, listener: socket.socket) -> None:
        self.listener = listener
        self.sel = selectors.DefaultSelector()
        self.sel.register(listener, selectors.EVENT_READ)
        self.conns: dict[int, _Conn] = {}  # by rank
        self.core: SwitchCore | None = None
        self.world = 0
        self.ecn_bytes = DEFAULT_ECN_BYTES
        self.failed: str | None = None
        self.trace: list[np.ndarray] | None = None  # rows of the causality trace
        self._cause: tuple[int, int] | None = None  # (worker, frame) in hand

    # ------------------------------------------------------------- sending
    def send(self, conn: _Conn, frame: Frame) -> None:
        if self.trace is not None:
            self._trace(conn, frame)
        conn.frames_out += 1
        data = bytearray(encode(frame))
        if len(conn.out) > self.ecn_bytes:
            data[5] |= ECN  # the flags byte, after the length and the kind
            if self.core is not None:
                self.core.stats_for(frame.seq)["ecn_marks"] += 1
        conn.out += data
        self._watch(conn)

    def _trace(self, conn: _Conn, frame: Frame) -> None:
        deps = np.full(self.world, -1, dtype=np.int64)
        if frame.deps is not None:
            deps[: frame.deps.size] = frame.deps
        if self._cause is not None and 0 <= self._cause[0] < self.world:
            rank, number = self._cause
            deps[rank] = max(deps[rank], number)
        assert self.trace is not None
        self.trace.append(np.concatenate([[conn.rank, conn.frames_out], deps]))

    def _watch(self, conn: _Conn) -> None:
        events = selectors.EVENT_READ | (selectors.EVENT_WRITE if conn.out else 0)
        self.sel.modify(conn.sock, events, conn)

    def flush(self, conn: _Conn) -> None:
        try:
            sent = conn.sock.send(conn.out)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            conn.out.clear()
            return
        del conn.out[:sent]
        self._watch(conn)

    def abort(self, why: str) -> None:
        """Tell every connected worker ``why`` the run ends."""
        self.failed = why
        for conn in self.conns.values():
            if not conn.bye:
                self.send(conn, Frame(Kind.ABORT, body={"error": why}))

    # ------------------------------------------------------------- frames
    def on_frame(self, conn: _Conn, frame: Frame) -> None:
        number = conn.frames_in
        conn.frames_in += 1
        self._cause = (conn.rank, number)
        try:
            self._on_frame(conn, frame, number)
        finally:
            self._cause = None

    def _on_frame(self, conn: _Conn, frame: Frame, number: int) -> None:
        if frame.kind == Kind.HELLO:
            self._cause = None  # (the worker's rank is not known yet)
            self.hello(conn, frame.body)
            return
        if self.core is None:
            raise SwitchProtocolError(f"{frame.name} before every worker said HELLO")
        frame.sender = conn.rank
        if frame.kind == Kind.BYE:
            conn.bye = True
            return
        if frame.kind == Kind.STATS:
            # seq..block: the passes asked about (block: one past the last).
            stats = self.core.take_stats(frame.seq, frame.block)
            self.send(conn, Frame(Kind.STATS, body=stats))
            return
        self.core.number = number
        self.core.seen[conn.rank] = number
        for rank, out in self.core.handle(frame):
            target = self.conns.get(rank)
            if target is not None and not target.bye:
                self.send(target, out)

    def hello(self, conn: _Conn, body: dict[str, Any]) -> None:
        rank, world = int(body["rank"]), int(body["world"])
        if self.world and world != self.world or rank in self.conns:
            raise SwitchProtocolError(
                f"worker {rank} of {world} said HELLO to a switch of "
                f"{self.world or '?'} workers that has ranks {sorted(self.conns)}"
            )
        self.world = world
        conn.rank = rank
        self.conns[rank] = conn
        config = body.get("config")
        if config is not None:
            self.ecn_bytes = int(config.get("ecn_bytes", DEFAULT_ECN_BYTES))
            self.core = SwitchCore(
                world,
                config["offsets"],
                int(config["mem_bytes"]),
                float(config.get("loss", 0.0)),
                int(config.get("seed", 0)),
            )
            self.core.causal = self.trace is not None
        if self.core is not None and len(self.conns) == world:
            for other in self.conns.values():
                self.send(other, Frame(Kind.READY))

    # ---------------------------------------------------------------- loop
    def run(self) -> int:
        while True:
            for key, events in self.sel.select(timeout=1.0):
                if key.fileobj is self.listener:
                    sock, _ = self.listener.accept()
                    sock.setblocking(False)
                    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                    conn = _Conn(sock)
                    self.sel.register(sock, selectors.EVENT_READ, conn)
                    continue
                conn = key.data
                if events & selectors.EVENT_WRITE:
                    self.flush(conn)
                if events & selectors.EVENT_READ:
                    self.read(conn)
            if self.finished():
                return 1 if self.failed else 0

    def read(self, conn: _Conn) -> None:
        try:
            data = conn.sock.recv(1 << 20)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            data = b""
        if not data:
            self.sel.unregister(conn.sock)
            conn.sock.close()
            conn.out.clear()
            if conn.rank < 0:
                return
            self.conns.pop(conn.rank, None)
            if not conn.bye:
                conn.bye = True
                self.abort(
                    f"worker {conn.rank} left the switch without saying goodbye "
                    "(its process ended?)"
                )
            return
        try:
            for frame, _ in conn.reader.feed(data):
                self.on_frame(conn, frame)
        except (SwitchProtocolError, ValueError, KeyError) as error:
            self.abort(f"switch: {error}")

    def finished(self) -> bool:
        """Every worker said BYE (or the run failed) and every queue is out."""
        drained = not any(c.out for c in self.conns.values())
        if self.failed:
            return drained
        return bool(self.world) and drained and all(c.bye for c in self.conns.values())


def serve(host: str, port: int, *, announce: bool = True) -> int:
    """Run a switch on ``host:port`` (port 0: the OS picks) until its workers
    leave; returns the exit status (0, or 1 after a failure)."""
    listener = socket.create_server((host, port))
    listener.setblocking(False)
    bound = listener.getsockname()
    if announce:
        print(f"{_READY_LINE}{bound[0]}:{bound[1]}", flush=True)
    server = _Server(listener)
    trace_file = os.environ.get(TRACE_ENV)
    if trace_file:
        server.trace = []
    try:
        status = server.run()
    finally:
        for conn in list(server.conns.values()):
            conn.sock.close()
        listener.close()
    if trace_file and server.trace is not None:
        _write_trace(trace_file, server.trace, server.world)
    if server.failed:
        print(f"graphwire switch: {server.failed}", file=sys.stderr, flush=True)
    return status


def _write_trace(path: str, rows: list[np.ndarray], world: int) -> None:
    table = np.stack(rows) if rows else np.zeros((0, world + 2), dtype=np.int64)
    with atomic_file(path, "wb") as out:
        np.save(out, table)


def start_switch(
    host: str = "127.0.0.1", timeout_s: float = 60.0
) -> tuple[subprocess.Popen[str], str]:
    """Start ``graphwire switch --listen HOST:0`` as a child of this process.

    It dies with this process (``PR_SET_PDEATHSIG``, through
    ``--parent-pid``). Returns the process and the ``HOST:PORT`` it listens
    on.

    Raises:
        RuntimeError: it did not announce its address in ``timeout_s``.
    """
    # ``python -m graphwire.comm.switch``: the switch without torch's import
    # (the ``graphwire switch`` command's start costs two seconds more).
    process = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "graphwire.comm.switch",
            "--listen",
            f"{host}:0",
            "--parent-pid",
            str(os.getpid()),
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    assert process.stdout is not None
    deadline = time.monotonic() + timeout_s
    line = ""
    while time.monotonic() < deadline:
        ready, _, _ = select.select([process.stdout], [], [], 0.5)
        if not ready:
            continue
        line = process.stdout.readline()
        if line.startswith(_READY_LINE) or not line:
            break
    if not line.startswith(_READY_LINE):
        process.kill()
        process.wait()
        raise RuntimeError(
            f"the switch process (PID {process.pid}) did not start: {line!r}"
        )
    return process, line[len(_READY_LINE) :].strip()


def die_with(parent_pid: int) -> None:
    """End this process when ``parent_pid`` ends (Linux ``PR_SET_PDEATHSIG``;
    elsewhere nothing), or now if it already has."""
    if sys.platform.startswith("linux"):
        import ctypes
        import signal

        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, int(signal.SIGKILL))  # 1 = PR_SET_PDEATHSIG
    if os.getppid() != parent_pid:
        raise SystemExit(f"graphwire switch: its parent {parent_pid} has ended")
