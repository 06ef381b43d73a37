"""`ShapedNetwork`: a network namespace whose loopback is bandwidth-shaped.

The module also holds its :class:`ShapeConfig`, and :func:`netns_available`
to tell whether one can be made here. See the package doc for the shaping
modes.
"""

from __future__ import annotations

import functools
import ipaddress
import itertools
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from graphwire.testing.netns.cleanup import (
    LIVE,
    delete_namespace,
    find_tool,
    hold_stop_signals,
    kill_namespace,
    namespace_pids,
    register_atexit,
    release_stop_signals,
    run_or_raise,
)

__all__ = [
    "MIN_BURST_KB",
    "MIN_RATE_MBIT",
    "NAME_PREFIX",
    "ShapeConfig",
    "ShapedNetwork",
    "netns_available",
]

NAME_PREFIX = "gw-"
MIN_BURST_KB = 256  # below this tbf drops 64 KB GSO packets on lo (ARCHITECTURE §4)
MIN_RATE_MBIT = 0.001  # tc's rates are whole kbit/s
_CAP_NET_ADMIN = 12
_CAP_SYS_ADMIN = 21
_COUNTER = itertools.count()
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
        self._ip = find_tool("ip")
        self._tc = find_tool("tc")
        self._procs: list[subprocess.Popen[Any]] = []
        self._entered = False

    # ------------------------------------------------------------ lifecycle
    def __enter__(self) -> ShapedNetwork:
        if self._entered:
            raise RuntimeError(f"{self.name}: a ShapedNetwork can be entered once")
        self._entered = True
        register_atexit()
        hold_stop_signals()
        # Live before `ip netns add` runs: an interrupt while it runs (it
        # goes on to create the namespace) still removes the namespace.
        LIVE.add(self.name)
        try:  # a failure or Ctrl-C while setting up still removes the namespace
            run_or_raise([self._ip, "netns", "add", self.name])
            self._setup()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Kill the processes left inside, then delete the namespace. Idempotent."""
        if self.name not in LIVE:
            return
        try:
            kill_namespace(self.name, self._ip, self._procs, self.grace_s)
        finally:
            delete_namespace(self.name, self._ip)
            release_stop_signals()

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
        return run_or_raise(self.command(argv))

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
        return namespace_pids(self.name, self._ip)

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
        if self.name not in LIVE:
            raise RuntimeError(f"{self.name}: namespace is not live (use `with`)")


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
