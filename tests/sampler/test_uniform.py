"""UniformNeighborSampler: real edges, fan-outs, uniformity, determinism, labels."""

from __future__ import annotations

import itertools
import threading
from collections import Counter

import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st
from scipy.stats import chisquare

from graphwire.graph.graph import Graph, GraphError
from graphwire.graph.synthetic import ProductsConfig, products_graph
from graphwire.sampler import Block, SampledBatch, UniformNeighborSampler
from graphwire.sampler.uniform import check_seeds


def _random_graph(num_nodes: int, num_edges: int, seed: int) -> Graph:
    rng = np.random.default_rng(seed)
    # Skewed sources, so some nodes have far more neighbours than the fan-out.
    src = (rng.random(num_edges) ** 3 * num_nodes).astype(np.int64)
    dst = rng.integers(0, num_nodes, num_edges)
    return Graph.from_edge_index(src, dst, num_nodes=num_nodes).deduplicate()


def _check_block(graph: Graph, block: Block, fanout: int) -> None:
    """Every edge is a real graph edge; fan-out and distinctness hold per dst."""
    dst_row = block.dst_of_edges
    # eid names a CSR position inside the destination's own row ...
    start = graph.indptr[block.dst_nid][dst_row]
    end = graph.indptr[block.dst_nid + 1][dst_row]
    assert bool(((block.eid >= start) & (block.eid < end)).all())
    # ... whose source is the block's source row.
    assert torch.equal(graph.indices[block.eid], block.src_nid[block.indices])
    edges = set(zip(*(t.tolist() for t in graph.edge_index()), strict=True))
    sampled = zip(
        block.src_nid[block.indices].tolist(),
        block.dst_nid[dst_row].tolist(),
        strict=True,
    )
    assert all(edge in edges for edge in sampled)
    degree = graph.in_degrees()[block.dst_nid]
    expected = degree if fanout < 0 else degree.clamp(max=fanout)
    assert torch.equal(block.in_degrees(), expected)
    for d in range(block.num_dst):
        row = block.indices[block.indptr[d] : block.indptr[d + 1]]
        assert row.unique().numel() == row.numel(), "duplicate neighbour"


def _check_relabelling(batch: SampledBatch, seeds: torch.Tensor) -> None:
    assert torch.equal(batch.blocks[-1].dst_nid, seeds)
    for block in batch.blocks:
        assert torch.equal(block.src_nid[: block.num_dst], block.dst_nid)
        assert block.src_nid.unique().numel() == block.num_src
        assert bool((block.indices < block.num_src).all())
        # Every source row beyond the destinations is used by some edge.
        used = torch.zeros(block.num_src, dtype=torch.bool)
        used[block.indices] = True
        assert bool(used[block.num_dst :].all())
    for inner, outer in itertools.pairwise(batch.blocks):
        assert torch.equal(inner.dst_nid, outer.src_nid)
    assert torch.equal(batch.input_nid, batch.blocks[0].src_nid)


