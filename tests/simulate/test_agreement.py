"""ns-3 and the flow model agree on the engines' traced epochs.

Three traced training steps of a few thousand rows (GCN, 3 layers), their
communication only (compute left out), run through both simulators at
1 Gbit/s: halo on a 4-host star (the CI's ns-3 case), G3's pipelined bins on
leaf-spine 2x2, the switch on a star (its aggregator a node of the fabric),
and halo on the shared medium of the shaped-loopback runs. The epoch's
communication time agrees within 10%, the issue's bound; the bytes on every
link agree exactly (headers included).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from graphwire.graph.synthetic import ProductsConfig, products_graph
from graphwire.partition import get_partitioner, write_partitioned
from graphwire.run.config import TrainConfig
from graphwire.simulate.capture import capture_epoch
from graphwire.simulate.flow import simulate_flows
from graphwire.simulate.packet import simulate_packets
from graphwire.simulate.replay import workload_from_traces
from graphwire.simulate.study import strategies
from graphwire.simulate.topology import parse_topology

CONFIG = TrainConfig(model="gcn", hidden=64, num_layers=3, seed=7)
CASES = [
    ("star", "halo", 4),
    ("leaf-spine:2x2", "g3", 4),
    ("star", "switch", 4),
    ("shared", "halo", 2),
]


@pytest.fixture(scope="module")
def graph_parts(tmp_path_factory: pytest.TempPathFactory) -> dict[int, Path]:
    graph = products_graph(
        ProductsConfig(nodes=3000, degree=10, features=32, classes=5, seed=4)
    )
    where = tmp_path_factory.mktemp("agree")
    return {
        parts: write_partitioned(
            graph,
            get_partitioner("metis").partition(graph, parts, seed=0),
            where / f"metis{parts}",
        )
        for parts in (2, 4)
    }


@pytest.mark.parametrize(("kind", "name", "parts"), CASES)
def test_the_flow_model_agrees_with_ns3(
    graph_parts: dict[int, Path], kind: str, name: str, parts: int
) -> None:
    (strategy,) = strategies([name], [10.0])
    capture = capture_epoch(
        graph_parts[parts], parts, CONFIG, strategy.exchange, repeats=1
    )
    topology = parse_topology(kind, parts, 1e9, 2e-6)
    workload = workload_from_traces(
        capture, aggregator=topology.aggregator, compute_scale=0.0
    )
    assert sum(t.nbytes for t in workload.tasks) > 500_000  # thousands of rows
    packets = simulate_packets(workload, topology)
    flows = simulate_flows(workload, topology)
    assert flows.makespan == pytest.approx(packets.makespan, rel=0.10)
    assert flows.links.bytes == packets.links.bytes
