"""Multi-level blocks: every edge once, both directions together, <= cap vertices."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from graphwire.partition import multilevel
from graphwire.partition.multilevel import (
    block_vertices,
    multilevel_blocks,
    single_block,
)


def undirected(pairs: list[tuple[int, int]]) -> tuple[np.ndarray, np.ndarray]:
    """Both directions of each pair, as int64 src, dst."""
    edges = np.asarray(pairs, dtype=np.int64).reshape(-1, 2)
    return np.r_[edges[:, 0], edges[:, 1]], np.r_[edges[:, 1], edges[:, 0]]


def check_blocks(
    src: np.ndarray, dst: np.ndarray, cap: int, blocks: list[np.ndarray]
) -> None:
    """The invariants every blocking must keep."""
    for block in blocks:
        assert block.dtype == np.int64 and block.size > 0
        assert bool((np.diff(block) > 0).all()), "edge indices not ascending"
        assert block_vertices(src, dst, block).size <= cap
    every = np.concatenate(blocks) if blocks else np.zeros(0, dtype=np.int64)
    assert np.array_equal(np.sort(every), np.arange(src.size)), "not each edge once"
    block_of = np.empty(src.size, dtype=np.int64)
    for b, block in enumerate(blocks):
        block_of[block] = b
    # Every edge u -> v shares its block with each v -> u and each repeat.
    pair = {}
    for i, (u, v) in enumerate(zip(src.tolist(), dst.tolist(), strict=True)):
        assert pair.setdefault((min(u, v), max(u, v)), block_of[i]) == block_of[i]


def random_graph(rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """Directed edges, some with their reverse, some repeated or loops; sparse IDs."""
    n = int(rng.integers(20, 301))
    m = int(rng.integers(n // 2, 4 * n))
    a, b = rng.integers(0, n, m), rng.integers(0, n, m)
    both = rng.random(m) < 0.6
    ids = rng.choice(10 * n, n, replace=False)  # not contiguous
    return ids[np.r_[a, b[both]]], ids[np.r_[b, a[both]]]


@pytest.mark.parametrize("graph_seed", range(30))
def test_random_graphs_keep_the_invariants(graph_seed: int) -> None:
    rng = np.random.default_rng(graph_seed)
    src, dst = random_graph(rng)
    cap = int(rng.integers(2, 51))
    blocks = multilevel_blocks(src, dst, cap, seed=graph_seed)
    check_blocks(src, dst, cap, blocks)
    traffic = sum(block_vertices(src, dst, block).size for block in blocks)
    assert traffic >= np.unique(np.r_[src, dst]).size


def test_a_connected_graph_that_fits_is_one_block() -> None:
    src, dst = undirected([(i, (i + 1) % 10) for i in range(10)])
    blocks = multilevel_blocks(src, dst, cap=10)
    assert len(blocks) == 1
    assert np.array_equal(blocks[0], np.arange(20))


def test_small_components_are_packed() -> None:
    src, dst = undirected([(2 * i, 2 * i + 1) for i in range(10)])
    blocks = multilevel_blocks(src, dst, cap=4)
    check_blocks(src, dst, 4, blocks)
    assert len(blocks) == 5
    assert [block_vertices(src, dst, b).size for b in blocks] == [4] * 5


def test_fig10_a_connected_13_vertex_graph_with_cap_4() -> None:
    # Three 4-cliques joined in a ring through a 13th vertex: no block can hold
    # a whole component, so METIS cuts it and the cut edges form blocks too.
    pairs = [
        (4 * c + i, 4 * c + j)
        for c in range(3)
        for i, j in itertools.combinations(range(4), 2)
    ]
    src, dst = undirected([*pairs, (3, 4), (7, 8), (11, 12), (12, 0)])
    blocks = multilevel_blocks(src, dst, cap=4)
    check_blocks(src, dst, 4, blocks)
    sizes = [block_vertices(src, dst, b).size for b in blocks]
    assert len(blocks) >= 4  # ceil(13 / 4)
    # A vertex in a part block and in a cut-edge block is counted in both.
    assert sum(sizes) > 13


def test_a_level_that_does_not_shrink_falls_back_to_greedy_runs(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    def no_progress(pairs: np.ndarray, *_: object) -> list[np.ndarray]:
        return [pairs]

    monkeypatch.setattr(multilevel, "_metis_pieces", no_progress)
    src, dst = undirected([(i, j) for i, j in itertools.combinations(range(7), 2)])
    blocks = multilevel_blocks(src, dst, cap=3)
    check_blocks(src, dst, 3, blocks)


def test_directed_only_edges() -> None:
    src = np.arange(0, 40, dtype=np.int64)
    dst = (src * 7 + 3) % 40
    blocks = multilevel_blocks(src, dst, cap=5)
    check_blocks(src, dst, 5, blocks)


def test_same_seed_same_blocks() -> None:
    src, dst = random_graph(np.random.default_rng(7))
    runs = [multilevel_blocks(src, dst, 6, seed=3) for _ in range(2)]
    assert len(runs[0]) == len(runs[1])
    assert all(np.array_equal(a, b) for a, b in zip(*runs, strict=True))


def test_bad_cap_is_refused_and_no_edges_give_no_blocks() -> None:
    src, dst = undirected([(0, 1)])
    for cap in (1, 0, -3):
        with pytest.raises(ValueError, match=f"cap: expected an int >= 2.*{cap}"):
            multilevel_blocks(src, dst, cap)
    with pytest.raises(ValueError, match="cap: expected an int"):
        multilevel_blocks(src, dst, 2.5)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="same length"):
        multilevel_blocks(src, dst[:1], 4)
    none = np.zeros(0, dtype=np.int64)
    assert multilevel_blocks(none, none, 4) == []


def test_single_block() -> None:
    (block,) = single_block(5)
    assert block.dtype == np.int64 and block.tolist() == [0, 1, 2, 3, 4]
    assert single_block(0) == []
    with pytest.raises(ValueError, match="num_edges"):
        single_block(-1)


def test_block_vertices() -> None:
    src, dst = np.array([5, 9, 5, 2]), np.array([9, 5, 7, 5])
    assert block_vertices(src, dst, np.array([0, 1, 2])).tolist() == [5, 7, 9]
