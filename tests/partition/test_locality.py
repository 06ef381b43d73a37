"""G3 locality partitioning: exact incremental bookkeeping, balanced halos."""

from __future__ import annotations

import json
import tracemalloc
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from graphwire.graph.graph import Graph
from graphwire.graph.synthetic import ProductsConfig, products_graph
from graphwire.partition import (
    MetisPartitioner,
    Partition,
    PartitionStats,
    write_partitioned,
)
from graphwire.partition.base import PARTITIONERS, get_partitioner
from graphwire.partition.halo import HaloTracker
from graphwire.partition.locality import (
    HALO_WEIGHTS,
    LocalityPartitioner,
    RefineResult,
    refine,
)


@st.composite
def graph_owner_moves(draw: Any) -> tuple[Graph, np.ndarray, int, np.ndarray]:
    """Up to 40 nodes, 200 directed edges (loops and repeats), 1-4 parts, and
    a list of node pairs to swap (or, if a pair shares a part, to move)."""
    num_nodes = draw(st.integers(2, 40))
    num_edges = draw(st.integers(0, 200))
    num_parts = draw(st.integers(1, 4))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    graph = Graph.from_edge_index(
        rng.integers(0, num_nodes, num_edges),
        rng.integers(0, num_nodes, num_edges),
        num_nodes=num_nodes,
    )
    owner = rng.integers(0, num_parts, num_nodes)
    pairs = rng.integers(0, num_nodes, (draw(st.integers(1, 30)), 2))
    return graph, owner, num_parts, pairs


def brute_links(graph: Graph, owner: np.ndarray, num_parts: int) -> np.ndarray:
    """links[p, u] = distinct out-neighbours v != u of u owned by p (sets)."""
    out: list[set[int]] = [set() for _ in range(graph.num_nodes)]
    src, dst = (t.tolist() for t in graph.edge_index())
    for s, d in zip(src, dst, strict=True):
        if s != d:
            out[s].add(d)
    links = np.zeros((num_parts, graph.num_nodes), dtype=np.int64)
    for u, targets in enumerate(out):
        for v in targets:
            links[owner[v], u] += 1
    return links


def check(tracker: HaloTracker, graph: Graph, num_parts: int) -> None:
    owner = tracker.owner
    stats = PartitionStats.compute(
        graph, Partition(torch.from_numpy(owner.copy()), num_parts)
    )
    np.testing.assert_array_equal(tracker.links, brute_links(graph, owner, num_parts))
    assert tuple(tracker.halo) == stats.num_halo
    assert tuple(tracker.degree_sum) == stats.degree_sum
    assert tracker.edge_cut == tracker.recount(owner)[2]


@given(graph_owner_moves())
def test_incremental_bookkeeping_matches_recount(
    case: tuple[Graph, np.ndarray, int, np.ndarray],
) -> None:
    graph, owner, num_parts, pairs = case
    tracker = HaloTracker(graph, owner, num_parts)
    check(tracker, graph, num_parts)
    sizes = np.bincount(tracker.owner, minlength=num_parts)
    for step, (a, b) in enumerate(pairs.tolist()):
        part_a, part_b = int(tracker.owner[a]), int(tracker.owner[b])
        if part_a != part_b:  # a swap, as refine does
            tracker.move(a, part_b)
            tracker.move(b, part_a)
        else:  # a one-way move to another part (not done by refine)
            tracker.move(a, (part_a + 1) % num_parts)
            tracker.move(a, part_a)
            tracker.move(a, (part_a + 1) % num_parts)
            sizes = np.bincount(tracker.owner, minlength=num_parts)
        np.testing.assert_array_equal(
            np.bincount(tracker.owner, minlength=num_parts), sizes
        )
        if step % 5 == 0:
            check(tracker, graph, num_parts)
    check(tracker, graph, num_parts)


def test_recount_peak_memory_is_about_links() -> None:
    """The docstring's 4PN bytes: one bincount over P * N keys held int64
    counts, their int32 copy and two [P, N] masks at once (about 12PN)."""
    rng = np.random.default_rng(0)
    num_nodes, num_parts = 20_000, 32  # links: 2.56 MB, edges: 0.3 MB
    graph = Graph.from_edge_index(
        rng.integers(0, num_nodes, 40_000),
        rng.integers(0, num_nodes, 40_000),
        num_nodes=num_nodes,
    )
    owner = rng.integers(0, num_parts, num_nodes)
    tracker = HaloTracker(graph, owner, num_parts)
    tracemalloc.start()
    try:
        links, halo, edge_cut = tracker.recount(owner)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 1.5 * links.nbytes, (peak, links.nbytes)
    np.testing.assert_array_equal(links, brute_links(graph, owner, num_parts))
    assert (halo, edge_cut) == (tracker.halo, tracker.edge_cut)


