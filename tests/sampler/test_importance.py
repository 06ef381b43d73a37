"""DGS's sampler: locality and importance, and what it keeps of uniform sampling.

- every sampled edge is an edge of the graph, each row keeps min(fan-out,
  degree) of its neighbours, and local neighbours are never dropped for
  remote ones beyond the ε shift (random graphs, random masks);
- with equal weights and ε = 0 the kept subsets are uniform subsets, as the
  uniform sampler draws them (chi-square);
- the local count is the hypergeometric share shifted by ε (chi-square), and
  remote picks follow the mask;
- a node weighs its mask plus the floor (uncovered: the mask's mean), by
  table or by search;
- the owner-compute sampler with published biases samples exactly the
  single-process sampler's blocks.
"""

from __future__ import annotations

import itertools
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from scipy import stats

from graphwire.comm.base import Transport
from graphwire.comm.local import run_local
from graphwire.graph.graph import Graph
from graphwire.graph.synthetic import ProductsConfig, products_graph
from graphwire.minibatch.owned import owned_csr
from graphwire.nn.models import LAYER_KINDS
from graphwire.partition import get_partitioner, load_part, write_partitioned
from graphwire.sampler.dist import DistNeighborSampler
from graphwire.sampler.importance import (
    ImportanceNeighborSampler,
    NodeBias,
    biased_rows,
)
from graphwire.sampler.uniform import UniformNeighborSampler
from tests.sampler.probes import BLOCK_FIELDS, owned_graph

P_MIN = 1e-3  # seeded draws: a fixed p-value, far from this bound when right


def _bias(local: tuple[int, int], nid: list[int], weight: list[float], eps: float):
    return NodeBias(
        local,
        torch.tensor(nid, dtype=torch.int64),
        torch.tensor(weight, dtype=torch.float32),
        eps,
    )


DRAWS = 6000  # rows sampled at once: each its own hashed draws


def _star(num_local: int, num_remote: int) -> tuple[Graph, tuple[int, int]]:
    """:data:`DRAWS` destinations, each with the same in-neighbours: the
    local nodes ``D .. D+L-1`` and the remote ones after them; and the local
    range."""
    d, n = DRAWS, num_local + num_remote
    indptr = torch.full((d + n + 1,), d * n, dtype=torch.int64)
    indptr[: d + 1] = torch.arange(0, (d + 1) * n, n, dtype=torch.int64)
    indices = torch.arange(d, d + n, dtype=torch.int64).repeat(d)
    return Graph(indptr=indptr, indices=indices), (d, d + num_local)


def _picks(graph: Graph, fanout: int, bias: NodeBias | None) -> list[tuple]:
    """Each destination's kept in-neighbours, sorted (uniform: no bias)."""
    rows = torch.arange(DRAWS)
    if bias is None:
        block = (
            UniformNeighborSampler(graph, [fanout], hashed=True)
            .sample(rows, 1)
            .blocks[0]
        )
        pos = block.eid
        indptr = block.indptr
    else:
        indptr, pos = biased_rows(
            graph.indptr, graph.indices, rows, rows, fanout, 1, bias
        )
    kept = graph.indices[pos] - DRAWS
    return [
        tuple(sorted(kept[a:b].tolist()))
        for a, b in zip(indptr[:-1], indptr[1:], strict=True)
    ]


def test_equal_weights_without_shift_draw_uniform_subsets() -> None:
    graph, local = _star(3, 3)
    bias = _bias(local, list(range(DRAWS + 3, DRAWS + 6)), [1.0] * 3, 0.0)
    subsets = list(itertools.combinations(range(6), 3))
    for name, picks in (
        ("dgs", _picks(graph, 3, bias)),
        ("uniform", _picks(graph, 3, None)),
    ):
        counts = [picks.count(s) for s in subsets]
        assert sum(counts) == DRAWS, name
        assert stats.chisquare(counts).pvalue > P_MIN, (name, counts)


