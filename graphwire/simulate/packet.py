"""Packet-level simulation of a `Workload` on the real ns-3 network simulator.

Each send moves ``ceil(nbytes / PAYLOAD_BYTES)`` UDP packets (the last one short)
from its node to its ``dst`` over the topology's one route, pinned with static
host routes; every packet carries graphwire's 16-byte header (task, sequence).
Star and leaf-spine links are full-duplex point-to-point links. ``shared`` is
one half-duplex CSMA medium with no propagation delay, so that a frame holds it
only while serialised (as on the rate-shaped loopback it stands for); receivers
add ``delay_s`` instead. Every node with a link runs an ns-3 application written
in C++ (:mod:`graphwire.simulate._ns3_apps`); a C++ controller starts each task
when its deps have finished, so nothing runs in Python during the event loop.

The fabric is lossless, as RDMA fabrics are (and as DCQCN assumes): queues hold
every byte of the workload, and a drop raises. Switch egress queues are ns-3's
``RedQueueDisc`` set to step marking: a packet is marked CE when the queue holds
``ecn_threshold_bytes`` or more at its arrival (instantaneous length, MinTh =
MaxTh). ``ecn_marks`` counts the data packets that arrived marked.

Rate control is DCQCN-like, constants chosen: every send (a flow) starts at line
rate; a receiver answers CE-marked packets with a CNP to the sender, at most one
per flow per 50 us; a CNP sets the flow's target rate to its rate and cuts the
rate by alpha / 2 (floor: line rate / 1000), with DCQCN's alpha (starts at 1, so
the first CNP halves the rate; EWMA gain 1/16, raised by each CNP, decayed every
55 us); every 55 us without a CNP the target grows by line rate / 8 (cap: line
rate) and the rate moves halfway to it. Senders pace packets at their flow's
rate; several flows from one host share its NIC queue. The 50-55 us control
loop is slow next to the links: in a 3-to-1 incast of 1-20 MB per sender the
port idles 4-9% of the time after rates were cut too far.

Addresses come only from 198.18.0.0/15 (the benchmarking range) and exist only
inside the simulator: link subnets from 198.18.0.0/16, and each node's
destination addresses (one per set of routes that agree, so that plain
destination routing follows ``Topology.path`` exactly) from 198.19.0.0/16.

Link bytes count data packets as they start on each device, headers included:
``wire_bytes(nbytes)`` per link crossed on point-to-point links. CNPs (and, on
``shared``, ARP) are not counted. On ``shared`` the frames are Ethernet frames
(:data:`graphwire.simulate.wire.CSMA_EXTRA_BYTES` more per packet), all reported
under the medium's key ``(num_hosts, num_hosts)``; it has no switch, so no
queue figures either. Queues are measured in the queue disc plus the device
queue (IP packets plus framed packets), not the packet being serialised.
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import re
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

from graphwire.simulate._ns3_apps import APPS
from graphwire.simulate._ns3_fabric import FABRIC
from graphwire.simulate.topology import Topology
from graphwire.simulate.wire import CSMA_EXTRA_BYTES, HEADER_BYTES, PAYLOAD_BYTES
from graphwire.simulate.workload import LinkStats, SimResult, Workload

__all__ = [
    "ECN_THRESHOLD_BYTES",
    "SimulatorMissing",
    "import_ns3",
    "ns3_available",
    "simulate_packets",
]

# About 12 jumbo packets: DCTCP's K of ~65 1.5 KB packets at 10 Gbit/s, in bytes.
ECN_THRESHOLD_BYTES = 100_000
CNP_INTERVAL_S = 50e-6
INCREASE_PERIOD_S = 55e-6
INCREASE_STEP = 1 / 8  # of line rate, added to the target rate
ALPHA_G = 1 / 16  # DCQCN's gain of the congestion estimate
MIN_RATE = 1 / 1000  # of line rate
MAX_SAMPLES = 10_000

_LINK_NET = 0xC6120000  # 198.18.0.0/16: link subnets, the shared medium
_NODE_NET = 0xC6130000  # 198.19.0.0/16: destination addresses of nodes
# numpy dtype -> the C++ element type of Plan's vectors
_CTYPES = {
    "<i4": "int32_t",
    "<u4": "uint32_t",
    "<i8": "int64_t",
    "<u8": "uint64_t",
    "<f8": "double",
}


class SimulatorMissing(RuntimeError):
    """ns-3 (the ``ns3`` Python package) is not installed."""


_state: dict[str, Any] = {}


@contextlib.contextmanager
def _quiet_fds() -> Iterator[Any]:
    """Send fds 1 and 2 to a temp file (cling prints at import); yields the file."""
    with tempfile.TemporaryFile(mode="w+b") as sink:
        saved = [os.dup(1), os.dup(2)]
        try:
            for fd in (1, 2):
                os.dup2(sink.fileno(), fd)
            yield sink
        finally:
            for fd, old in zip((1, 2), saved, strict=True):
                os.dup2(old, fd)
                os.close(old)


# The ns-3 modules the applications use (their libraries load in this order,
# each after those it links to).
_MODULES = (
    *("core", "network", "stats", "bridge", "traffic-control", "internet"),
    *("point-to-point", "csma"),
)
_HEADERS = ("core", "network", "internet", "point-to-point", "csma", "traffic-control")


def import_ns3() -> Any:
    """Load ns-3 once per process, quietly; returns cppyy's ``ns3`` namespace.

    Only the modules the applications use: ``from ns import ns`` would parse
    every module's headers, several times as long.

    Raises:
        SimulatorMissing: the ``ns3`` package is not installed.
    """
    if "ns" not in _state:
        missing = SimulatorMissing(
            "ns-3 is not installed: pip install 'graphwire[sim]'"
        )
        try:
            spec = importlib.util.find_spec("ns3")
            import cppyy  # type: ignore[import-untyped]
            import libcppyy  # type: ignore[import-not-found]
        except (ImportError, ValueError) as err:
            raise missing from err
        if spec is None or not spec.submodule_search_locations:
            raise missing
        prefix = Path(next(iter(spec.submodule_search_locations)))
        found = {
            re.sub(r"^libns3[.0-9]*-|\.so$", "", lib.name): lib
            for lib in (prefix / "lib64").glob("libns3*.so")
        }
        if any(module not in found for module in _MODULES):
            raise missing
        with _quiet_fds():
            libcppyy.AddSmartPtrType("Ptr")
            cppyy.add_library_path(str(prefix / "lib64"))
            cppyy.add_include_path(str(prefix / "include"))
            for module in _HEADERS:
                cppyy.include(f"ns3/{module}-module.h")
            for module in _MODULES:
                cppyy.load_library(str(found[module]))
        _state["ns"] = cppyy.gbl.ns3
    return _state["ns"]


def ns3_available() -> bool:
    """Whether ns-3 imports (importing it, once, if so)."""
    try:
        import_ns3()
    except SimulatorMissing:
        return False
    return True


def _apps() -> Any:
    """The C++ namespace of graphwire's ns-3 applications, compiled once."""
    if "apps" not in _state:
        import_ns3()
        import cppyy  # type: ignore[import-untyped]

        with _quiet_fds() as sink:
            try:
                cppyy.cppdef(APPS + FABRIC)
            except Exception as err:
                sink.seek(0)
                log = sink.read().decode(errors="replace")
                raise RuntimeError(f"compiling the ns-3 apps failed: {log}") from err
        _state["apps"] = cppyy.gbl.graphwire_ns3
    return _state["apps"]


