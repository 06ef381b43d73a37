"""G3's bins: BFS order, per-layer memory budget, message order."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from graphwire.comm.local import run_local
from graphwire.comm.plan import ExchangePlan
from graphwire.fullgraph.g3.bins import (
    RAMP,
    _bin,
    bfs_order,
    bin_bytes,
    layer_bins,
    priority_order,
)
from graphwire.graph.graph import Graph
from graphwire.nn.base import MessageGraph
from graphwire.nn.models import LAYER_KINDS
from graphwire.partition import load_part
from graphwire.run.local_graph import local_message_graph
from tests.fullgraph.dist_helpers import (
    config_for,
    run_dist_steps,
    single_step,
    small_graph,
    write_parts,
)
from tests.fullgraph.test_parity import _assert_matches


def _graph_of(edges: list[tuple[int, int]], num_dst: int, num_src: int) -> MessageGraph:
    """In-edge CSR of ``(src, dst)`` pairs."""
    edges = sorted(edges, key=lambda e: (e[1], e[0]))
    dst = torch.tensor([d for _, d in edges], dtype=torch.int64)
    indptr = torch.zeros(num_dst + 1, dtype=torch.int64)
    torch.cumsum(torch.bincount(dst, minlength=num_dst), 0, out=indptr[1:])
    indices = torch.tensor([s for s, _ in edges], dtype=torch.int64)
    return MessageGraph(indptr, indices, num_src, num_dst)


def test_bfs_order_walks_each_component_then_puts_remote_rows_first() -> None:
    # Owned 0..6; path 0-2-1-3, isolated 4, pair 5-6; halo row 7 feeds row 1.
    undirected = [(0, 2), (2, 1), (1, 3), (5, 6)]
    edges = undirected + [(b, a) for a, b in undirected] + [(7, 1)]
    mg = _graph_of(edges, 7, 8)
    # BFS: 0 2 1 3 | 4 | 5 6; then the row with a remote in-neighbour first.
    assert bfs_order(mg).tolist() == [1, 0, 2, 3, 4, 5, 6]


def _part_graph(tmp_path: Path, parts: int = 2) -> tuple[MessageGraph, ExchangePlan]:
    folder = write_parts(small_graph(), parts, tmp_path, "metis")

    def build(transport):
        part = load_part(folder, transport.rank)
        plan = ExchangePlan.build(part, transport)
        mg = local_message_graph(part, plan, transport, LAYER_KINDS["gcn"])
        return mg, plan

    return run_local(build, parts)[0]


@pytest.mark.parametrize("order_name", ["bfs", "priority"])
def test_bins_fit_the_budget_and_are_as_large_as_it_allows(tmp_path, order_name):
    mg, plan = _part_graph(tmp_path)
    n = mg.num_dst
    order = bfs_order(mg) if order_name == "bfs" else priority_order(mg, plan)
    assert sorted(order.tolist()) == list(range(n))
    budget = 24_000
    counts = {}
    for widths in [(12, 64), (64, 5)]:
        layer = layer_bins(mg, order, widths, budget, max_rows=None)
        rows = torch.cat([b.rows for b in layer.bins])
        assert sorted(rows.tolist()) == list(range(n))  # every row once
        counts[widths] = len(layer.bins)
        for index, b in enumerate(layer.bins):
            # The first num_local bins read no halo row; the others do.
            assert bool(b.src_halo.numel()) == (index >= layer.num_local)
            size = bin_bytes(b.mg.num_src, b.rows.numel(), widths)
            assert size <= budget or b.rows.numel() == 1
            same_group = index + 1 != layer.num_local
            if index + 1 < len(layer.bins) and same_group:
                # Greedy: one more row (the next bin's first) would not fit.
                bigger = _bin(mg, torch.cat([b.rows, layer.bins[index + 1].rows[:1]]))
                assert bin_bytes(bigger.mg.num_src, b.rows.numel() + 1, widths) > budget
        assert layer.position[layer.bins[0].rows[0]] == 0
    # The wider layer gets more, smaller bins.
    assert counts[(12, 64)] > counts[(64, 5)] > 2


def test_max_rows_caps_bins(tmp_path) -> None:
    mg, plan = _part_graph(tmp_path)
    layer = layer_bins(mg, priority_order(mg, plan), (8, 8), 2**30, max_rows=16)
    sizes = [b.rows.numel() for b in layer.bins]
    assert max(sizes) == 16 and len(layer.bins) >= mg.num_dst // 16
    # Rows without halo inputs: full bins. Rows with them (those peers
    # need): the caps ramp up from 16 / RAMP (at least 1), doubling, so the
    # first sends leave early.
    local, halo = sizes[: layer.num_local], sizes[layer.num_local :]
    assert local[:-1] == [16] * (len(local) - 1)
    assert halo[:4] == [1, 2, 4, 8] and set(halo[4:-1]) == {16}
    assert RAMP == 32


def _directed(graph: Graph) -> Graph:
    """``graph`` with only the edges from lower to higher node IDs."""
    src, dst = graph.edge_index()
    keep = src < dst
    edges = Graph.from_edge_index(src[keep], dst[keep], graph.num_nodes)
    return graph.replace(indptr=edges.indptr, indices=edges.indices)


@pytest.mark.parametrize("options", [{"bin_rows": 8}, {"bin_rows": 8, "mode": "intra"}])
def test_directed_graph_messages_arrive_in_send_order(tmp_path, options) -> None:
    """On a directed graph, rows without remote in-neighbours can still be
    needed by a peer; the cached input layer computes (and sends) its halo
    bins first, so receivers must post their receives in that order."""
    graph = _directed(small_graph())
    config = config_for("sage")
    oracle = single_step(graph, config)
    folder = write_parts(graph, 3, tmp_path, "random")
    ranks = run_dist_steps(folder, 3, config, "g3", options)
    _assert_matches(ranks, oracle)


def test_a_part_without_rows_has_no_bins() -> None:
    mg = _graph_of([], 0, 0)
    assert bfs_order(mg).tolist() == []
    layer = layer_bins(mg, bfs_order(mg), (4, 4), 1024, max_rows=8)
    assert layer.bins == [] and layer.num_local == 0