def test_the_local_count_is_the_uniform_share_shifted_by_epsilon() -> None:
    num_local, num_remote, fanout, eps = 4, 8, 5, 0.2
    graph, local = _star(num_local, num_remote)
    remote = list(range(local[1], local[1] + num_remote))
    bias = _bias(local, remote, [1.0] * num_remote, eps)
    picks = _picks(graph, fanout, bias)
    counts = [sum(1 for u in p if u < num_local) for p in picks]
    shift = round(eps * fanout)
    h = stats.hypergeom(num_local + num_remote, num_local, fanout)
    expected = np.zeros(fanout + 1)
    for share in range(fanout + 1):
        expected[min(num_local, share + shift)] += h.pmf(share)
    observed = np.bincount(counts, minlength=fanout + 1)
    kept = expected > 0
    assert observed[~kept].sum() == 0
    assert stats.chisquare(observed[kept], expected[kept] * DRAWS).pvalue > P_MIN


def test_remote_picks_follow_the_mask() -> None:
    graph, _ = _star(0, 6)
    weight = [0.0, 0.1, 0.2, 0.4, 0.8, 1.0]
    bias = _bias((0, 0), list(range(DRAWS, DRAWS + 6)), weight, 0.0)
    picks = _picks(graph, 1, bias)
    counts = [picks.count((u,)) for u in range(6)]
    w = np.array(weight) + 0.01  # the floor
    assert stats.chisquare(counts, w / w.sum() * DRAWS).pvalue > P_MIN


@pytest.mark.parametrize("eps", [0.0, 0.1, 0.5])
def test_random_graphs_keep_edges_fanouts_and_local_neighbours(eps: float) -> None:
    gen = torch.Generator().manual_seed(int(eps * 10))
    for trial in range(5):
        n = 300
        src = torch.randint(0, n, (3000,), generator=gen)
        dst = torch.randint(0, n, (3000,), generator=gen)
        graph = Graph.from_edge_index(src, dst, n)
        start, stop = sorted(torch.randint(0, n, (2,), generator=gen).tolist())
        remote = torch.cat([torch.arange(0, start), torch.arange(stop, n)])
        covered = remote[torch.rand(remote.numel(), generator=gen) < 0.7]
        weight = torch.rand(covered.numel(), generator=gen)
        bias = NodeBias((start, stop), covered, weight, eps)
        rows = torch.randperm(n, generator=gen)[:120]
        fanout = int(torch.randint(1, 12, (1,), generator=gen))
        indptr, pos = biased_rows(
            graph.indptr, graph.indices, rows, rows, fanout, trial, bias
        )
        deg = graph.indptr[rows + 1] - graph.indptr[rows]
        assert torch.equal(indptr.diff(), deg.clamp(max=fanout))
        for i, row in enumerate(rows.tolist()):
            kept = pos[indptr[i] : indptr[i + 1]]
            lo, hi = int(graph.indptr[row]), int(graph.indptr[row + 1])
            # Edges of the row, each at most once.
            assert bool(((kept >= lo) & (kept < hi)).all())
            assert kept.unique().numel() == kept.numel()
            u = graph.indices[lo:hi]
            n_loc = int(((u >= start) & (u < stop)).sum())
            k = min(fanout, hi - lo)
            got_loc = int(bias.is_local(graph.indices[kept]).sum())
            # At least the shift's locals, and no more remote picks than a
            # uniform subset could hold less the shift.
            shift = round(eps * fanout) if hi - lo > fanout else 0
            assert got_loc >= min(n_loc, shift)
            assert k - got_loc <= max(0, k - n_loc, min(hi - lo - n_loc, k) - shift)


@pytest.mark.parametrize("span", [3_000, 10**9], ids=["dense-table", "search"])
def test_a_node_weighs_its_mask_plus_the_floor_or_the_masks_mean(span: int) -> None:
    gen = torch.Generator().manual_seed(5)
    nid = torch.randint(0, span, (1000,), generator=gen).unique()
    weight = torch.rand(nid.numel(), generator=gen)
    bias = NodeBias((0, 1), nid, weight, 0.1)
    assert (bias._table is not None) == (span == 3_000)
    covered = dict(zip(nid.tolist(), weight.double().tolist(), strict=True))
    mean = float(weight.mean())
    ask = torch.cat([nid, torch.randint(0, span + 10, (2000,), generator=gen)])
    want = [covered.get(v, mean) + 0.01 for v in ask.tolist()]
    assert bias.weigh(ask).tolist() == pytest.approx(want, rel=0, abs=1e-12)


def test_bad_biases_are_refused() -> None:
    with pytest.raises(ValueError, match="epsilon: expected a value in \\[0, 1\\)"):
        _bias((0, 1), [2], [1.0], 1.0)
    with pytest.raises(ValueError, match="nid and weight"):
        NodeBias((0, 1), torch.tensor([2, 3]), torch.ones(1), 0.1)