def simulate_packets(
    workload: Workload,
    topology: Topology,
    *,
    ecn_threshold_bytes: int = ECN_THRESHOLD_BYTES,
    queue_sample_s: float | None = None,
    rate_control: bool = True,
) -> SimResult:
    """Run ``workload`` on ``topology`` in ns-3, packet by packet.

    Args:
        workload: the tasks; nodes are ``topology``'s (hosts, and switches as
            the end points of sends where the topology has them).
        topology: the fabric (see :class:`Topology`).
        ecn_threshold_bytes: switch egress queues mark CE at this many bytes.
        queue_sample_s: sample the busiest switch queue this often; None: every
            1 us, the interval doubling whenever the trace would pass
            ``MAX_SAMPLES`` samples.
        rate_control: False: senders keep line rate (marks are still
            counted; no CNP is sent).

    Returns:
        ``SimResult`` with simulator ``ns-3`` (times in seconds).

    Raises:
        SimulatorMissing: ns-3 is not installed.
        ValueError: a task on a node the topology lacks, or a bad argument.
        RuntimeError: ns-3 dropped a packet or a task never finished.
    """
    if ecn_threshold_bytes < 1:
        raise ValueError(f"ecn_threshold_bytes must be positive: {ecn_threshold_bytes}")
    if queue_sample_s is not None and not queue_sample_s > 0:
        raise ValueError(f"queue_sample_s must be above zero: {queue_sample_s}")
    apps = _apps()
    plan = apps.Plan()
    _fill_fabric(apps, plan, workload, topology)
    _fill_tasks(apps, plan, workload)
    line = topology.rate_bps
    plan.header_bytes = HEADER_BYTES + (CSMA_EXTRA_BYTES if _shared(topology) else 0)
    plan.payload_bytes = PAYLOAD_BYTES
    plan.ecn_threshold_bytes = ecn_threshold_bytes
    plan.queue_limit_bytes = 2 * _wire_total(workload) + (1 << 20)
    plan.cnp_interval_s = CNP_INTERVAL_S
    plan.increase_period_s = INCREASE_PERIOD_S
    plan.increase_step_bps = line * INCREASE_STEP
    plan.min_rate_bps = line * MIN_RATE
    plan.alpha_g = ALPHA_G
    plan.rate_control = rate_control
    plan.sample_s = queue_sample_s or 1e-6
    plan.sample_adaptive = queue_sample_s is None
    plan.max_samples = MAX_SAMPLES
    apps.Run(plan)
    return _result(apps, plan, workload, topology)


