"""`tcp_stream`: one timed TCP stream between two processes in a namespace.

It checks that a :class:`~graphwire.testing.netns.ShapedNetwork` shapes what
it should (run it before a benchmark)."""

from __future__ import annotations

import json
import os
import select
import subprocess
import sys
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from graphwire.testing.netns.network import ShapedNetwork

__all__ = ["TcpStreamResult", "measure_tcp_throughput", "tcp_stream"]


@dataclass(frozen=True, slots=True)
class TcpStreamResult:
    """One TCP stream's payload as seen by the receiver.

    Attributes:
        num_bytes: payload bytes received.
        seconds: from the first byte received to end of stream.
    """

    num_bytes: int
    seconds: float

    @property
    def mbit_per_s(self) -> float:
        """Payload throughput in Mbit/s (10^6 bits)."""
        return self.num_bytes * 8 / self.seconds / 1e6


# Receiver: listens on argv[1] (a free port), prints the port, then counts bytes
# until the sender closes and prints them with the time from the first byte.
_SERVER = """
import json, socket, sys, time
srv = socket.socket()
srv.bind((sys.argv[1], 0))
srv.listen(1)
print(srv.getsockname()[1], flush=True)
conn, _ = srv.accept()
buf = bytearray(1 << 20)
num_bytes, start = 0, None
while True:
    n = conn.recv_into(buf)
    if not n:
        break
    if start is None:
        start = time.perf_counter()
    num_bytes += n
seconds = time.perf_counter() - start if start is not None else 0.0
print(json.dumps({"num_bytes": num_bytes, "seconds": seconds}), flush=True)
"""

# Sender: connects to argv[1]:argv[2] and sends for argv[3] seconds.
_CLIENT = """
import socket, sys, time
conn = socket.create_connection((sys.argv[1], int(sys.argv[2])))
chunk = bytes(256 << 10)
deadline = time.perf_counter() + float(sys.argv[3])
while time.perf_counter() < deadline:
    conn.sendall(chunk)
conn.shutdown(socket.SHUT_WR)
conn.recv(1)
"""


def tcp_stream(
    net: ShapedNetwork,
    seconds: float = 1.0,
    *,
    address: str = "127.0.0.1",
    timeout_s: float = 30.0,
) -> TcpStreamResult:
    """Send one TCP stream for ``seconds`` between two processes inside ``net``.

    Args:
        net: a live namespace.
        seconds: how long the sender sends.
        address: loopback address the receiver listens on (per-address mode:
            the class it falls in).
        timeout_s: give up (and kill both) after this long.

    Returns:
        What the receiver got, timed from its first byte to end of stream, so
        data queued in socket buffers when the sender stops is counted.
    """
    py = sys.executable
    server = net.popen([py, "-c", _SERVER, address], stdout=subprocess.PIPE, bufsize=0)
    try:
        port = int(_read_line(server, timeout_s))
        net.run(
            [py, "-c", _CLIENT, address, str(port), str(seconds)],
            check=True,
            timeout=timeout_s,
        )
        out, _ = server.communicate(timeout=timeout_s)
        if server.returncode != 0:
            raise RuntimeError(f"tcp_stream receiver exited {server.returncode}")
        result = json.loads(out.decode().strip().splitlines()[-1])
    finally:
        if server.poll() is None:
            server.kill()
            server.wait()
    if result["num_bytes"] == 0 or result["seconds"] <= 0:
        raise RuntimeError(f"{net.name}: tcp_stream received nothing: {result}")
    return TcpStreamResult(num_bytes=result["num_bytes"], seconds=result["seconds"])


def measure_tcp_throughput(
    net: ShapedNetwork, seconds: float = 1.0, *, address: str = "127.0.0.1"
) -> float:
    """Payload Mbit/s of a single TCP stream inside ``net`` (see `tcp_stream`).

    Run it before a benchmark: a shaped link should measure a little under its
    configured rate (headers take a few percent).
    """
    return tcp_stream(net, seconds, address=address).mbit_per_s


def _read_line(proc: subprocess.Popen[Any], timeout_s: float) -> str:
    """First line of ``proc``'s unbuffered stdout, or RuntimeError after timeout."""
    assert proc.stdout is not None
    fd = proc.stdout.fileno()
    data = b""
    deadline = time.monotonic() + timeout_s
    while b"\n" not in data:
        left = deadline - time.monotonic()
        if left <= 0:
            raise RuntimeError(f"no line from {proc.args!r} in {timeout_s} s")
        ready, _, _ = select.select([fd], [], [], left)
        if ready:
            chunk = os.read(fd, 4096)
            if not chunk:
                raise RuntimeError(
                    f"{proc.args!r} exited ({proc.wait()}) before printing a line"
                )
            data += chunk
    return data.split(b"\n", 1)[0].decode()
