"""`ShapedNetwork`: a throwaway network namespace whose loopback is bandwidth-shaped.

Tests and benchmarks run workers inside it so that bytes on the wire cost real
wall-clock time, as on a 1–10 Gbit/s cluster (ARCHITECTURE §4, network emulation).
Only loopback addresses (127.0.0.0/8) exist in the namespace, so nothing it runs
can reach another machine.

Two shaping modes, both on ``lo`` (every packet in the namespace leaves through
it, so each byte is shaped once):

- **One shared link** (default): a ``tbf`` root qdisc at ``rate_mbit``. All
  workers share it in both directions: 4 workers at 1000 Mbit/s are roughly 4
  machines with 250 Mbit/s NICs.
- **Per-address links** (``per_address={"127.0.0.2": 250, ...}``): an ``htb``
  root with one class per address, matched on the packet's *destination*. A
  class caps what is sent *to* that address (its downlink); a process's uplink
  is not capped separately. Traffic to other addresses uses a default class at
  ``rate_mbit``, or is unshaped when ``rate_mbit`` is None; so does IPv6
  (``::1``, and IPv4-mapped sockets such as c10d's TCPStore). For the cap to
  apply to both directions of a TCP connection, both ends must use their own
  address (listen on it, and bind before connecting). gloo does not: a device
  made with ``create_device(hostname="127.0.0.2")`` listens there, but the
  peer connects from 127.0.0.1, so only half of each pair's traffic is
  classed. Use the shared link for gloo benchmarks.

torch.distributed gloo workers started with `ShapedNetwork.popen` work with
``MASTER_ADDR=127.0.0.1``; set ``GLOO_SOCKET_IFNAME=lo`` so gloo does not
depend on what the machine's hostname resolves to (the namespace has only
``lo``).

``rate_mbit=None`` without ``per_address`` gives an unshaped namespace (same
MTU), the baseline for :func:`measure_tcp_throughput`.

Needs root (CAP_SYS_ADMIN and CAP_NET_ADMIN), ``ip`` and ``tc``;
:func:`netns_available` says whether they are there and, if not, why.

Example::

    ok, reason = netns_available()
    with ShapedNetwork(rate_mbit=1000) as net:
        mbit = measure_tcp_throughput(net)  # check the shaper first
        procs = [net.popen([sys.executable, "worker.py"]) for _ in range(4)]
        ...
        print(net.qdisc_bytes())  # report beside the ledger
"""

from __future__ import annotations

import atexit
import functools
import ipaddress
import itertools
import json
import os
import re
import select
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from graphwire.sigterm import STOP_SIGNALS, interrupt_on_stop_signals

__all__ = [
    "ShapeConfig",
    "ShapedNetwork",
    "TcpStreamResult",
    "measure_tcp_throughput",
    "netns_available",
    "tcp_stream",
]

NAME_PREFIX = "gw-"
MIN_BURST_KB = 256  # below this tbf drops 64 KB GSO packets on lo (ARCHITECTURE §4)
MIN_RATE_MBIT = 0.001  # tc's rates are whole kbit/s
_CAP_NET_ADMIN = 12
_CAP_SYS_ADMIN = 21
_COUNTER = itertools.count()
_LIVE: set[str] = set()  # namespaces made by this process and not yet deleted
_ATEXIT_REGISTERED = False
_HELD: dict[int, Any] = {}  # signal -> what _hold_stop_signals installed
_SENT_RE = re.compile(r"Sent (\d+) bytes")
_CLASS_BASE = 0x10  # htb class minor of the first per_address entry; 1:1 is default


