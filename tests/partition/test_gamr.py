"""GAMR's priority-based BFS order and the paper's slot-level switch model (Eq. 3-6).

The star and ring figures are the paper's analysis (§3.2.2) for k = 1 where the
literal model reproduces it: PB gives n on a star and n + 2 on a ring of n >= 4,
the best ring order n + 1, and a 3-ring is order-independent. The model gives
2n - 2 for a star whose hub is sent last, not the paper's 2n - 1 (the hub's own
aggregator completes with the last leaf and drains with it; digest §2.4).
"""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from graphwire.partition.gamr import gamr_order, random_order, slot_model


def undirected(pairs: list[tuple[int, int]]) -> tuple[np.ndarray, np.ndarray]:
    """Both directions of each pair, as int64 src, dst."""
    edges = np.asarray(pairs, dtype=np.int64).reshape(-1, 2)
    return np.r_[edges[:, 0], edges[:, 1]], np.r_[edges[:, 1], edges[:, 0]]


def star(n: int) -> tuple[np.ndarray, np.ndarray]:
    return undirected([(0, leaf) for leaf in range(1, n)])


def ring(n: int) -> tuple[np.ndarray, np.ndarray]:
    return undirected([(i, (i + 1) % n) for i in range(n)])


@pytest.mark.parametrize("n", range(4, 11))
def test_star_pb_sends_the_hub_first_and_takes_n_slots(n: int) -> None:
    src, dst = star(n)
    order = gamr_order(src, dst)
    assert order[0] == 0
    assert slot_model(order, src, dst).z == n


@pytest.mark.parametrize("n", range(4, 11))
def test_star_random_orders_take_n_at_best_and_2n_minus_2_hub_last(n: int) -> None:
    src, dst = star(n)
    zs = [slot_model(random_order(src, dst, seed), src, dst).z for seed in range(200)]
    assert min(zs) == n
    hub_last = np.r_[np.arange(1, n), 0]
    assert slot_model(hub_last, src, dst).z == 2 * n - 2 == max(zs)


@pytest.mark.parametrize("n", range(4, 9))
def test_ring_pb_takes_n_plus_2(n: int) -> None:
    src, dst = ring(n)
    assert slot_model(gamr_order(src, dst), src, dst).z == n + 2


@pytest.mark.parametrize("n", range(4, 9))
def test_ring_best_order_takes_n_plus_1(n: int) -> None:
    # Rotating the labels of a ring leaves z unchanged, so fixing the first
    # vertex still searches every order.
    src, dst = ring(n)
    best = min(
        slot_model(np.array((0, *rest)), src, dst).z
        for rest in itertools.permutations(range(1, n))
    )
    assert best == n + 1


def test_a_ring_of_three_takes_the_same_time_in_every_order() -> None:
    src, dst = ring(3)
    zs = {slot_model(np.array(p), src, dst).z for p in itertools.permutations(range(3))}
    assert zs == {slot_model(gamr_order(src, dst), src, dst).z}


@pytest.mark.parametrize("n", range(5, 13))
def test_pb_beats_random_orders_on_average_on_stars(n: int) -> None:
    src, dst = star(n)
    pb = slot_model(gamr_order(src, dst), src, dst).z
    zs = [slot_model(random_order(src, dst, seed), src, dst).z for seed in range(200)]
    assert np.mean(zs) > pb


def test_fig8_walkthrough() -> None:
    # Paper Fig. 8: 1 is dequeued and enqueues 3 and 5; 5 has more neighbours
    # than 3, so it goes first and enqueues 7; 3 and 7 have equal degree and 3
    # was enqueued first; 9, with one neighbour, goes last. Vertex 1 gets the
    # highest degree here so that our deterministic root is the paper's.
    src, dst = undirected([(1, 3), (1, 4), (1, 5), (1, 9), (4, 5), (3, 7), (5, 7)])
    assert gamr_order(src, dst).tolist() == [1, 5, 3, 4, 7, 9]
    # A level-by-level BFS would send 1, 3, 4, 5, 9, 7: the frontier is one heap.


def test_a_disconnected_graph_restarts_at_the_highest_degree_vertex() -> None:
    src, dst = undirected(
        [(11, 10), (11, 12), (20, 21), (20, 22), (20, 23), (6, 5), (40, 41)]
    )
    order = gamr_order(src, dst)
    assert order.tolist() == [20, 21, 22, 23, 11, 10, 12, 5, 6, 40, 41]
    assert order.dtype == np.int64


