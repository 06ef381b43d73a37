"""`simulate_strategy`: one strategy's traced epoch, simulated on one topology.

What ``graphwire simulate`` runs per (workers, strategy): trace the engine's
step on the partitioned folder (:func:`capture_epoch`), turn it into a
:class:`Workload` (:func:`workload_from_traces`), run it on ns-3 or the flow
model, and summarise: epoch time, communication time per layer, bytes per
link, peak queue, and the switch's aggregator occupancy.

Strategies are the engines' names, plus the SwitchGNN paper's baselines:
``straw`` (the switch with a random order and one block: what does not fit
the memory overflows to the hosts) and ``straw-ul`` (the same with unlimited
memory); ``switch`` and ``straw`` run once per ``--switch-mb``.
"""

from __future__ import annotations

import dataclasses
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from graphwire.fullgraph.engines import EXCHANGES
from graphwire.fullgraph.switch import SwitchConfig
from graphwire.run.config import TrainConfig
from graphwire.simulate.background import BACKGROUND
from graphwire.simulate.capture import RankTrace, capture_epoch
from graphwire.simulate.flow import simulate_flows
from graphwire.simulate.replay import layer_of, workload_from_traces
from graphwire.simulate.topology import Topology
from graphwire.simulate.wire import packets
from graphwire.simulate.workload import SimResult, Workload

__all__ = [
    "SIMULATORS",
    "Outcome",
    "Strategy",
    "pick_simulator",
    "run_workload",
    "simulate_strategy",
    "strategies",
]

SIMULATORS = ("auto", "ns3", "flow", "both")
# `--simulator auto` takes ns-3 up to this many packets in an epoch.
AUTO_PACKETS = 200_000
_SWITCHES: dict[str, dict[str, Any]] = {
    "switch": {},
    "straw": {"switch_order": "random", "switch_blocks": "none"},
    "straw-ul": {"switch_order": "random", "switch_blocks": "none", "switch_mb": 0.0},
}


@dataclass(frozen=True, slots=True)
class Strategy:
    """A labelled engine configuration (``switch 10MiB``, ``halo``)."""

    label: str
    exchange: Any  # a name or an engine config

    @property
    def uses_switch(self) -> bool:
        return isinstance(self.exchange, SwitchConfig)


def strategies(names: list[str], switch_mb: list[float]) -> list[Strategy]:
    """The strategies ``--exchange`` names, ``switch``/``straw`` per memory.

    Raises:
        ValueError: an unknown name.
    """
    out: list[Strategy] = []
    for name in names:
        if name in _SWITCHES:
            sizes = [0.0] if name == "straw-ul" else switch_mb
            for mb in sizes:
                settings: dict[str, Any] = {"switch_mb": mb, **_SWITCHES[name]}
                label = name if name == "straw-ul" else f"{name} {mb:g}MiB"
                out.append(Strategy(label, SwitchConfig(**settings)))  # type: ignore[arg-type]
        else:
            EXCHANGES.get(name)  # (raises, naming the known ones)
            out.append(Strategy(name, name))
    return out


@dataclass(slots=True)
class Outcome:
    """One strategy at one worker count, simulated.

    Attributes:
        epoch_s: the simulated training step (its last task's end;
            background flows left out).
        compute_s: the slowest rank's compute.
        comm_s: per layer, the time at least one of that layer's messages
            (forward or backward) was on its way; ``sync`` the gradient
            sum's, ``other`` the rest (the switch's counters).
        bytes: payload bytes sent in the epoch (all tags).
        link_max, link_mean: wire bytes per directed link.
        peak_queue: the largest switch queue in bytes (ns-3; 0 in the flow
            model).
        switch: the switch's counters (aggregator peak and mean occupancy,
            pool, raw rows) for the switch strategies, else empty.
    """

    label: str
    workers: int
    simulator: str
    epoch_s: float
    compute_s: float
    comm_s: dict[str, float]
    bytes: int
    link_max: int
    link_mean: float
    peak_queue: int
    ecn_marks: int
    switch: dict[str, Any] = field(default_factory=dict)
    queue_trace: np.ndarray = field(default_factory=lambda: np.zeros((0, 2)))

    def row(self) -> dict[str, Any]:
        """The JSON-able summary (no queue trace)."""
        out = dataclasses.asdict(self)
        out.pop("queue_trace")
        return out