# ------------------------------------------------------------- distributed
FANOUTS = [3, 5]


@pytest.fixture(scope="module")
def graph() -> Graph:
    return products_graph(
        ProductsConfig(nodes=400, degree=12, features=4, classes=3, seed=5)
    )


def _biases(book: Any, world: int) -> list[NodeBias]:
    gen = torch.Generator().manual_seed(9)
    out = []
    for rank in range(world):
        start, stop = book.part_range(rank)
        remote = torch.cat([torch.arange(0, start), torch.arange(stop, book.num_nodes)])
        nid = remote[torch.rand(remote.numel(), generator=gen) < 0.5]
        out.append(
            NodeBias((start, stop), nid, torch.rand(nid.numel(), generator=gen), 0.1)
        )
    return out


def _sample_biased(
    transport: Transport, folder: str, model: str, batches: list
) -> list[tuple[int, list[dict[str, Any]]]]:
    part = load_part(folder, transport.rank)
    csr = owned_csr(part, transport, LAYER_KINDS[model])
    sampler = DistNeighborSampler(
        csr, part.book, transport, FANOUTS, service="dgs", biased=True
    )
    bias = _biases(part.book, transport.world_size)[transport.rank]
    # Bias 6 first: bias 7 sends its weights only (its IDs are 6's).
    flat = NodeBias(bias.local, bias.nid, torch.full_like(bias.weight, 0.5), 0.3)
    sampler.publish(6, flat)
    sampler.publish(7, bias)
    transport.barrier()
    m = bias.nid.numel()
    # Per message: 32-byte header, 3 tensors' preamble, header, IDs, weights.
    want = 2 * (32 + 8 * 19 + 40 + 4 * m) + 8 * m
    for peer in range(transport.world_size):
        sent = [
            r[3]
            for r in transport.ledger.snapshot()["sent"]
            if r[1] == peer and r[2] == "dgs.bias.req"
        ]
        assert sum(sent) == (0 if peer == transport.rank else want)
    out = []
    for i, (seeds, batch_seed) in enumerate(batches):
        if i % transport.world_size == transport.rank:
            blocks = sampler.sample(torch.tensor(seeds), batch_seed, bias=7).blocks
            out.append((i, [{f: getattr(b, f) for f in BLOCK_FIELDS} for b in blocks]))
    with pytest.raises(ValueError, match="bias 8, which it has not published"):
        sampler.sample(torch.tensor(batches[0][0]), 1, bias=8)
    transport.barrier()
    sampler.close()
    return out


@pytest.mark.parametrize("world,model", [(2, "gcn"), (3, "sage")])
def test_owner_compute_sampling_with_biases_equals_one_process(
    graph: Graph, tmp_path: Path, world: int, model: str
) -> None:
    partition = get_partitioner("metis").partition(graph, world, seed=0)
    folder = str(write_partitioned(graph, partition, tmp_path / "parts"))
    gen = torch.Generator().manual_seed(3)
    batches = [
        (torch.randperm(graph.num_nodes, generator=gen)[:30].tolist(), 100 + i)
        for i in range(2 * world)
    ]
    results = run_local(lambda t: _sample_biased(t, folder, model, batches), world)
    owned = run_local(lambda t: owned_graph(t, folder, model), world)
    whole = Graph(
        indptr=torch.cat(
            [torch.zeros(1, dtype=torch.int64)]
            + [p["indptr"][1:] + p["edge_offset"] for p in owned]
        ),
        indices=torch.cat([p["indices"] for p in owned]),
    )
    weight = (
        None if owned[0]["weight"] is None else torch.cat([p["weight"] for p in owned])
    )
    oracle = ImportanceNeighborSampler(whole, FANOUTS, edge_weight=weight)
    biases = _biases(load_part(folder, 0).book, world)
    seen = 0
    for rank, result in enumerate(results):
        for index, blocks in result:
            seeds, batch_seed = batches[index]
            want = oracle.sample(torch.tensor(seeds), batch_seed, biases[rank])
            for got, block in zip(blocks, want.blocks, strict=True):
                for field in BLOCK_FIELDS:
                    expected = getattr(block, field)
                    if expected is None:
                        assert got[field] is None
                    else:
                        assert torch.equal(got[field], expected), field
            seen += 1
    assert seen == len(batches)
