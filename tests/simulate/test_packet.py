"""The ns-3 packet simulator against analytical times and exact wire bytes.

ns-3 is imported and graphwire's apps compiled once for the module (~20 s);
each simulation then takes milliseconds.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections import Counter
from pathlib import Path

import numpy as np
import pytest

from graphwire.simulate import packet
from graphwire.simulate.topology import parse_topology
from graphwire.simulate.wire import (
    CSMA_EXTRA_BYTES,
    HEADER_BYTES,
    PAYLOAD_BYTES,
    packets,
    wire_bytes,
)
from graphwire.simulate.workload import Workload

MB = 1_000_000


@pytest.fixture(scope="module", autouse=True)
def ns3() -> None:
    packet.import_ns3()


def expected_path_bytes(w: Workload, topo) -> dict[tuple[int, int], int]:
    out: Counter[tuple[int, int]] = Counter()
    for t in w.tasks:
        if t.is_send and t.nbytes:
            for link in topo.path_links(t.node, t.dst):
                out[link] += wire_bytes(t.nbytes)
    return dict(out)


def test_one_send_is_store_and_forward() -> None:
    rate, delay, n = 100e9, 1e-6, MB
    topo = parse_topology("star", 4, rate, delay)
    w = Workload(4)
    w.send(0, 1, n)
    r = packet.simulate_packets(w, topo)
    # the first hop serialises every byte; the switch forwards the last full
    # packet after it arrived (the short last one queues behind it)
    hops = 2
    full_packet = (PAYLOAD_BYTES + HEADER_BYTES) * 8 / rate
    want = wire_bytes(n) * 8 / rate + (hops - 1) * full_packet + hops * delay
    assert r.simulator == "ns-3"
    assert r.start[0] == 0
    assert r.finish[0] == pytest.approx(want, rel=0.01)
    assert r.links.bytes == {(0, 4): wire_bytes(n), (4, 1): wire_bytes(n)}
    assert r.ecn_marks == 0


def test_incast_shares_the_port_and_marks_ecn() -> None:
    topo = parse_topology("star", 4, 10e9, 1e-6)
    one = Workload(4)
    one.send(0, 3, MB)
    three = Workload(4)
    for src in range(3):
        three.send(src, 3, MB)
    single = packet.simulate_packets(one, topo).makespan
    r = packet.simulate_packets(three, topo)
    # DCQCN-like control costs some utilisation (rates overshoot downwards)
    assert 2.95 * single < r.makespan < 3.3 * single
    assert r.peak_queue_bytes > packet.ECN_THRESHOLD_BYTES
    assert r.ecn_marks > 0
    # rate control bounds the queue well below everything sent at once
    assert r.peak_queue_bytes < 0.25 * 3 * wire_bytes(MB)
    assert r.links.bytes[4, 3] == 3 * wire_bytes(MB)
    times, depth = r.queue_trace.T
    assert np.all(np.diff(times) > 0)
    assert 0 < depth.max() <= r.peak_queue_bytes


def test_small_threshold_marks_sooner() -> None:
    topo = parse_topology("star", 3, 10e9, 1e-6)
    w = Workload(3)
    w.send(0, 2, MB)
    w.send(1, 2, MB)
    big = packet.simulate_packets(w, topo, ecn_threshold_bytes=10 * MB)
    small = packet.simulate_packets(w, topo, ecn_threshold_bytes=20_000)
    assert big.ecn_marks == 0
    assert small.ecn_marks > 0
    assert small.peak_queue_bytes < big.peak_queue_bytes


def test_deps_are_honoured() -> None:
    topo = parse_topology("star", 4, 10e9, 1e-6)
    w = Workload(4)
    c = w.compute(0, 1e-3)
    s = w.send(0, 1, 100_000, deps=(c,))
    a = w.send(0, 2, 200_000)
    b = w.send(1, 2, 50_000)
    after = w.send(2, 3, 10_000, deps=(a, b))
    empty = w.send(3, 0, 0, deps=(after,))
    r = packet.simulate_packets(w, topo)
    assert r.finish[c] == pytest.approx(1e-3, abs=1e-9)
    assert r.start[s] == pytest.approx(1e-3, abs=1e-9)
    assert r.start[after] == pytest.approx(max(r.finish[a], r.finish[b]), abs=1e-9)
    assert r.finish[after] > r.start[after]
    assert r.start[empty] == r.finish[empty] == r.finish[after]
    assert np.all(r.finish >= r.start)


def test_shared_medium_is_half_duplex() -> None:
    def makespans(kind: str) -> tuple[float, float, dict]:
        topo = parse_topology(kind, 2, 10e9, 1e-6)
        one, both = Workload(2), Workload(2)
        one.send(0, 1, MB)
        both.send(0, 1, MB)
        both.send(1, 0, MB)
        r = packet.simulate_packets(both, topo)
        return packet.simulate_packets(one, topo).makespan, r.makespan, r.links.bytes

    one, both, shared_bytes = makespans("shared")
    assert both == pytest.approx(2 * one, rel=0.05)
    frame = wire_bytes(MB) + packets(MB) * CSMA_EXTRA_BYTES
    assert shared_bytes == {(2, 2): 2 * frame}
    one, both, _ = makespans("star")
    assert both == pytest.approx(one, rel=0.01)


def test_leaf_spine_bytes_follow_the_pinned_path() -> None:
    topo = parse_topology("leaf-spine:2x2", 4, 100e9, 1e-6)
    w = Workload(4)
    for src in range(4):
        for dst in range(4):
            if src != dst:
                w.send(src, dst, 10_000 * (1 + src + 4 * dst))
    r = packet.simulate_packets(w, topo)
    assert r.links.bytes == expected_path_bytes(w, topo)
    assert np.all(r.finish > 0)


@pytest.mark.parametrize("kind", ["star", "leaf-spine:2x2"])
def test_aggregator_receives_and_sends(kind: str) -> None:
    topo = parse_topology(kind, 4, 100e9, 1e-6)
    agg = topo.aggregator
    assert agg is not None
    w = Workload(4)
    up = w.send(0, agg, 300_000)
    down = w.send(agg, 1, 300_000, deps=(up,))
    r = packet.simulate_packets(w, topo)
    assert r.start[down] == pytest.approx(r.finish[up], abs=1e-9)
    assert r.finish[down] > r.finish[up] > 0
    assert r.links.bytes == expected_path_bytes(w, topo)


def test_queue_trace_stays_short_over_long_runs() -> None:
    topo = parse_topology("star", 3, 10e9, 1e-6)
    w = Workload(3)
    c = w.compute(0, 30e-3)  # 30,000 samples at the first interval of 1 us
    w.send(0, 2, MB, deps=(c,))
    w.send(1, 2, MB, deps=(c,))
    r = packet.simulate_packets(w, topo)
    assert 1000 < len(r.queue_trace) <= packet.MAX_SAMPLES
    assert r.queue_trace[-1, 0] == pytest.approx(r.makespan, rel=0.01)
    fixed = packet.simulate_packets(w, topo, queue_sample_s=100e-6)
    assert len(fixed.queue_trace) == pytest.approx(r.makespan / 100e-6, abs=2)


def test_nodes_outside_the_topology_are_rejected() -> None:
    w = Workload(2)
    w.send(0, 2, 100)  # node 2 is the medium of shared: it carries nothing
    with pytest.raises(ValueError, match="node 2"):
        packet.simulate_packets(w, parse_topology("shared", 2, 1e9, 0))


def test_missing_ns3_names_the_extra() -> None:
    code = (
        "import sys; sys.modules['ns3'] = None\n"
        "from graphwire.simulate.packet import SimulatorMissing, import_ns3\n"
        "try:\n"
        "    import_ns3()\n"
        "except SimulatorMissing as e:\n"
        "    print('missing:', e)\n"
    )
    root = str(Path(__file__).resolve().parents[2])  # this checkout's graphwire
    env = {**os.environ, "PYTHONPATH": root}
    out = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
    )
    assert out.returncode == 0, out.stderr
    assert "missing: ns-3 is not installed: pip install 'graphwire[sim]'" in out.stdout