def pick_simulator(choice: str, workload: Workload) -> list[str]:
    """The simulators ``--simulator`` means for this workload."""
    if choice == "both":
        return ["ns3", "flow"]
    if choice != "auto":
        return [choice]
    total = sum(packets(t.nbytes) for t in workload.tasks if t.is_send)
    if total > AUTO_PACKETS:
        return ["flow"]
    from graphwire.simulate.packet import ns3_available

    return ["ns3"] if ns3_available() else ["flow"]


def run_workload(simulator: str, workload: Workload, topology: Topology) -> SimResult:
    """``workload`` on ``topology`` with ``ns3`` or ``flow``."""
    if simulator == "flow":
        return simulate_flows(workload, topology)
    from graphwire.simulate.packet import simulate_packets

    return simulate_packets(workload, topology)


def simulate_strategy(
    folder: str,
    config: TrainConfig,
    strategy: Strategy,
    topology: Topology,
    *,
    simulator: str = "auto",
    compute_scale: float = 1.0,
    compute_s: list[float] | None = None,
    repeats: int = 2,
) -> list[Outcome]:
    """Trace ``strategy`` on ``folder`` (``repeats`` steps after a warm-up)
    and simulate it (one outcome per simulator ``simulator`` means: two for
    ``both``)."""
    capture = capture_epoch(
        folder, topology.num_hosts, config, strategy.exchange, repeats=repeats
    )
    workload = workload_from_traces(
        capture,
        aggregator=topology.aggregator,
        compute_scale=compute_scale,
        compute_s=compute_s,
    )
    return [
        summarise(
            strategy.label,
            capture.ranks,
            workload,
            run_workload(sim, workload, topology),
        )
        for sim in pick_simulator(simulator, workload)
    ]


def summarise(
    label: str, traces: list[RankTrace], workload: Workload, result: SimResult
) -> Outcome:
    """An :class:`Outcome` of one simulated workload."""
    intervals: dict[str, list[tuple[float, float]]] = defaultdict(list)
    compute = np.zeros(workload.num_hosts)
    sent = 0
    epoch = 0.0
    for i, t in enumerate(workload.tasks):
        if t.tag == BACKGROUND:
            continue
        epoch = max(epoch, float(result.finish[i]))
        if not t.is_send:
            if t.node < workload.num_hosts:
                compute[t.node] += t.seconds
            continue
        sent += t.nbytes
        layer = layer_of(t.tag)
        if t.tag.startswith("sync."):
            key = "sync"
        else:
            key = f"L{layer}" if layer >= 0 else "other"
        intervals[key].append((float(result.start[i]), float(result.finish[i])))
    switch: dict[str, Any] = {}
    core = traces[0].extra.get("switch", {}).get("core") if traces else None
    if core:
        pools = list(core.get("pool_rows", {}).values())
        switch = {
            "peak_slots": core.get("peak_slots", 0),
            "mean_slots": round(float(core.get("mean_slots", 0.0)), 1),
            "pool_rows": max(pools) if pools else 0,
            "aggregated": core.get("aggregated", 0),
            "raw": core.get("raw", 0),
            # rows sent again or fetched after a timeout (none when lossless)
            "resent": sum(
                w.get("retransmitted", 0) + w.get("fetched", 0)
                for w in traces[0].extra["switch"].get("workers", [])
            ),
        }
    return Outcome(
        label=label,
        workers=workload.num_hosts,
        simulator=result.simulator,
        epoch_s=epoch,
        compute_s=float(compute.max()) if compute.size else 0.0,
        comm_s={k: _covered(v) for k, v in sorted(intervals.items())},
        bytes=sent,
        link_max=result.links.max,
        link_mean=result.links.mean,
        peak_queue=result.peak_queue_bytes,
        ecn_marks=result.ecn_marks,
        switch=switch,
        queue_trace=result.queue_trace,
    )


def _covered(spans: list[tuple[float, float]]) -> float:
    """Seconds covered by the union of ``(start, end)`` intervals."""
    total, reach = 0.0, -np.inf
    for lo, hi in sorted(spans):
        if hi > reach:
            total += hi - max(lo, reach)
            reach = hi
    return total
