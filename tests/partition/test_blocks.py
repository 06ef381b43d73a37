"""ByteGNN's block partitioner (``--partition blocks``).

- every node gets one part; blocks are connected K-hop neighbourhoods of
  their centres, and nodes outside every K-hop reach are the unreached ones
  (random graphs);
- a node reached by two blocks in one level takes the smaller block ID;
- Algorithm 2: a block joins the part it shares edges with, per node of the
  part, unless that part is past its share; with no such part, the one of
  largest balance score; unreached nodes even out the part sizes;
- the remote K-hop accesses are what a brute-force walk counts;
- on the synthetic graph: deterministic, balanced, and reported beside
  METIS; bad parameters are refused by name.
"""

from __future__ import annotations

import json
from collections import deque

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from graphwire.graph.graph import Graph
from graphwire.graph.synthetic import ProductsConfig, products_graph
from graphwire.partition import PartitionStats, get_partitioner
from graphwire.partition.blocks import (
    BlocksPartitioner,
    assign_blocks,
    neighbourhood_blocks,
    remote_khop_accesses,
)
from graphwire.run.partitioning import partition_and_report


def _graph(
    src: list[int], dst: list[int], num_nodes: int, **splits: list[int]
) -> Graph:
    graph = Graph.from_edge_index(
        torch.tensor(src, dtype=torch.int64),
        torch.tensor(dst, dtype=torch.int64),
        num_nodes=num_nodes,
    )
    return graph.replace(
        **{f"{k}_idx": torch.tensor(v, dtype=torch.int64) for k, v in splits.items()}
    )


def _hops_within(graph: Graph, centre: int, members: set[int]) -> dict[int, int]:
    """In-hops from ``centre`` to each node of ``members``, walking in it."""
    indptr, indices = graph.indptr.tolist(), graph.indices.tolist()
    dist, queue = {centre: 0}, deque([centre])
    while queue:
        v = queue.popleft()
        for u in indices[indptr[v] : indptr[v + 1]]:
            if u in members and u not in dist:
                dist[u] = dist[v] + 1
                queue.append(u)
    return dist


@settings(max_examples=40, deadline=None)
@given(
    num_nodes=st.integers(2, 40),
    hops=st.integers(0, 3),
    data=st.data(),
)
def test_blocks_are_connected_k_hop_neighbourhoods(
    num_nodes: int, hops: int, data: st.DataObject
) -> None:
    pairs = data.draw(
        st.lists(
            st.tuples(st.integers(0, num_nodes - 1), st.integers(0, num_nodes - 1))
        )
    )
    centres = sorted(data.draw(st.sets(st.integers(0, num_nodes - 1), min_size=1)))
    graph = _graph([p[0] for p in pairs], [p[1] for p in pairs], num_nodes)
    block = neighbourhood_blocks(graph, np.array(centres, dtype=np.int64), hops)
    for b, centre in enumerate(centres):
        members = set(np.flatnonzero(block == b).tolist())
        assert block[centre] == b
        dist = _hops_within(graph, centre, members)
        assert set(dist) == members  # connected, from its centre
        assert max(dist.values()) <= hops
    # The unreached are farther than K from every centre.
    everyone = set(range(num_nodes))
    near = set()
    for centre in centres:
        near |= {
            v for v, d in _hops_within(graph, centre, everyone).items() if d <= hops
        }
    assert set(np.flatnonzero(block < 0).tolist()) == everyone - near


def test_a_node_two_blocks_reach_at_once_takes_the_smaller_id() -> None:
    # 4 <- 0 and 4 <- 2 (in-edges of 0 and 2 lead to 4); centres 2 and 0.
    graph = _graph([4, 4, 5], [2, 0, 4], 6)
    block = neighbourhood_blocks(graph, np.array([0, 2]), hops=2)
    assert block.tolist() == [0, -1, 1, -1, 0, 0]


