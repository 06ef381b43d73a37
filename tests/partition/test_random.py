"""Random partitioning: balanced, seeded, and really random."""

from __future__ import annotations

import numpy as np
import torch
from hypothesis import given
from hypothesis import strategies as st

from graphwire.graph.graph import Graph
from graphwire.partition import RandomPartitioner


def empty_graph(num_nodes: int) -> Graph:
    none = torch.zeros(0, dtype=torch.int64)
    return Graph.from_edge_index(none, none, num_nodes=num_nodes)


@given(num_nodes=st.integers(1, 200), data=st.data())
def test_sizes_differ_by_at_most_one(num_nodes: int, data: st.DataObject) -> None:
    num_parts = data.draw(st.integers(1, min(num_nodes, 8)))
    seed = data.draw(st.integers(0, 2**32 - 1))
    part = RandomPartitioner().partition(empty_graph(num_nodes), num_parts, seed=seed)
    sizes = part.part_sizes()
    assert int(sizes.sum()) == num_nodes
    assert int(sizes.max() - sizes.min()) <= 1


def test_same_seed_same_assignment() -> None:
    graph = empty_graph(500)
    first = RandomPartitioner().partition(graph, 4, seed=3).assignment
    again = RandomPartitioner().partition(graph, 4, seed=3).assignment
    assert torch.equal(first, again)


def test_different_seeds_differ() -> None:
    graph = empty_graph(500)
    runs = {
        tuple(RandomPartitioner().partition(graph, 4, seed=s).assignment.tolist())
        for s in range(5)
    }
    assert len(runs) == 5


def test_not_contiguous() -> None:
    # A random split of 1000 nodes into 2 has about 500 part changes along the
    # ID order; a chunk split has 1.
    part = RandomPartitioner().partition(empty_graph(1000), 2, seed=0)
    changes = int(np.count_nonzero(np.diff(part.assignment.numpy())))
    assert 400 < changes < 600