def test_loops_and_repeated_edges_do_not_add_to_the_degree() -> None:
    # 0 has one neighbour however often 0 -> 1 repeats; 2 has two, so it is the root.
    src = np.array([0, 0, 0, 1, 0, 0, 2, 2])
    dst = np.array([1, 1, 1, 0, 0, 0, 3, 4])
    assert gamr_order(src, dst).tolist() == [2, 3, 4, 0, 1]


def test_one_direction_is_enough_for_the_order() -> None:
    src = np.zeros(5, dtype=np.int64)
    dst = np.arange(1, 6)
    assert gamr_order(src, dst).tolist() == [0, 1, 2, 3, 4, 5]
    assert gamr_order(dst, src).tolist() == [0, 1, 2, 3, 4, 5]


def test_every_vertex_appears_once() -> None:
    rng = np.random.default_rng(0)
    src = rng.integers(0, 10**9, 3000)
    dst = np.r_[src[1000:], rng.integers(0, 10**9, 1000)]
    vertices = np.unique(np.r_[src, dst])
    order = gamr_order(src, dst)
    assert np.array_equal(np.sort(order), vertices)
    shuffled = random_order(src, dst, seed=3)
    assert np.array_equal(np.sort(shuffled), vertices)
    assert np.array_equal(shuffled, random_order(src, dst, seed=3))
    assert not np.array_equal(shuffled, random_order(src, dst, seed=4))
    assert slot_model(order, src, dst).z >= vertices.size


def test_slot_model_counts_completions_and_queue_by_hand() -> None:
    src, dst = star(4)
    hub_first = slot_model(np.array([0, 1, 2, 3]), src, dst)
    # Slot 1: the hub completes its three leaves' aggregators; one leaves per slot.
    assert hub_first.completions.tolist() == [3, 0, 0, 1]
    assert hub_first.queue.tolist() == [2, 1, 0, 0]
    assert hub_first.z == 4
    hub_last = slot_model(np.array([1, 2, 3, 0]), src, dst)
    assert hub_last.completions.tolist() == [0, 0, 1, 3]
    assert hub_last.queue.tolist() == [0, 0, 0, 2]
    assert hub_last.z == 6


def test_slot_model_with_k_packets_per_slot() -> None:
    src, dst = star(5)
    # k = 2: slots {0, 1}, {2, 3}, {4}; the leaves complete in slot 1, the hub in 3.
    result = slot_model(np.array([0, 1, 2, 3, 4]), src, dst, k=2)
    assert result.completions.tolist() == [4, 0, 1]
    assert result.queue.tolist() == [2, 0, 0]
    assert result.z == 3
    # Two results still queued after the last arrival take ceil(2 / 3) slots.
    result = slot_model(np.array([1, 2, 3, 4, 0]), src, dst, k=3)
    assert result.completions.tolist() == [0, 5]
    assert result.queue.tolist() == [0, 2]
    assert result.z == 2 + 1


def test_slot_model_accepts_vertices_without_edges() -> None:
    src, dst = star(4)
    assert slot_model(np.array([0, 1, 2, 3, 99]), src, dst).z == 5


def test_empty_graph() -> None:
    none = np.zeros(0, dtype=np.int64)
    assert gamr_order(none, none).tolist() == []
    assert random_order(none, none, seed=0).tolist() == []
    result = slot_model(none, none, none)
    assert result.z == 0 and result.queue.size == 0 and result.completions.size == 0


def test_bad_input_is_refused() -> None:
    src, dst = star(5)
    with pytest.raises(ValueError, match=r"same length.*\(8,\) and \(7,\)"):
        gamr_order(src, dst[:-1])
    with pytest.raises(ValueError, match="same length"):
        slot_model(np.arange(5), src[:, None], dst[:, None])
    with pytest.raises(ValueError, match="2 missing"):
        slot_model(np.array([0, 1, 2]), src, dst)
    with pytest.raises(ValueError, match="repeated"):
        slot_model(np.array([0, 1, 2, 3, 4, 4]), src, dst)
    with pytest.raises(ValueError, match="k: expected an int >= 1"):
        slot_model(np.arange(5), src, dst, k=0)
    with pytest.raises(ValueError, match="non-negative"):
        gamr_order(src - 1, dst)
    with pytest.raises(ValueError, match="integer"):
        random_order(src.astype(float), dst, seed=0)
