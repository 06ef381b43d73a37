"""Held-out links (:mod:`graphwire.graph.links`).

- every undirected edge is in exactly one of train / val / test; the
  training graph holds its pairs both ways and no held-out one; the split
  is a function of the seed;
- a negative is never an edge of the whole graph, nor its node itself;
- a graph with too few edges, bad fractions, and a corrupt file are refused
  with one line naming them; the file round-trips through the parts.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from graphwire.graph.graph import Graph
from graphwire.graph.links import (
    HELD_OUT_FILE,
    LinkSplitError,
    load_held_out,
    save_held_out,
    split_links,
)
from graphwire.graph.synthetic import ProductsConfig, products_graph


def _pairs(src: torch.Tensor, dst: torch.Tensor, n: int) -> set[int]:
    lo, hi = torch.minimum(src, dst), torch.maximum(src, dst)
    return set((lo * n + hi)[lo != hi].tolist())


@given(
    nodes=st.integers(40, 80),
    degree=st.integers(3, 6),
    seed=st.integers(0, 2**31),
)
def test_every_edge_lands_in_one_split_and_negatives_are_not_edges(
    nodes: int, degree: int, seed: int
) -> None:
    graph = products_graph(
        ProductsConfig(nodes=nodes, degree=degree, features=2, classes=2, seed=seed)
    )
    n = graph.num_nodes
    split = split_links(graph, val=0.1, test=0.2, negatives=7, seed=seed)
    every = _pairs(*graph.edge_index(), n)
    train = _pairs(*split.graph.edge_index(), n)
    val = _pairs(split.val.src, split.val.dst, n)
    test = _pairs(split.test.src, split.test.dst, n)
    assert train | val | test == every
    assert len(train) + len(val) + len(test) == len(every)  # disjoint
    assert len(val) == int(0.1 * len(every)) and len(test) == int(0.2 * len(every))
    src, dst = split.graph.edge_index()
    assert set((src * n + dst).tolist()) == set((dst * n + src).tolist())  # both ways
    assert torch.equal(split.graph.x, graph.x)
    for held in (split.val, split.test):
        assert held.neg.shape == (held.num_pairs, 7)
        rows = held.src.unsqueeze(1).expand_as(held.neg)
        assert not (rows == held.neg).any()
        assert not _pairs(rows.reshape(-1), held.neg.reshape(-1), n) & every
    again = split_links(graph, val=0.1, test=0.2, negatives=7, seed=seed)
    assert torch.equal(again.test.neg, split.test.neg)
    assert torch.equal(again.graph.indices, split.graph.indices)


def test_a_node_joined_to_nearly_all_still_gets_its_negatives() -> None:
    # node 0 is joined to all but node 9: its one negative is 9.
    n = 10
    src = torch.tensor([0] * 8 + [1, 2, 3])
    dst = torch.tensor(list(range(1, 9)) + [2, 3, 4])
    graph = Graph.from_edge_index(src, dst, n)
    split = split_links(graph, val=0.2, test=0.2, negatives=5, seed=1)
    for held in (split.val, split.test):
        for u, row in zip(held.src.tolist(), held.neg, strict=True):
            if u == 0:
                assert set(row.tolist()) == {9}


@pytest.mark.parametrize(
    ("edges", "kwargs", "message"),
    [
        (3, {}, "has 3 undirected edges; holding out 5% for validation"),
        (40, {"val": 0.0}, "val fraction 0.0 not in"),
        (40, {"val": 0.5, "test": 0.5}, "leaves no edges to train on"),
        (40, {"negatives": 0}, "negatives 0 < 1"),
    ],
)
def test_too_few_edges_or_bad_fractions_are_one_line(
    edges: int, kwargs: dict, message: str
) -> None:
    src = torch.arange(edges)
    graph = Graph.from_edge_index(src, src + 1, edges + 1, name="tiny")
    with pytest.raises(LinkSplitError, match=message) as error:
        split_links(graph, **kwargs)
    assert "\n" not in str(error.value)


def test_the_held_out_file_round_trips_and_refuses_corruption(tmp_path) -> None:
    graph = products_graph(
        ProductsConfig(nodes=80, degree=4, features=2, classes=2, seed=0)
    )
    split = split_links(graph)
    save_held_out(tmp_path, split.val, split.test)
    val, test = load_held_out(tmp_path, graph.num_nodes)
    assert torch.equal(val.neg, split.val.neg) and torch.equal(test.dst, split.test.dst)
    with pytest.raises(LinkSplitError, match="outside"):
        load_held_out(tmp_path, 3)
    (tmp_path / HELD_OUT_FILE).write_bytes(b"not an npz")
    with pytest.raises(LinkSplitError, match="unreadable held-out edges"):
        load_held_out(tmp_path, graph.num_nodes)
    with pytest.raises(LinkSplitError, match="holds no held-out edges"):
        load_held_out(tmp_path / "nowhere", graph.num_nodes)
    np.savez(tmp_path / HELD_OUT_FILE, val_src=np.zeros(2, dtype=np.int64))
    with pytest.raises(LinkSplitError, match="unreadable"):
        load_held_out(tmp_path, graph.num_nodes)
