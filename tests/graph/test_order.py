"""`stable_order` is torch's stable sort, by counting where the keys are dense;
`index_dtype` is int32 exactly while every bound fits."""

from __future__ import annotations

import pytest
import torch

from graphwire.graph import order
from graphwire.graph.graph import Graph
from graphwire.graph.order import index_dtype, locality_order, stable_order


@pytest.mark.parametrize(
    "n, high, dtype",
    [
        (1, 0, torch.int64),
        (7, 2, torch.int32),
        (5000, 40, torch.int64),  # many ties: stability decides the order
        (5000, 5000, torch.int32),
        (3000, 10_000_000, torch.int64),  # sparse keys: the comparison sort
        (200, 300, torch.int16),
    ],
)
def test_stable_order_is_torchs_stable_sort(n: int, high: int, dtype) -> None:
    generator = torch.Generator().manual_seed(n + high)
    keys = torch.randint(0, high + 1, (n,), generator=generator).to(dtype)
    assert torch.equal(stable_order(keys), torch.sort(keys, stable=True).indices)


def test_stable_order_counts_dense_keys(monkeypatch) -> None:
    # The counting path, not torch.sort, orders dense keys: if it were not
    # stable, the ties here (every key 10 times) would come out shuffled.
    def no_sort(*args, **kwargs):
        raise AssertionError("torch.sort was called for dense keys")

    monkeypatch.setattr(order.torch, "sort", no_sort)
    keys = torch.arange(1000).flip(0) % 100
    expected = torch.cat([torch.nonzero(keys == k).view(-1) for k in range(100)])
    assert torch.equal(stable_order(keys), expected)
    assert stable_order(keys).dtype == torch.int64
    assert stable_order(torch.empty(0, dtype=torch.int64)).numel() == 0


@pytest.mark.parametrize(
    "keys, message",
    [
        (torch.tensor([3, -1, 2]), "keys must be >= 0, found -1"),
        (torch.tensor([1.0, 2.0]), "expected 1-D integer keys, got torch.float32"),
        (
            torch.zeros(2, 2, dtype=torch.int64),
            r"integer keys, got torch.int64 \[2, 2\]",
        ),
    ],
)
def test_stable_order_names_bad_keys(keys: torch.Tensor, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        stable_order(keys)


def test_index_dtype_is_int32_exactly_while_every_bound_fits() -> None:
    top = torch.iinfo(torch.int32).max
    assert index_dtype() == torch.int32
    assert index_dtype(0, 5) == torch.int32
    assert index_dtype(top, top) == torch.int32
    assert index_dtype(top + 1) == torch.int64
    assert index_dtype(3, top + 1, 7) == torch.int64  # any one bound decides


def _bandwidth(graph_src: torch.Tensor, graph_dst: torch.Tensor, order) -> int:
    """The largest |position(src) - position(dst)| over the edges."""
    position = torch.empty_like(order)
    position[order] = torch.arange(order.numel())
    return int((position[graph_src] - position[graph_dst]).abs().max())


def test_locality_order_lays_a_shuffled_grid_out_in_a_narrow_band() -> None:
    # A 20 x 20 grid with shuffled IDs: in ID order its edges span the whole
    # range; in reverse Cuthill-McKee order no edge spans more than about a
    # row and a half of the grid (a BFS front of a grid is a diagonal).
    side = 20
    rows, cols = torch.meshgrid(torch.arange(side), torch.arange(side), indexing="ij")
    cell = rows * side + cols
    # Each cell to its right and lower neighbour, and back.
    tails = torch.cat([cell[:, :-1].reshape(-1), cell[:-1, :].reshape(-1)])
    heads = torch.cat([cell[:, 1:].reshape(-1), cell[1:, :].reshape(-1)])
    src, dst = torch.cat([tails, heads]), torch.cat([heads, tails])
    shuffle = torch.randperm(side * side, generator=torch.Generator().manual_seed(0))
    graph = Graph.from_edge_index(shuffle[src], shuffle[dst], num_nodes=side * side)
    order = locality_order(graph.indptr, graph.indices)
    assert torch.equal(torch.sort(order).values, torch.arange(side * side))
    src, dst = graph.edge_index()
    assert _bandwidth(src, dst, torch.arange(side * side)) > 10 * side
    assert _bandwidth(src, dst, order) <= 2 * side


def test_locality_order_keeps_to_each_groups_edges() -> None:
    # A directed path 0 -> 1 -> ... -> 5 given with shuffled IDs, and node 6
    # in a group of its own with edges to every path node: over the group's
    # edges alone the path is laid out end to end.
    path = torch.tensor([3, 0, 5, 1, 4, 2])
    src = torch.cat([path[:-1], torch.full((6,), 6)])
    dst = torch.cat([path[1:], path])
    graph = Graph.from_edge_index(src, dst, num_nodes=7)
    group = torch.tensor([0, 0, 0, 0, 0, 0, 1])
    order = locality_order(graph.indptr, graph.indices, group)
    grouped = order[stable_order(group[order])]
    assert grouped[-1] == 6
    along = grouped[:-1].tolist()
    assert along in (path.tolist(), path.flip(0).tolist())


def test_locality_order_of_graphs_without_nodes_or_edges() -> None:
    no_edges = torch.empty(0, dtype=torch.int64)
    empty = locality_order(torch.zeros(1, dtype=torch.int64), no_edges)
    assert empty.tolist() == [] and empty.dtype == torch.int64
    alone = locality_order(torch.zeros(4, dtype=torch.int64), no_edges)
    assert sorted(alone.tolist()) == [0, 1, 2]
