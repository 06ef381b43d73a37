"""PartitionStats against a brute-force Python recount."""

from __future__ import annotations

import json
from typing import Any

import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from graphwire.graph.graph import Graph
from graphwire.partition import Partition, PartitionStats
from graphwire.partition.stats import PER_PART


@st.composite
def graph_and_partition(draw: Any) -> tuple[Graph, Partition]:
    """Up to 60 nodes, 300 edges (self-loops and repeats included), 1-5 parts."""
    num_nodes = draw(st.integers(1, 60))
    num_edges = draw(st.integers(0, 300))
    num_parts = draw(st.integers(1, 5))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    # Disjoint splits: each node in at most one, each split ~30% or empty.
    which = rng.integers(0, 4, num_nodes)  # 3: in no split
    splits = {
        name: np.flatnonzero(which == k)
        if draw(st.booleans())
        else np.array([], np.int64)
        for k, name in enumerate(("train_idx", "val_idx", "test_idx"))
    }
    graph = Graph.from_edge_index(
        rng.integers(0, num_nodes, num_edges),
        rng.integers(0, num_nodes, num_edges),
        num_nodes=num_nodes,
        **{k: v for k, v in splits.items() if draw(st.booleans())},
    )
    assignment = torch.from_numpy(rng.integers(0, num_parts, num_nodes))
    return graph, Partition(assignment, num_parts)


def brute_force(graph: Graph, partition: Partition) -> dict[str, Any]:
    part = partition.assignment.tolist()
    src, dst = (t.tolist() for t in graph.edge_index())
    num_parts = partition.num_parts
    counts: dict[str, list[int]] = {name: [0] * num_parts for name in PER_PART}
    halo: list[set[int]] = [set() for _ in range(num_parts)]
    cut = 0
    for v in range(graph.num_nodes):
        counts["num_nodes"][part[v]] += 1
    for s, d in zip(src, dst, strict=True):
        counts["degree_sum"][part[d]] += 1
        counts["num_in_edges"][part[d]] += 1
        if part[s] != part[d]:
            cut += 1
            halo[part[d]].add(s)
    for p in range(num_parts):
        counts["num_halo"][p] = len(halo[p])
    for split in ("train", "val", "test"):
        idx = getattr(graph, f"{split}_idx")
        for v in [] if idx is None else idx.tolist():
            counts[f"num_{split}"][part[v]] += 1
    return {"edge_cut": cut, **counts}


@given(graph_and_partition())
def test_matches_brute_force(case: tuple[Graph, Partition]) -> None:
    graph, partition = case
    stats = PartitionStats.compute(graph, partition)
    expected = brute_force(graph, partition)
    assert stats.edge_cut == expected["edge_cut"]
    for name in PER_PART:
        values = stats.per_part(name)
        assert list(values) == expected[name], name
        mean = sum(values) / len(values)
        ratio = max(values) / mean if mean else 1.0
        assert stats.imbalance[name] == pytest.approx(ratio)
    json.dumps(stats.as_dict())  # JSON-ready


def example() -> tuple[Graph, Partition]:
    # 0 -> 1, 1 -> 2, 2 -> 0, 3 -> 0, 3 -> 2, self-loop 1 -> 1; parts {0,1} {2,3}.
    graph = Graph.from_edge_index(
        torch.tensor([0, 1, 2, 3, 3, 1]),
        torch.tensor([1, 2, 0, 0, 2, 1]),
        num_nodes=4,
        train_idx=torch.tensor([0, 1, 2]),
    )
    return graph, Partition(torch.tensor([0, 0, 1, 1]), num_parts=2)


def test_small_example_by_hand() -> None:
    stats = PartitionStats.compute(*example())
    # Cut edges: 1->2 (into part 1), 2->0 and 3->0 (into part 0).
    assert stats.edge_cut == 3
    assert stats.num_in_edges == (4, 2)
    assert stats.num_halo == (2, 1)  # part 0 reads 2 and 3; part 1 reads 1
    assert stats.num_train == (2, 1)
    assert stats.num_val == (0, 0)
    assert stats.imbalance["num_in_edges"] == pytest.approx(4 / 3)
    assert stats.imbalance["num_val"] == 1.0
    assert stats.cut_fraction == pytest.approx(0.5)


def test_views_for_the_cli() -> None:
    stats = PartitionStats.compute(*example())
    rows = stats.table_rows()
    assert rows[0] == (0, 2, 4, 4, 2, 2, 0, 0)
    assert rows[-1][0] == "max/mean" and len(rows[-1]) == 1 + len(PER_PART)
    summary = stats.summary()
    assert summary["edge_cut"] == 3 and summary["halo_max"] == 2
    assert summary["imbalance_nodes"] == 1.0
    assert stats.as_dict()["per_part"]["num_halo"] == [2, 1]
    with pytest.raises(ValueError, match="unknown quantity 'bytes'"):
        stats.per_part("bytes")


def test_rejects_partition_of_another_graph() -> None:
    graph, _ = example()
    with pytest.raises(ValueError, match="has 3 entries"):
        PartitionStats.compute(graph, Partition(torch.zeros(3, dtype=torch.int64), 1))