def _shared(topology: Topology) -> bool:
    return topology.kind == "shared"


def _wire_total(workload: Workload) -> int:
    """Every byte the workload puts on one link, with headers: the queue limit."""
    nbytes = sum(t.nbytes for t in workload.tasks)
    packets = sum(-(-t.nbytes // PAYLOAD_BYTES) for t in workload.tasks)
    return nbytes + packets * (HEADER_BYTES + CSMA_EXTRA_BYTES)


def _fill_fabric(apps: Any, plan: Any, workload: Workload, topology: Topology) -> None:
    """Links, addresses and pinned routes of ``topology`` into ``plan``."""
    h = topology.num_hosts
    num_nodes = h if _shared(topology) else topology.num_nodes
    for t in workload.tasks:
        for node in (t.node, t.dst) if t.is_send else (t.node,):
            if not 0 <= node < num_nodes:
                raise ValueError(
                    f"task on node {node}: the {topology.kind} topology has nodes "
                    f"0..{num_nodes - 1} that send or compute"
                )
    plan.num_nodes = num_nodes
    plan.shared = _shared(topology)
    plan.rate_bps = topology.rate_bps
    plan.delay_s = topology.delay_s
    pair_addr = np.zeros(num_nodes * num_nodes, np.uint32)
    if _shared(topology):
        members = np.arange(h, dtype=np.int32)
        links = np.stack([members, members], 1)
        addr = _LINK_NET + 1 + members.astype(np.uint32)
        link_addr = np.repeat(addr, 2)
        plan.link_mask = 0xFFFE0000  # one /15 subnet: every host is a neighbour
        pair_addr[:] = np.tile(addr, num_nodes)
        routes: list[tuple[int, int, int]] = []
        local: list[tuple[int, int]] = []
    else:
        links = np.asarray(topology.links(), np.int32).reshape(-1, 2)
        if 4 * len(links) >= 1 << 16:
            raise ValueError(f"{len(links)} links: at most 16383 fit 198.18.0.0/16")
        base = _LINK_NET + 4 * np.arange(len(links), dtype=np.uint32)
        link_addr = np.stack([base + 1, base + 2], 1).reshape(-1)
        plan.link_mask = 0xFFFFFFFC
        routes, local = _pin_routes(workload, topology, links, pair_addr)
    _fill(apps, plan.link_a, links[:, 0].copy())
    _fill(apps, plan.link_b, links[:, 1].copy())
    _fill(apps, plan.link_addr, link_addr.astype(np.uint32))
    _fill(apps, plan.pair_addr, pair_addr)
    _fill(apps, plan.is_switch, (np.arange(num_nodes) >= h).astype(np.int32))
    r = np.asarray(routes, np.int64).reshape(-1, 3)
    _fill(apps, plan.route_node, r[:, 0].astype(np.int32))
    _fill(apps, plan.route_addr, r[:, 1].astype(np.uint32))
    _fill(apps, plan.route_link, r[:, 2].astype(np.int32))
    loc = np.asarray(local, np.int64).reshape(-1, 2)
    _fill(apps, plan.local_node, loc[:, 0].astype(np.int32))
    _fill(apps, plan.local_addr, loc[:, 1].astype(np.uint32))


def _pin_routes(
    workload: Workload,
    topology: Topology,
    links: np.ndarray,
    pair_addr: np.ndarray,
) -> tuple[list[tuple[int, int, int]], list[tuple[int, int]]]:
    """Destination addresses and static host routes that follow ``topology.path``.

    A node gets one address per class of its incoming routes that agree on
    every next hop (so destination routing cannot tell them apart); sources
    then send to the address of their path's class. Only the pairs that sends
    and their CNPs use are routed.

    Returns:
        routes: ``(node, address, link index)``: at ``node``, ``address``
            leaves over that link.
        local: ``(node, address)``: the extra /32 addresses of each node.
    """
    num_nodes = int(np.sqrt(pair_addr.size))
    link_of = {}
    for i, (a, b) in enumerate(links.tolist()):
        link_of[a, b] = link_of[b, a] = i
    pairs = sorted(
        {(t.node, t.dst) for t in workload.tasks if t.is_send}
        | {(t.dst, t.node) for t in workload.tasks if t.is_send}
    )
    classes: dict[int, list[dict[int, int]]] = {}
    class_of: dict[tuple[int, int], int] = {}
    for src, dst in pairs:
        path = topology.path(src, dst)
        hops = dict(zip(path[:-1], path[1:], strict=True))
        mine = classes.setdefault(dst, [])
        agree = [
            k
            for k, known in enumerate(mine)
            if all(known.get(u, v) == v for u, v in hops.items())
        ]
        if not agree:
            agree.append(len(mine))
            mine.append({})
        mine[agree[0]].update(hops)
        class_of[src, dst] = agree[0]
    routes: list[tuple[int, int, int]] = []
    local: list[tuple[int, int]] = []
    address: dict[tuple[int, int], int] = {}
    for dst, mine in sorted(classes.items()):
        for k, hops in enumerate(mine):
            addr = _NODE_NET + 1 + len(local)
            if addr >= _NODE_NET + (1 << 16) - 1:
                raise ValueError("more destination addresses than 198.19.0.0/16 has")
            address[dst, k] = addr
            local.append((dst, addr))
            routes += [(u, addr, link_of[u, v]) for u, v in hops.items()]
    for (src, dst), k in class_of.items():
        pair_addr[src * num_nodes + dst] = address[dst, k]
    return routes, local


def _fill_tasks(apps: Any, plan: Any, workload: Workload) -> None:
    """The task arrays, deps as CSR (``dep_ptr`` [num_tasks + 1], ``dep_idx``)."""
    tasks = workload.tasks
    _fill(apps, plan.task_node, np.array([t.node for t in tasks], np.int32))
    _fill(apps, plan.task_dst, np.array([t.dst for t in tasks], np.int32))
    _fill(apps, plan.task_seconds, np.array([t.seconds for t in tasks], np.float64))
    _fill(apps, plan.task_nbytes, np.array([t.nbytes for t in tasks], np.int64))
    counts = np.array([len(t.deps) for t in tasks], np.int64)
    ptr = np.concatenate([[0], np.cumsum(counts)]).astype(np.int32)
    idx = np.array([d for t in tasks for d in t.deps], np.int32)
    _fill(apps, plan.dep_ptr, ptr)
    _fill(apps, plan.dep_idx, idx)


def _fill(apps: Any, vector: Any, array: np.ndarray) -> None:
    """Copy a contiguous numpy array into a C++ vector of the same dtype."""
    array = np.ascontiguousarray(array)
    if array.size:
        apps.Fill[_CTYPES[array.dtype.str]](vector, array, array.size)
    else:
        vector.clear()  # cppyy passes no pointer for an empty buffer


def _take(apps: Any, vector: Any, dtype: type) -> np.ndarray:
    """A numpy copy of a C++ vector."""
    out = np.empty(vector.size(), dtype)
    if out.size:
        apps.Take[_CTYPES[out.dtype.str]](vector, out)
    return out


def _result(apps: Any, plan: Any, workload: Workload, topology: Topology) -> SimResult:
    """Check the run and read its figures back into a `SimResult`."""
    if plan.drops:
        raise RuntimeError(
            f"ns-3 dropped {plan.drops} packets in a fabric meant to be lossless "
            f"({plan.queue_drops} in queues, {plan.ip_drops} by IPv4, last reason "
            f"{plan.ip_drop_reason})"
        )
    start = _take(apps, plan.start, np.float64)
    finish = _take(apps, plan.finish, np.float64)
    if plan.done != len(workload.tasks):
        stuck = np.flatnonzero(finish < 0)[:5].tolist()
        raise RuntimeError(
            f"{len(workload.tasks) - plan.done} tasks never finished "
            f"(first: {stuck}): a send whose packets never arrived"
        )
    dev_bytes = _take(apps, plan.dev_bytes, np.int64).reshape(-1, 2)
    links = _link_bytes(apps, dev_bytes, plan, topology)
    peaks = _take(apps, plan.queue_peak, np.uint64)
    trace = np.zeros((0, 2))
    if peaks.size:
        busiest = int(np.argmax(peaks))
        times = _take(apps, plan.trace_t, np.float64)
        samples = _take(apps, plan.trace_b, np.float64).reshape(times.size, -1)
        trace = np.stack([times, samples[:, busiest]], 1)
    return SimResult(
        simulator="ns-3",
        start=start,
        finish=finish,
        links=LinkStats(links),
        peak_queue_bytes=int(peaks.max()) if peaks.size else 0,
        queue_trace=trace,
        ecn_marks=int(plan.ecn_marks),
    )


def _link_bytes(
    apps: Any, dev_bytes: np.ndarray, plan: Any, topology: Topology
) -> dict[tuple[int, int], int]:
    """Bytes per directed link from bytes per device ([links, 2]: a-side, b-side)."""
    if _shared(topology):
        hub = topology.num_hosts
        total = int(dev_bytes[:, 0].sum())
        return {(hub, hub): total} if total else {}
    a = _take(apps, plan.link_a, np.int32)
    b = _take(apps, plan.link_b, np.int32)
    out: dict[tuple[int, int], int] = {}
    for i in np.flatnonzero(dev_bytes.any(1)).tolist():
        for side, (src, dst) in enumerate(((a[i], b[i]), (b[i], a[i]))):
            if dev_bytes[i, side]:
                out[int(src), int(dst)] = int(dev_bytes[i, side])
    return out