@given(graph_owner_moves())
def test_gain_scores_are_the_exact_change(
    case: tuple[Graph, np.ndarray, int, np.ndarray],
) -> None:
    """With the last weight, a key is (halo score, cut change) exactly."""
    graph, owner, num_parts, pairs = case
    if num_parts < 2:
        return
    tracker = HaloTracker(graph, owner, num_parts)
    weight = HALO_WEIGHTS[-1]
    for node in pairs[:, 0].tolist():
        frm = int(tracker.owner[node])
        to = (frm + 1) % num_parts
        nodes = np.array([node])
        for side in (frm, to):
            key = int(tracker.keys(nodes, frm, to, side, "gain", weight)[0])
            score = (key + weight // 2) // weight
            cut_change = score * weight - key
            halo, cut = tracker.halo[side], tracker.edge_cut
            tracker.move(node, to)
            # score = halo leaving `side` (frm == side) or -halo entering it
            assert tracker.halo[side] - halo == -score
            assert tracker.edge_cut - cut == cut_change
            tracker.move(node, frm)
    check(tracker, graph, num_parts)


@pytest.fixture(scope="module")
def products() -> Graph:
    return products_graph(ProductsConfig(nodes=20_000, features=0, seed=0))


@pytest.mark.parametrize("num_parts", [4, 8])
def test_balances_halos_on_products(products: Graph, num_parts: int) -> None:
    metis = MetisPartitioner(balance=("count", "degree")).partition(
        products, num_parts, seed=0
    )
    before = PartitionStats.compute(products, metis)
    partitioner = LocalityPartitioner()
    partition = partitioner.partition(products, num_parts, seed=0)
    after = PartitionStats.compute(products, partition)
    result = partitioner.last_refinement
    assert result is not None and result.stop_reason == "converged"
    # stage 1 is the same METIS run; the result reports what PartitionStats says
    assert result.halo_before == before.num_halo
    assert result.halo_after == after.num_halo
    assert (result.edge_cut_before, result.edge_cut_after) == (
        before.edge_cut,
        after.edge_cut,
    )
    ratio_before = RefineResult.max_min(before.num_halo)
    ratio_after = RefineResult.max_min(after.num_halo)
    assert ratio_after < ratio_before
    assert RefineResult.spread(after.num_halo) <= 0.005
    assert after.edge_cut <= 1.10 * before.edge_cut
    assert after.num_nodes == before.num_nodes  # swaps keep |V_p|
    assert after.imbalance["degree_sum"] <= max(
        before.imbalance["degree_sum"], 1.05 + 1e-9
    )
    assert partition.method == "locality"
    json.dumps(partition.params)


def test_paper_rule_balances_too(products: Graph) -> None:
    initial = MetisPartitioner(balance=("count", "degree")).assign(products, 8, 0)
    _, result = refine(products, initial, 8, rule="paper")
    assert result.max_min(result.halo_after) < result.max_min(result.halo_before)
    assert result.spread(result.halo_after) <= 0.005
    assert result.cut_growth <= 0.10


def test_limits_are_kept(products: Graph) -> None:
    initial = MetisPartitioner(balance=("count", "degree")).assign(products, 8, 0)
    degree_before = np.bincount(
        initial, weights=products.in_degrees().numpy(), minlength=8
    )
    owner, result = refine(products, initial, 8, max_cut_growth=0.0, degree_slack=0.0)
    assert result.edge_cut_after <= result.edge_cut_before
    assert max(result.degree_sum_after) <= degree_before.max()
    assert result.max_min(result.halo_after) < result.max_min(result.halo_before)
    # nothing allowed: the stage-1 partition comes back untouched
    same, stopped = refine(products, initial, 8, max_swaps=0)
    np.testing.assert_array_equal(same, initial)
    assert (stopped.num_swaps, stopped.stop_reason) == (0, "max_swaps")
    assert stopped.halo_after == stopped.halo_before
    _, loose = refine(products, initial, 8, gamma=0.9)
    assert (loose.num_swaps, loose.stop_reason) == (0, "converged")


def test_the_last_allowed_swap_may_converge() -> None:
    """Balance reached by swap max_swaps was reported as "max_swaps"."""
    graph = products_graph(ProductsConfig(nodes=4_000, features=0, seed=1))
    initial = MetisPartitioner(balance=("count", "degree")).assign(graph, 4, 0)
    _, full = refine(graph, initial, 4)
    assert full.stop_reason == "converged" and full.num_swaps > 1
    _, capped = refine(graph, initial, 4, max_swaps=full.num_swaps)
    assert (capped.num_swaps, capped.stop_reason) == (full.num_swaps, "converged")
    _, short = refine(graph, initial, 4, max_swaps=full.num_swaps - 1)
    assert (short.num_swaps, short.stop_reason) == (full.num_swaps - 1, "max_swaps")


def test_deterministic_for_a_seed() -> None:
    graph = products_graph(ProductsConfig(nodes=4_000, features=0, seed=1))
    first = LocalityPartitioner().partition(graph, 4, seed=3)
    second = LocalityPartitioner().partition(graph, 4, seed=3)
    assert torch.equal(first.assignment, second.assignment)
    single = LocalityPartitioner()
    assert not single.partition(graph, 1, seed=0).assignment.any()
    assert single.last_refinement is not None
    assert single.last_refinement.stop_reason == "converged"


def test_params_record_the_constraints_stage_1_used() -> None:
    graph = products_graph(ProductsConfig(nodes=100, degree=4, features=0))
    partition = LocalityPartitioner().partition(graph, 2, seed=0)
    assert partition.params["constraints"] == ["count", "degree"]
    # Without edges METIS balances the node count only, as metis records.
    no_edges = Graph.from_edge_index([], [], num_nodes=10)
    partition = LocalityPartitioner().partition(no_edges, 2, seed=0)
    assert partition.params["balance"] == ["count", "degree"]
    assert partition.params["constraints"] == ["count"]


def test_numpy_int_params_are_taken_as_plain_ints() -> None:
    built = LocalityPartitioner(
        ufactor=np.int64(40),
        max_swaps=np.int64(5),
        batch_size=np.int32(7),
        patience=np.uint8(3),
    )
    params = built.params()
    for name, value in (("ufactor", 40), ("max_swaps", 5), ("batch_size", 7)):
        assert params[name] == value and type(params[name]) is int, name
    assert params["patience"] == 3 and type(params["patience"]) is int
    json.dumps(params)  # what meta.json will hold


def test_an_infinite_limit_is_no_limit_and_recorded_as_none(tmp_path: Path) -> None:
    """max_cut_growth=inf went into meta.json as Infinity, which is not JSON."""
    graph = products_graph(ProductsConfig(nodes=100, degree=4, features=0))
    built = get_partitioner(
        "locality", max_cut_growth=float("inf"), degree_slack=np.float64("inf")
    )
    partition = built.partition(graph, 2, seed=0)
    assert partition.params["max_cut_growth"] is None
    assert partition.params["degree_slack"] is None
    unlimited = LocalityPartitioner(max_cut_growth=None, degree_slack=None)
    assert torch.equal(
        unlimited.partition(graph, 2, seed=0).assignment, partition.assignment
    )
    folder = write_partitioned(graph, partition, tmp_path / "parts")
    meta = json.loads((folder / "meta.json").read_text(), parse_constant=_refuse)
    assert meta["params"]["max_cut_growth"] is None
    for bad in (float("nan"), -float("inf"), -0.5, True, "0.1"):
        with pytest.raises(
            ValueError, match=r"max_cut_growth: expected a number >= 0, or None"
        ):
            LocalityPartitioner(max_cut_growth=bad)


def _refuse(constant: str) -> None:
    raise AssertionError(f"meta.json holds {constant}, which is not JSON")


def test_registered_and_validated() -> None:
    assert PARTITIONERS["locality"] is LocalityPartitioner
    built = get_partitioner("locality", balance="count,degree", gamma=0.01)
    assert isinstance(built, LocalityPartitioner)
    assert built.params()["balance"] == ["count", "degree"]
    assert built.params()["gamma"] == 0.01
    for bad in (
        {"gamma": 1.5},
        {"rule": "fastest"},
        {"batch_size": 0},
        {"patience": True},
        {"max_swaps": -1},
        {"max_cut_growth": -0.1},
        {"degree_slack": float("nan")},
        {"balance": ("bogus",)},
    ):
        with pytest.raises(ValueError):
            get_partitioner("locality", **bad)
    graph = products_graph(ProductsConfig(nodes=100, degree=4, features=0))
    with pytest.raises(ValueError, match="assignment"):
        refine(graph, np.zeros(99, dtype=np.int64), 2)
    with pytest.raises(ValueError, match="assignment"):
        refine(graph, np.full(100, 2), 2)
    with pytest.raises(ValueError, match="rule"):
        refine(graph, np.zeros(100, dtype=np.int64), 2, rule="fastest")


def test_refine_summary_is_strict_json_when_a_part_has_no_halo() -> None:
    result = RefineResult(
        halo_before=(0, 6),  # a directed graph: one part reads no other
        halo_after=(3, 4),
        degree_sum_before=(5, 5),
        degree_sum_after=(5, 5),
        edge_cut_before=6,
        edge_cut_after=7,
        num_swaps=1,
        num_rejected=0,
        stop_reason="converged",
        seconds=0.0,
    )
    summary = json.loads(json.dumps(result.summary(), allow_nan=False))
    assert summary["halo_max_min_before"] is None  # inf
    assert summary["halo_max_min_after"] == pytest.approx(4 / 3, abs=1e-4)


@pytest.mark.parametrize(
    ("cut_after", "growth", "logged"), [(0, 0.0, 0.0), (2, float("inf"), None)]
)
def test_cut_growth_from_a_zero_cut(
    cut_after: int, growth: float, logged: float | None
) -> None:
    """One part has no cut: it stays 0 (no change, not -100%), or grows from
    0 (inf, None in the JSON summary)."""
    result = RefineResult(
        halo_before=(0,),
        halo_after=(0,),
        degree_sum_before=(5,),
        degree_sum_after=(5,),
        edge_cut_before=0,
        edge_cut_after=cut_after,
        num_swaps=0,
        num_rejected=0,
        stop_reason="converged",
        seconds=0.0,
    )
    assert result.cut_growth == growth
    summary = json.loads(json.dumps(result.summary(), allow_nan=False))
    assert summary["cut_growth"] == logged
