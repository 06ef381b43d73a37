"""Chunk partitioning: contiguous ID ranges of near-equal size."""

from __future__ import annotations

import numpy as np
import torch
from hypothesis import given
from hypothesis import strategies as st

from graphwire.graph.graph import Graph
from graphwire.partition import ChunkPartitioner


def empty_graph(num_nodes: int) -> Graph:
    none = torch.zeros(0, dtype=torch.int64)
    return Graph.from_edge_index(none, none, num_nodes=num_nodes)


@given(num_nodes=st.integers(1, 300), data=st.data())
def test_contiguous_and_balanced(num_nodes: int, data: st.DataObject) -> None:
    num_parts = data.draw(st.integers(1, min(num_nodes, 9)))
    part = ChunkPartitioner().partition(empty_graph(num_nodes), num_parts, seed=0)
    assignment = part.assignment.numpy()
    # Non-decreasing with every part present: each part is one ID range.
    assert (np.diff(assignment) >= 0).all()
    assert np.unique(assignment).tolist() == list(range(num_parts))
    sizes = part.part_sizes()
    assert int(sizes.max() - sizes.min()) <= 1


def test_example_ranges() -> None:
    part = ChunkPartitioner().partition(empty_graph(10), 3, seed=0)
    assert part.assignment.tolist() == [0, 0, 0, 0, 1, 1, 1, 2, 2, 2]


def test_seed_has_no_effect() -> None:
    graph = empty_graph(50)
    runs = [ChunkPartitioner().partition(graph, 4, seed=s).assignment for s in (0, 9)]
    assert torch.equal(runs[0], runs[1])
