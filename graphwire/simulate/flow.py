"""`simulate_flows`: a :class:`Workload` on a topology, with max-min fair links.

The flow-level model for sweeps too large for packets. Every send is a flow
of :func:`~graphwire.simulate.wire.wire_bytes` over its pinned route
(:meth:`Topology.path_links`). Its first packet leaves in the order sends
start, one after another on their first link, as a NIC's queue sends them
(a one-packet message is done then: fair sharing would stretch it over every
flow on the link); the rest of every flow shares the links max-min fairly
(the allocation DCQCN-like rate control converges to), recomputed whenever a
flow starts or ends, or, past 256 concurrent flows, once 2% of them have
(a new flow taking a fair share of its links meanwhile). A flow's last
byte arrives one route latency after it leaves the first link: the links'
propagation delays plus, per further hop, one packet's store-and-forward
(on ``shared``, one hop of Ethernet frames, as ns-3's CSMA medium carries
them). Compute tasks take their time. There are no queues: the packet
simulator (ns-3) has them, and the two are checked against each other where
both run.
"""

from __future__ import annotations

import heapq

import numpy as np

from graphwire.simulate.topology import Topology
from graphwire.simulate.wire import (
    CSMA_EXTRA_BYTES,
    HEADER_BYTES,
    PAYLOAD_BYTES,
    wire_bytes,
)
from graphwire.simulate.workload import LinkStats, SimResult, Workload

__all__ = ["max_min_rates", "simulate_flows"]

# A flow with fewer bytes left than this is done (float rounding).
_EPS_BYTES = 1e-6
_HEAD, _DONE = 0, 1  # kinds of timer
_EXACT_FLOWS = 256  # up to this many flows, rates follow every change
_RECOMPUTE_SHARE = 0.02


def max_min_rates(paths: np.ndarray, capacity: np.ndarray) -> np.ndarray:
    """Max-min fair rates of flows over links (water-filling).

    Args:
        paths: int64 [F, K] each flow's link indices, padded with -1.
        capacity: float64 [L] each link's capacity.

    Returns:
        float64 [F] rates (same unit as ``capacity``).
    """
    num_flows, width = paths.shape
    on = (paths >= 0).ravel()
    flow_of = np.repeat(np.arange(num_flows), width)[on]
    link_of = paths.ravel()[on]
    rates = np.zeros(num_flows)
    free = np.ones(num_flows, dtype=bool)
    left = capacity.astype(np.float64).copy()
    count = np.bincount(link_of, minlength=capacity.size).astype(np.float64)
    while free.any():
        with np.errstate(divide="ignore", invalid="ignore"):
            share = np.where(count > 0, left / count, np.inf)
        level = float(share.min())
        if not np.isfinite(level):
            break
        level = max(level, 0.0)
        # Every link at the lowest share is a bottleneck at once (ties are
        # common: a star's links often carry equal loads).
        tight = share <= level * (1 + 1e-9) + 1e-300
        hit = np.zeros(num_flows, dtype=bool)
        hit[flow_of[tight[link_of]]] = True
        hit &= free
        rates[hit] = level
        free &= ~hit
        used = np.bincount(link_of[hit[flow_of]], minlength=capacity.size)
        count -= used
        left -= used * level
    return rates


def _rates(
    active: list[int], route: list[list[int]], width: int, capacity: np.ndarray
) -> np.ndarray:
    paths = np.full((len(active), width), -1, dtype=np.int64)
    for row, i in enumerate(active):
        paths[row, : len(route[i])] = route[i]
    return max_min_rates(paths, capacity)