@dataclass(kw_only=True, slots=True, frozen=True)
class ShapeConfig:
    """How the namespace's loopback is shaped.

    Attributes:
        rate_mbit: shared link rate in Mbit/s (``tbf``); with ``per_address`` the
            rate of traffic to unlisted addresses. None: unshaped.
        burst_kb: token bucket depth in KiB, at least 256.
        latency_ms: longest a packet may wait in the ``tbf`` queue before it is
            dropped (sets the queue length).
        mtu: ``lo`` MTU in bytes.
        per_address: loopback address -> Mbit/s of traffic sent to it (``htb``).
    """

    rate_mbit: float | None = 1000.0
    burst_kb: int = 256
    latency_ms: float = 50.0
    mtu: int = 9000
    per_address: Mapping[str, float] | None = None

    def __post_init__(self) -> None:
        if self.rate_mbit is not None and not self.rate_mbit >= MIN_RATE_MBIT:
            raise ValueError(
                f"rate_mbit: expected >= {MIN_RATE_MBIT} (tc's 1 kbit/s) or None, "
                f"got {self.rate_mbit}"
            )
        if self.burst_kb < MIN_BURST_KB:
            raise ValueError(
                f"burst_kb: expected >= {MIN_BURST_KB} (smaller bursts drop "
                f"packets on lo), got {self.burst_kb}"
            )
        if not self.latency_ms > 0:
            raise ValueError(f"latency_ms: expected > 0, got {self.latency_ms}")
        if not 1280 <= self.mtu <= 65536:
            raise ValueError(f"mtu: expected 1280..65536, got {self.mtu}")
        for address, mbit in (self.per_address or {}).items():
            try:
                ip = ipaddress.ip_address(address)
            except ValueError:
                ip = None
            if ip is None or ip.version != 4 or not ip.is_loopback:
                raise ValueError(
                    f"per_address: expected IPv4 loopback addresses (127.0.0.0/8), "
                    f"got {address!r}"
                )
            if not mbit >= MIN_RATE_MBIT:
                raise ValueError(
                    f"per_address[{address!r}]: expected >= {MIN_RATE_MBIT} "
                    f"(tc's 1 kbit/s), got {mbit}"
                )


