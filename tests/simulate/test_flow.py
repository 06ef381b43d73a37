"""The flow model: max-min fair rates, transfer times against arithmetic, deps."""

from __future__ import annotations

import numpy as np
import pytest

from graphwire.simulate.flow import max_min_rates, simulate_flows
from graphwire.simulate.topology import Topology
from graphwire.simulate.wire import HEADER_BYTES, PAYLOAD_BYTES, wire_bytes
from graphwire.simulate.workload import Workload

RATE = 8e9  # 1 GB/s: bytes and nanoseconds line up
DELAY = 1e-6
MB = 1_000_000


def _star(hosts: int = 4, kind: str = "star") -> Topology:
    return Topology(kind, hosts, RATE, DELAY)


def _alone(nbytes: int, hops: int) -> float:
    """One send's time on an idle route of ``hops`` links."""
    packet = (PAYLOAD_BYTES + HEADER_BYTES) * 8 / RATE
    return wire_bytes(nbytes) * 8 / RATE + hops * DELAY + (hops - 1) * packet


def test_max_min_rates_share_bottlenecks_fairly() -> None:
    # Links 0 and 1 (capacity 1); flows over 0, over 0 and 1, over 1.
    paths = np.array([[0, -1], [0, 1], [1, -1]])
    assert max_min_rates(paths, np.array([1.0, 1.0])) == pytest.approx([0.5] * 3)
    # Link 1 is narrow: the flow over both gets its share, the other the rest.
    rates = max_min_rates(np.array([[0, -1], [0, 1]]), np.array([1.0, 0.25]))
    assert rates == pytest.approx([0.75, 0.25])


def test_one_send_takes_its_bytes_over_the_rate_plus_the_route() -> None:
    workload = Workload(4)
    workload.send(0, 3, 5 * MB, tag="fwd.L1")
    result = simulate_flows(workload, _star())
    assert result.finish[0] == pytest.approx(_alone(5 * MB, 2), rel=1e-9)
    assert result.links.bytes == {
        (0, 4): wire_bytes(5 * MB),
        (4, 3): wire_bytes(5 * MB),
    }


def test_incast_shares_the_receivers_link() -> None:
    workload = Workload(4)
    for src in (0, 1, 2):
        workload.send(src, 3, MB)
    result = simulate_flows(workload, _star())
    assert result.makespan == pytest.approx(3 * _alone(MB, 1), rel=0.01)


def test_a_shared_medium_carries_both_directions_in_turn() -> None:
    def both_ways(kind: str) -> float:
        workload = Workload(2)
        workload.send(0, 1, MB)
        workload.send(1, 0, MB)
        return simulate_flows(workload, Topology(kind, 2, RATE, DELAY)).makespan

    assert both_ways("star") == pytest.approx(_alone(MB, 2), rel=0.01)
    assert both_ways("shared") == pytest.approx(2 * _alone(MB, 2), rel=0.01)


def test_tasks_wait_for_their_deps() -> None:
    workload = Workload(3)
    compute = workload.compute(0, 1e-3)
    first = workload.send(0, 1, MB, deps=(compute,))
    second = workload.send(2, 1, MB)
    after = workload.compute(1, 2e-3, deps=(first, second))
    result = simulate_flows(workload, _star(3))
    assert result.start[first] == pytest.approx(1e-3)
    assert result.start[after] == pytest.approx(max(result.finish[[first, second]]))
    assert result.finish[after] == pytest.approx(result.start[after] + 2e-3)
    # The two sends overlapped only after the compute: each alone, then shared.
    assert result.finish[second] == pytest.approx(_alone(MB, 2), rel=0.01)


def test_leaf_spine_routes_carry_the_bytes() -> None:
    topology = Topology("leaf-spine", 4, RATE, DELAY, leaves=2, spines=2)
    workload = Workload(4)
    workload.send(0, 3, MB)
    workload.send(0, 1, MB)
    result = simulate_flows(workload, topology)
    crossed = topology.path_links(0, 3) + topology.path_links(0, 1)
    assert sorted(result.links.bytes) == sorted(set(crossed))
    assert result.links.bytes[(0, 4)] == 2 * wire_bytes(MB)  # host 0's uplink
    assert len(topology.path(0, 3)) == 5  # host, leaf, spine, leaf, host