def simulate_flows(workload: Workload, topology: Topology) -> SimResult:
    """Run ``workload`` on ``topology`` (see the module docstring)."""
    tasks = workload.tasks
    n = len(tasks)
    links: dict[tuple[int, int], int] = {}
    route: list[list[int]] = []
    latency = np.zeros(n)
    # The packet simulator's frames: Ethernet on the shared medium.
    header = HEADER_BYTES + (CSMA_EXTRA_BYTES if topology.kind == "shared" else 0)
    packet_s = (PAYLOAD_BYTES + header) * 8 / topology.rate_bps
    for t in tasks:
        if not t.is_send:
            route.append([])
            continue
        hops = topology.path_links(t.node, t.dst)
        route.append([links.setdefault(h, len(links)) for h in hops])
        # The shared medium is one hop: the frame goes straight to its host.
        hops_nodes = (
            1 if topology.kind == "shared" else len(topology.path(t.node, t.dst)) - 1
        )
        latency[len(route) - 1] = hops_nodes * topology.delay_s + (
            hops_nodes - 1
        ) * min(packet_s, wire_bytes(t.nbytes, header) * 8 / topology.rate_bps)
    capacity = np.full(max(len(links), 1), topology.rate_bps / 8)  # bytes/s
    width = max((len(r) for r in route), default=1) or 1

    users: list[list[int]] = [[] for _ in range(n)]
    waiting = np.zeros(n, dtype=np.int64)
    for i, t in enumerate(tasks):
        waiting[i] = len(t.deps)
        for d in t.deps:
            users[d].append(i)
    start = np.full(n, np.nan)
    finish = np.full(n, np.nan)
    # (time, kind, task): a compute's end or a send's arrival (_DONE), or the
    # end of a send's first packet on its first link (_HEAD)
    timers: list[tuple[float, int, int]] = []
    busy = np.zeros(capacity.size)  # per link: when its queued first packets end
    active: list[int] = []
    left: dict[int, float] = {}
    now = 0.0

    def begin(i: int) -> None:
        start[i] = now
        t = tasks[i]
        if not t.is_send:
            heapq.heappush(timers, (now + t.seconds, _DONE, i))
        elif t.nbytes == 0:
            heapq.heappush(timers, (now, _DONE, i))
        else:
            # The first packet goes out in the order sends start (a NIC's
            # FIFO), ahead of the packets of flows already sharing the link.
            wire = wire_bytes(t.nbytes, header)
            head = min(wire, PAYLOAD_BYTES + header)
            first_link = route[i][0]
            busy[first_link] = max(now, busy[first_link]) + head / capacity[first_link]
            left[i] = float(wire - head)
            heapq.heappush(timers, (float(busy[first_link]), _HEAD, i))

    for first in np.flatnonzero(waiting == 0).tolist():
        begin(first)
    rates = np.zeros(0)
    crossing = np.zeros(capacity.size, dtype=np.int64)  # active flows per link
    share: dict[int, float] = {}
    changed = False  # since the rates were computed: a flow or a link changed
    moved = 0  # flows that started or ended since then
    flows_then = 0  # active flows then
    while active or timers:
        # Exact after every change while few flows share the fabric; with
        # many, once 2% of them have started or ended (meanwhile rates stay
        # where they were, and a new flow takes a fair share of its links as
        # if the others made room: a little off fair sharing either way).
        lazy = len(active) > _EXACT_FLOWS
        due = moved > _RECOMPUTE_SHARE * max(flows_then, len(active))
        if active and changed and (due or not lazy):
            rates = _rates(active, route, width, np.where(busy > now, 0.0, capacity))
            changed, moved, flows_then = False, 0, len(active)
        if rates.size < len(active):  # started since: a provisional rate
            rates = np.concatenate([rates, [share[i] for i in active[rates.size :]]])
        remaining = np.array([left[i] for i in active])
        with np.errstate(divide="ignore"):
            drain = remaining / rates if active else np.zeros(0)
        next_drain = float(drain.min()) if active else np.inf
        next_timer = timers[0][0] - now if timers else np.inf
        step = min(next_drain, next_timer)
        if not np.isfinite(step):  # every flow waits for a rate: give them one
            changed, moved = True, len(active) + 1
            continue
        now += step
        if active:
            after = remaining - rates * step
            keep, kept = [], []
            for row, i in enumerate(active):
                if after[row] <= _EPS_BYTES or drain[row] <= step * (1 + 1e-12):
                    heapq.heappush(timers, (now + latency[i], _DONE, i))
                    del left[i]
                    crossing[route[i]] -= 1
                    changed, moved = True, moved + 1
                else:
                    left[i] = float(after[row])
                    keep.append(i)
                    kept.append(row)
            active, rates = keep, rates[kept]
        while timers and timers[0][0] <= now + 1e-15:
            when, kind, i = heapq.heappop(timers)
            if kind == _HEAD:
                changed = True  # its link may be free for the others' rest now
                if left[i] <= _EPS_BYTES:
                    del left[i]
                    heapq.heappush(timers, (when + latency[i], _DONE, i))
                else:
                    active.append(i)
                    moved += 1
                    crossing[route[i]] += 1
                    # Until the rates are computed again: a fair share of
                    # each link, as if the others made room for it.
                    share[i] = float((capacity[route[i]] / crossing[route[i]]).min())
                continue
            finish[i] = when
            for user in users[i]:
                waiting[user] -= 1
                if waiting[user] == 0:
                    begin(user)
    if np.isnan(finish).any():
        raise RuntimeError("the flow model left tasks unfinished (a dependency cycle?)")
    hop_of = list(links)  # link index -> (a, b), as the routes number them
    carried: dict[tuple[int, int], int] = {}
    for t, indices in zip(tasks, route, strict=True):
        if t.nbytes:  # (compute tasks have no route)
            for k in indices:
                hop = hop_of[k]
                carried[hop] = carried.get(hop, 0) + wire_bytes(t.nbytes, header)
    return SimResult("flow", start, finish, LinkStats(carried))