def test_a_block_joins_the_part_it_shares_edges_with_until_that_is_full() -> None:
    # A path 0-1-2-3-4-5, every node training: singleton blocks in node order.
    n = 6
    src = list(range(n - 1)) + list(range(1, n))
    dst = list(range(1, n)) + list(range(n - 1))
    graph = _graph(src, dst, n, train=list(range(n)))
    block = np.arange(n)
    part = assign_blocks(graph, block, 2, (1.0, 0.0, 0.0))
    # 0 opens part 0 (every part empty: the lower ID); 1 and 2 follow their
    # edges; part 0 then holds its share (3 of 6), so 3 takes the largest
    # balance score, the empty part 1, and 4, 5 follow it.
    assert part.tolist() == [0, 0, 0, 1, 1, 1]


def test_unconnected_blocks_go_by_balance_and_the_unreached_even_out_sizes() -> None:
    # No edges: every block by the largest balance score, ties by fewer nodes.
    graph = _graph([], [], 7, train=[0, 1, 2, 3])
    block = np.array([0, 1, 2, 3, -1, -1, -1])
    part = assign_blocks(graph, block, 2, (1.0, 0.0, 0.0))
    assert part[:4].tolist() == [0, 1, 0, 1]
    assert sorted(np.bincount(part).tolist()) == [3, 4]


def test_remote_accesses_are_what_a_walk_counts() -> None:
    rng = np.random.default_rng(3)
    n = 30
    src, dst = rng.integers(0, n, 90).tolist(), rng.integers(0, n, 90).tolist()
    graph = _graph(src, dst, n)
    part = rng.integers(0, 3, n)
    seeds = np.array([0, 4, 9, 17])
    everyone = set(range(n))
    want = 0
    for s in seeds.tolist():
        near = _hops_within(graph, s, everyone)
        want += sum(1 for v, d in near.items() if 0 < d <= 2 and part[v] != part[s])
    assert remote_khop_accesses(graph, part, seeds, 2) == want


@pytest.fixture(scope="module")
def products() -> Graph:
    return products_graph(
        ProductsConfig(nodes=3000, degree=10, features=4, classes=5, seed=2)
    )


def test_the_synthetic_graph_is_split_evenly_and_reported_beside_metis(
    products: Graph, capsys: pytest.CaptureFixture[str]
) -> None:
    first = get_partitioner("blocks").partition(products, 4, seed=0)
    again = BlocksPartitioner().partition(products, 4, seed=0)
    assert torch.equal(first.assignment, again.assignment)
    stats = PartitionStats.compute(products, first)
    assert sum(stats.num_nodes) == products.num_nodes
    for split in ("num_train", "num_val", "num_test"):
        assert stats.imbalance[split] < 1.35, split
    summary = partition_and_report(products, "blocks", 4, seed=0, quiet=True)
    assert summary["edge_cut"] == stats.edge_cut
    line = capsys.readouterr().out
    assert "remote 2-hop accesses of an epoch's training nodes" in line
    assert "(METIS: " in line


@pytest.mark.parametrize(
    ("params", "message"),
    [
        ({"hops": -1}, "hops: must be >= 0"),
        ({"alpha": 0.5}, "alpha, beta, gamma: give all three or none"),
        ({"alpha": -1.0, "beta": 1.0, "gamma": 1.0}, "alpha: expected a finite"),
        ({"alpha": 1.0, "beta": float("nan"), "gamma": 1.0}, "beta: expected a"),
    ],
)
def test_bad_parameters_are_refused_by_name(params: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        get_partitioner("blocks", **params)


def test_a_run_splits_into_blocks_as_deep_as_its_model(tmp_path) -> None:
    """``train --workers N --partition blocks``: K is the model's layers."""
    from graphwire.run.config import TrainConfig
    from graphwire.run.parts import partitioned_folder
    from graphwire.run.spec import DataSpec, OutputSpec, PartitionSpec, RunSpec
    from tests.cli_helpers import SMALL

    spec = RunSpec(
        mode="minibatch",
        world=2,
        data=DataSpec(dataset=SMALL),
        partition=PartitionSpec(method="blocks"),
        train=TrainConfig(num_layers=3, fanouts=[2, 2, 2]),
        output=OutputSpec(quiet=True),
    )
    folder = partitioned_folder(spec, tmp_path, leader=True, resuming=False)
    meta = json.loads((folder / "meta.json").read_text())
    assert meta["method"] == "blocks" and meta["params"]["hops"] == 3