@given(
    num_nodes=st.integers(1, 60),
    num_edges=st.integers(0, 400),
    fanouts=st.lists(st.sampled_from([-1, 1, 2, 3, 5]), min_size=1, max_size=3),
    seed=st.integers(0, 2**31),
)
def test_blocks_are_valid_subgraphs(num_nodes, num_edges, fanouts, seed) -> None:
    graph = _random_graph(num_nodes, num_edges, seed)
    gen = torch.Generator().manual_seed(seed)
    seeds = torch.randperm(num_nodes, generator=gen)[: max(1, num_nodes // 3)]
    batch = UniformNeighborSampler(graph, fanouts).sample(seeds, seed)
    assert len(batch.blocks) == len(fanouts)
    for block, fanout in zip(batch.blocks, fanouts, strict=True):
        _check_block(graph, block, fanout)
    _check_relabelling(batch, seeds)
    assert batch.num_sampled_edges == sum(b.num_edges for b in batch.blocks)


@pytest.mark.parametrize("hashed", [False, True])
def test_subsets_are_uniform(hashed: bool) -> None:
    """Fan-out 3 of 10 neighbours: each neighbour and each 3-subset equally likely.

    12,000 destinations share the same 10 in-neighbours, so one call gives
    12,000 independent draws (fixed seed: the test is deterministic). Hashed
    draws (the distributed sampler's) must be as uniform as the generator's.
    """
    num_dst, k = 12_000, 3
    dst = torch.arange(10, 10 + num_dst).repeat_interleave(10)
    src = torch.arange(10).repeat(num_dst)
    graph = Graph.from_edge_index(src, dst, num_nodes=10 + num_dst)
    seeds = torch.arange(10, 10 + num_dst)
    sampler = UniformNeighborSampler(graph, [k], hashed=hashed)
    block = sampler.sample(seeds, 1234).blocks[0]
    neighbours = block.src_nid[block.indices].view(num_dst, k)
    per_node = torch.bincount(neighbours.view(-1), minlength=10).numpy()
    assert chisquare(per_node).pvalue > 1e-3
    subsets = Counter(tuple(sorted(row)) for row in neighbours.tolist())
    counts = [subsets.get(c, 0) for c in itertools.combinations(range(10), k)]
    assert sum(counts) == num_dst
    assert chisquare(counts).pvalue > 1e-3


def test_repeated_draws_of_one_node_are_uniform() -> None:
    graph = Graph.from_edge_index(
        torch.arange(1, 11), torch.zeros(10, dtype=torch.long)
    )
    sampler = UniformNeighborSampler(graph, [3], seed=7)
    counts = torch.zeros(11, dtype=torch.long)
    for _ in range(600):  # the sampler's own generator advances per call
        block = sampler.sample(torch.tensor([0])).blocks[0]
        counts += torch.bincount(block.src_nid[block.indices], minlength=11)
    assert int(counts[0]) == 0
    assert chisquare(counts[1:].numpy()).pvalue > 1e-3


def test_hashed_draws_of_one_node_are_uniform_across_batch_seeds() -> None:
    graph = Graph.from_edge_index(
        torch.arange(1, 11), torch.zeros(10, dtype=torch.long)
    )
    sampler = UniformNeighborSampler(graph, [3], hashed=True)
    counts = torch.zeros(11, dtype=torch.long)
    for batch_seed in range(600):
        block = sampler.sample(torch.tensor([0]), batch_seed).blocks[0]
        counts += torch.bincount(block.src_nid[block.indices], minlength=11)
    assert int(counts[0]) == 0
    assert chisquare(counts[1:].numpy()).pvalue > 1e-3


def test_hashed_subset_of_a_node_does_not_depend_on_the_other_seeds() -> None:
    graph = _random_graph(400, 6000, seed=5)
    sampler = UniformNeighborSampler(graph, [4], hashed=True)
    alone = sampler.sample(torch.tensor([17]), 5).blocks[0]
    among = sampler.sample(torch.tensor([3, 17, 250]), 5).blocks[0]
    row = among.eid[among.indptr[1] : among.indptr[2]]
    assert torch.equal(alone.eid, row)


def test_same_seed_same_batch_and_different_seed_differs() -> None:
    graph = _random_graph(500, 8000, seed=3)
    sampler = UniformNeighborSampler(graph, [4, 3])
    seeds = torch.arange(0, 500, 7)
    one, two = sampler.sample(seeds, 99), sampler.sample(seeds, 99)
    gen = torch.Generator().manual_seed(99)
    three = sampler.sample(seeds, gen)
    for a, b, c in zip(one.blocks, two.blocks, three.blocks, strict=True):
        for field in ("indptr", "indices", "src_nid", "dst_nid", "eid"):
            assert torch.equal(getattr(a, field), getattr(b, field))
            assert torch.equal(getattr(a, field), getattr(c, field))
    other = sampler.sample(seeds, 100)
    assert not torch.equal(other.blocks[-1].eid, one.blocks[-1].eid)


@pytest.mark.parametrize("hashed", [False, True])
def test_an_integral_seed_of_any_type_draws_as_the_int_does(hashed: bool) -> None:
    """A numpy integer or a 0-d tensor was not an ``int``, so the sampler
    without ``hashed`` made hashed draws from it (and took even a str)."""
    graph = _random_graph(500, 8000, seed=3)
    sampler = UniformNeighborSampler(graph, [4, 3], hashed=hashed)
    seeds = torch.arange(0, 500, 7)
    want = sampler.sample(seeds, 99)
    for seed in (np.int64(99), np.uint32(99), torch.tensor(99)):
        got = sampler.sample(seeds, seed)  # type: ignore[arg-type]
        for a, b in zip(got.blocks, want.blocks, strict=True):
            assert torch.equal(a.eid, b.eid)
    for bad in ("7", 7.0, True, torch.tensor(7.0), torch.tensor([7])):
        with pytest.raises(ValueError, match="generator: expected an integer seed"):
            sampler.sample(seeds, bad)  # type: ignore[arg-type]


def test_full_fanout_takes_every_in_edge_and_weights_follow() -> None:
    graph = _random_graph(100, 700, seed=5)
    weight = torch.rand(graph.num_edges)
    sampler = UniformNeighborSampler(graph, [-1, 1000], edge_weight=weight)
    batch = sampler.sample(torch.tensor([3, 1, 4, 15, 9]))
    for block in batch.blocks:
        assert torch.equal(block.in_degrees(), graph.in_degrees()[block.dst_nid])
        assert block.edge_weight is not None
        assert torch.equal(block.edge_weight, weight[block.eid])


def test_sampled_weights_make_unbiased_sums() -> None:
    """A weighted sum over a destination's sampled in-edges estimates its sum
    over all of them: each kept edge's weight is scaled by in-degree / kept
    (without it, fanout 3 of ~30 edges sums to a tenth of the full graph's).

    40 disjoint copies of one 40-node graph, its weights on each: one call
    draws each node's edges 40 times independently, so 50 calls give every
    node 2000 draws."""
    graph = _random_graph(40, 1200, seed=8)
    # Seeded: drawn from torch's global generator, the weights (and whether
    # the 5% held) depended on the tests run before this one.
    weight = torch.rand(graph.num_edges, generator=torch.Generator().manual_seed(8))
    full = torch.zeros(graph.num_nodes).index_add_(
        0, torch.repeat_interleave(torch.arange(40), graph.in_degrees()), weight
    )
    copies, calls = 40, 50
    src, dst = graph.edge_index()
    shift = torch.arange(copies).repeat_interleave(graph.num_edges) * 40
    copied = Graph.from_edge_index(
        src.repeat(copies) + shift, dst.repeat(copies) + shift, num_nodes=40 * copies
    )
    # Edge e of copy c is edge e of the graph: its weight is weight[e].
    assert torch.equal(copied.indices, graph.indices.repeat(copies) + shift)
    sampler = UniformNeighborSampler(copied, [3], edge_weight=weight.repeat(copies))
    seeds = torch.arange(40 * copies)
    total = torch.zeros(40, dtype=torch.float64)
    draws = copies * calls  # the mean's spread: about 1% of the sum, so 5% is 4-5
    for call in range(calls):
        block = sampler.sample(seeds, call).blocks[0]
        assert block.edge_weight is not None
        sums = torch.zeros(40 * copies).index_add_(
            0, block.dst_of_edges, block.edge_weight
        )
        total += sums.double().view(copies, 40).sum(0)
    torch.testing.assert_close(total / draws, full.double(), rtol=0.05, atol=0.0)
    # Where a destination keeps every in-edge its weights are the graph's.
    everything = UniformNeighborSampler(graph, [100], edge_weight=weight)
    block = everything.sample(torch.arange(40)).blocks[0]
    assert block.edge_weight is not None
    assert torch.equal(block.edge_weight, weight[block.eid])


def test_isolated_seeds_give_empty_rows() -> None:
    graph = Graph.from_edge_index(torch.tensor([0]), torch.tensor([1]), num_nodes=4)
    batch = UniformNeighborSampler(graph, [2, 2]).sample(torch.tensor([2, 1]))
    assert batch.blocks[-1].in_degrees().tolist() == [0, 1]
    assert batch.blocks[-1].src_nid.tolist() == [2, 1, 0]
    assert batch.blocks[0].src_nid.tolist() == [2, 1, 0]


@pytest.mark.parametrize(
    "fanouts", [[], [0], [3, -2], [0.5], [2.5, 3], [True], [3, 2.0], [4097]]
)
def test_bad_fanouts_are_rejected(fanouts) -> None:
    """A fraction was truncated (0.5 to 0, which then sampled nothing; 2.5
    to 2) and a bool taken as 0 or 1."""
    graph = _random_graph(10, 20, seed=0)
    with pytest.raises(ValueError, match=r"fanouts: (expected|at most)"):
        UniformNeighborSampler(graph, fanouts)
    assert UniformNeighborSampler(graph, [np.int64(3), -1]).fanouts == [3, -1]


def test_bad_seeds_and_weights_are_rejected() -> None:
    graph = _random_graph(10, 20, seed=0)
    with pytest.raises(ValueError, match="distinct"):
        UniformNeighborSampler(graph, [2]).sample(torch.tensor([1, 1]))
    with pytest.raises(ValueError, match=r"\[0, 10\)"):
        UniformNeighborSampler(graph, [2]).sample(torch.tensor([3, 10]))
    with pytest.raises(ValueError, match="edge_weight"):
        UniformNeighborSampler(graph, [2], edge_weight=torch.ones(3))


@pytest.mark.parametrize(
    "seeds, message",
    [
        # A mask would be read as the IDs 1 and 0; floats would be truncated.
        (torch.tensor([True, False]), r"found torch.bool; a boolean mask\? .*nonzero"),
        (torch.tensor([4.9]), "expected an integer dtype, found torch.float32"),
        (np.array([2**64 - 1], np.uint64), "holds value 18446744073709551615"),
        (torch.tensor([[1, 2]]), r"expected a 1-D index array, found \(1, 2\)"),
    ],
)
def test_seeds_that_are_not_node_ids_are_named(seeds, message) -> None:
    # check_seeds is shared with DistNeighborSampler.sample.
    with pytest.raises(GraphError, match=f"seeds: .*{message}"):
        check_seeds(seeds, 10)
    sampler = UniformNeighborSampler(_random_graph(10, 20, seed=0), [2, 2])
    with pytest.raises(GraphError, match=f"seeds: .*{message}"):
        sampler.sample(seeds, 0)
    assert check_seeds([3, 1], 10).tolist() == [3, 1]


def test_threads_sampling_at_once_get_the_blocks_one_thread_gets() -> None:
    """A loader and the trainer (or a pool) share one sampler: each stitch
    relabels on a table of its own, so concurrent batches stay intact."""
    graph = products_graph(
        ProductsConfig(nodes=8000, degree=15, features=1, classes=2, seed=5)
    )
    sampler = UniformNeighborSampler(graph, [10, 10], hashed=True)
    gen = torch.Generator().manual_seed(0)
    batches = [(torch.randperm(8000, generator=gen)[:512], i) for i in range(32)]
    want = [sampler.sample(seeds, i) for seeds, i in batches]
    got: dict[int, SampledBatch] = {}
    errors: list[BaseException] = []

    def work(first: int) -> None:
        try:
            for j in range(first, len(batches), 4):
                got[j] = sampler.sample(*batches[j])
        except BaseException as error:  # a corrupt block fails its checks
            errors.append(error)

    threads = [threading.Thread(target=work, args=(k,)) for k in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not errors, errors[0]
    for j, batch in enumerate(want):
        for ours, theirs in zip(got[j].blocks, batch.blocks, strict=True):
            assert torch.equal(ours.src_nid, theirs.src_nid)
            assert torch.equal(ours.indices, theirs.indices)