class ShapedNetwork:
    """A network namespace with shaped loopback; a context manager.

    Entering creates the namespace (``gw-<pid>-<n>``), brings ``lo`` up, sets
    its MTU and installs the qdisc. Leaving kills every process still in the
    namespace (SIGTERM, then SIGKILL after ``grace_s``; by PID) and deletes
    it, also when the body raises or is interrupted. SIGTERM and SIGHUP too
    interrupt (raise ``KeyboardInterrupt``) while a namespace is live, each
    where it would end the process with no clean-up: its default, in the
    main thread; the default is put back when the last namespace is gone.

    Args:
        rate_mbit, burst_kb, latency_ms, mtu, per_address: see `ShapeConfig`.
        grace_s: seconds processes get between SIGTERM and SIGKILL at exit.
    """

    def __init__(
        self,
        *,
        rate_mbit: float | None = 1000.0,
        burst_kb: int = 256,
        latency_ms: float = 50.0,
        mtu: int = 9000,
        per_address: Mapping[str, float] | None = None,
        grace_s: float = 1.0,
    ) -> None:
        self.config = ShapeConfig(
            rate_mbit=rate_mbit,
            burst_kb=burst_kb,
            latency_ms=latency_ms,
            mtu=mtu,
            per_address=dict(per_address) if per_address else None,
        )
        self.grace_s = grace_s
        self.name = f"{NAME_PREFIX}{os.getpid()}-{next(_COUNTER)}"
        self._ip = _tool("ip")
        self._tc = _tool("tc")
        self._procs: list[subprocess.Popen[Any]] = []
        self._entered = False

    # ------------------------------------------------------------ lifecycle
    def __enter__(self) -> ShapedNetwork:
        if self._entered:
            raise RuntimeError(f"{self.name}: a ShapedNetwork can be entered once")
        self._entered = True
        _register_atexit()
        _hold_stop_signals()
        # Live before `ip netns add` runs: an interrupt while it runs (it
        # goes on to create the namespace) still removes the namespace.
        _LIVE.add(self.name)
        try:  # a failure or Ctrl-C while setting up still removes the namespace
            _run([self._ip, "netns", "add", self.name])
            self._setup()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Kill the processes left inside, then delete the namespace. Idempotent."""
        if self.name not in _LIVE:
            return
        try:
            _kill_namespace(self.name, self._ip, self._procs, self.grace_s)
        finally:
            _delete_namespace(self.name, self._ip)
            _release_stop_signals()

    def _setup(self) -> None:
        cfg = self.config
        self._in_ns([self._ip, "link", "set", "lo", "up"])
        self._in_ns([self._ip, "link", "set", "lo", "mtu", str(cfg.mtu)])
        burst = f"{cfg.burst_kb}kb"
        if cfg.per_address:
            self._setup_htb(burst)
        elif cfg.rate_mbit is not None:
            tc_lo = [self._tc, "qdisc", "add", "dev", "lo", "root", "tbf"]
            self._in_ns(
                [*tc_lo, "rate", _kbit(cfg.rate_mbit), "burst", burst]
                + ["latency", f"{cfg.latency_ms}ms"]
            )

    def _setup_htb(self, burst: str) -> None:
        cfg = self.config
        assert cfg.per_address
        # Unclassified packets go to class 1:1, or straight out (unshaped) when
        # htb's default names no class.
        default = "1" if cfg.rate_mbit is not None else "0"
        self._in_ns(
            [self._tc, "qdisc", "add", "dev", "lo", "root", "handle", "1:"]
            + ["htb", "default", default]
        )
        classes: list[tuple[int, float, str | None]] = []
        if cfg.rate_mbit is not None:
            classes.append((1, cfg.rate_mbit, None))
        for i, (addr, addr_mbit) in enumerate(sorted(cfg.per_address.items())):
            classes.append((_CLASS_BASE + i, addr_mbit, addr))
        # tc reads class minors as hex.
        for minor, mbit, address in classes:
            rate = _kbit(mbit)
            self._in_ns(
                [self._tc, "class", "add", "dev", "lo", "parent", "1:"]
                + ["classid", f"1:{minor:x}", "htb", "rate", rate, "ceil", rate]
                + ["burst", burst, "cburst", burst]
            )
            if address is not None:
                self._in_ns(
                    [self._tc, "filter", "add", "dev", "lo", "parent", "1:"]
                    + ["protocol", "ip", "prio", "1", "u32"]
                    + ["match", "ip", "dst", f"{address}/32", "flowid", f"1:{minor:x}"]
                )

    def _in_ns(self, argv: Sequence[str]) -> str:
        return _run(self.command(argv))

    # ------------------------------------------------------------ processes
    def command(self, argv: Sequence[str]) -> list[str]:
        """``argv`` prefixed to run inside the namespace (``ip netns exec NAME``).

        ``ip netns exec`` execs in place, so the PID of the started process is
        the PID of ``argv[0]``.
        """
        return [self._ip, "netns", "exec", self.name, *argv]

    def popen(self, argv: Sequence[str], **kwargs: Any) -> subprocess.Popen[Any]:
        """Start ``argv`` inside the namespace; it is killed at exit if still alive.

        Args:
            argv: program and arguments.
            **kwargs: passed to `subprocess.Popen` (``env``, ``stdout``, ...).
        """
        self._check_live()
        proc: subprocess.Popen[Any] = subprocess.Popen(self.command(argv), **kwargs)
        self._procs.append(proc)
        return proc

    def run(
        self, argv: Sequence[str], **kwargs: Any
    ) -> subprocess.CompletedProcess[Any]:
        """Run ``argv`` inside the namespace to completion (`subprocess.run`)."""
        self._check_live()
        return subprocess.run(self.command(argv), **kwargs)

    def pids(self) -> list[int]:
        """PIDs of all processes now in the namespace (children included)."""
        return _namespace_pids(self.name, self._ip)

    # ------------------------------------------------------------ counters
    def qdisc_bytes(self) -> int:
        """Bytes the root qdisc on ``lo`` has sent, headers included.

        Every byte between processes in the namespace crosses it once; compare
        with the ledger's payload bytes. 0 when unshaped (``lo`` has no queue).
        """
        self._check_live()
        out = self._in_ns([self._tc, "-s", "qdisc", "show", "dev", "lo"])
        for block in re.split(r"\n(?=qdisc )", out):
            if " root " in block.splitlines()[0] + " ":
                match = _SENT_RE.search(block)
                if match:
                    return int(match.group(1))
        raise RuntimeError(f"{self.name}: no root qdisc byte count in:\n{out}")

    def address_bytes(self) -> dict[str, int]:
        """Per-address mode: bytes sent to each address in ``per_address``."""
        self._check_live()
        if not self.config.per_address:
            raise RuntimeError(f"{self.name}: address_bytes needs per_address")
        out = self._in_ns([self._tc, "-s", "class", "show", "dev", "lo"])
        sent: dict[int, int] = {}
        for block in re.split(r"\n(?=class )", out):
            match = re.match(r"class htb 1:([0-9a-f]+) ", block)
            count = _SENT_RE.search(block)
            if match and count:
                sent[int(match.group(1), 16)] = int(count.group(1))
        addresses = sorted(self.config.per_address)
        return {a: sent.get(_CLASS_BASE + i, 0) for i, a in enumerate(addresses)}

    def _check_live(self) -> None:
        if self.name not in _LIVE:
            raise RuntimeError(f"{self.name}: namespace is not live (use `with`)")


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


@functools.cache
def netns_available() -> tuple[bool, str]:
    """Whether `ShapedNetwork` can work here; if not, why (for a skip message).

    Checks privileges, the ``ip`` and ``tc`` tools, and that a probe namespace
    with a shaped ``lo`` can be created and deleted. Cached: the probe runs once.
    """
    if not sys.platform.startswith("linux"):
        return False, f"network namespaces need Linux, this is {sys.platform}"
    missing = [
        cap
        for bit, cap in (
            (_CAP_NET_ADMIN, "CAP_NET_ADMIN"),
            (_CAP_SYS_ADMIN, "CAP_SYS_ADMIN"),
        )
        if not _has_capability(bit)
    ]
    if missing:
        return False, f"needs root ({' and '.join(missing)} missing)"
    for tool in ("ip", "tc"):
        if shutil.which(tool) is None:
            return False, f"`{tool}` not found on PATH (install iproute2)"
    try:
        with ShapedNetwork(rate_mbit=1000) as net:
            net.qdisc_bytes()
    except (RuntimeError, OSError) as err:
        return False, f"probe namespace failed: {err}"
    return True, ""


# ------------------------------------------------------------------ helpers
def _tool(name: str) -> str:
    path = shutil.which(name)
    if path is None:
        raise RuntimeError(f"`{name}` not found on PATH (install iproute2)")
    return path


def _run(argv: Sequence[str]) -> str:
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=30)
    if proc.returncode != 0:
        raise RuntimeError(
            f"`{' '.join(argv)}` exited {proc.returncode}: {proc.stderr.strip()}"
        )
    return proc.stdout


def _kbit(mbit: float) -> str:
    return f"{round(mbit * 1000)}kbit"


def _has_capability(bit: int) -> bool:
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("CapEff:"):
                    return bool(int(line.split()[1], 16) >> bit & 1)
    except OSError:
        pass
    return os.geteuid() == 0


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


def _namespace_pids(name: str, ip: str) -> list[int]:
    proc = subprocess.run(
        [ip, "netns", "pids", name], capture_output=True, text=True, timeout=30
    )
    return [int(p) for p in proc.stdout.split()]


def _signal(pid: int, sig: signal.Signals) -> None:
    try:
        os.kill(pid, sig)
    except ProcessLookupError:
        pass


def _kill_namespace(
    name: str, ip: str, procs: Sequence[subprocess.Popen[Any]], grace_s: float
) -> None:
    """SIGTERM every process in the namespace, SIGKILL survivors; reap ours."""
    mine = [p for p in procs if p.poll() is None]
    pids = set(_namespace_pids(name, ip)) | {p.pid for p in mine}
    for pid in pids:
        _signal(pid, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    try:
        while pids and time.monotonic() < deadline:
            time.sleep(0.02)
            for p in mine:
                p.poll()  # reap, so an exited child leaves the namespace
            pids = set(_namespace_pids(name, ip)) & pids
    finally:  # a Ctrl-C in the grace period cuts it short, not the SIGKILL
        for pid in pids | set(_namespace_pids(name, ip)):
            _signal(pid, signal.SIGKILL)
        for p in mine:
            p.wait()


def _delete_namespace(name: str, ip: str) -> None:
    """Delete ``name``; one that does not exist (an interrupt came before
    ``ip netns add`` made it) is already gone."""
    try:
        _run([ip, "netns", "del", name])
    except RuntimeError:
        if name in _run([ip, "netns", "list"]).split():
            raise
    _LIVE.discard(name)


def _hold_stop_signals() -> None:
    """Make SIGTERM and SIGHUP interrupt
    (:func:`graphwire.sigterm.interrupt_on_stop_signals`) until
    :func:`_release_stop_signals`, each where it has its default (which
    deletes no namespace) and this is the main thread; else leave it be."""
    if _HELD:
        return
    before = {signum: signal.getsignal(signum) for signum in STOP_SIGNALS}
    interrupt_on_stop_signals()
    for signum, handler in before.items():
        if handler is signal.SIG_DFL:
            installed = signal.getsignal(signum)
            if installed is not signal.SIG_DFL:
                _HELD[signum] = installed


def _release_stop_signals() -> None:
    """Put the defaults back once no namespace is live, for each signal
    whose handler is still the one :func:`_hold_stop_signals` installed."""
    if _LIVE or not _HELD:
        return
    if threading.current_thread() is not threading.main_thread():
        return  # signal.signal works only there; a later release may
    for signum, handler in _HELD.items():
        if signal.getsignal(signum) is handler:
            signal.signal(signum, signal.SIG_DFL)
    _HELD.clear()


def _register_atexit() -> None:
    global _ATEXIT_REGISTERED
    if not _ATEXIT_REGISTERED:
        atexit.register(_cleanup_at_exit)
        _ATEXIT_REGISTERED = True


def _cleanup_at_exit() -> None:
    """Safety net for namespaces left by a `ShapedNetwork` never closed."""
    ip = shutil.which("ip") or "ip"
    for name in sorted(_LIVE):
        try:
            _kill_namespace(name, ip, [], grace_s=0.2)
            _delete_namespace(name, ip)
        except (RuntimeError, OSError, subprocess.SubprocessError):
            pass
