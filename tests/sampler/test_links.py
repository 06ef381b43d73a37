"""Link prediction's samplers (:mod:`graphwire.sampler.links`,
:mod:`graphwire.sampler.dist_pairs`).

- a positive is an in-neighbour other than the node, -1 only where there is
  none; a negative is neither the node nor an in-neighbour; both depend on
  ``(seed, node)`` alone;
- drawn by the owners (2 and 3 ranks), they equal one process's draws on
  the graph the parts make up, bit for bit, and travel as ``pair.*``;
- :class:`HopSampler` samples the hashed uniform sampler's blocks;
- the merged batch's forward equals each branch's, rows side by side.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from graphwire.comm.base import Transport
from graphwire.comm.local import run_local
from graphwire.graph.graph import Graph
from graphwire.graph.synthetic import ProductsConfig, products_graph
from graphwire.minibatch.owned import owned_csr
from graphwire.nn.models import LAYER_KINDS, build_model
from graphwire.partition import get_partitioner, load_part, write_partitioned
from graphwire.sampler.dist import OwnedCSR
from graphwire.sampler.dist_pairs import DistPairSampler
from graphwire.sampler.links import (
    HopSampler,
    SamplingFunctions,
    link_seed_nodes,
    merge_branches,
    negative_draws,
    positive_draws,
)
from graphwire.sampler.uniform import UniformNeighborSampler


@pytest.fixture(scope="module")
def graph() -> Graph:
    return products_graph(
        ProductsConfig(nodes=400, degree=6, features=5, classes=3, seed=4)
    )


def _whole(graph: Graph, model: str = "gat") -> OwnedCSR:
    prepared, weight = LAYER_KINDS[model].prepare(graph)
    return OwnedCSR(0, prepared.indptr, prepared.indices, weight, 0)


def test_positives_are_other_neighbours_and_negatives_are_not(graph: Graph) -> None:
    csr = _whole(graph)  # with self-loops (GAT): never drawn as a positive
    nid = torch.arange(graph.num_nodes)
    pos = positive_draws(csr, nid, seed=11)
    neg = negative_draws(csr, nid, 6, seed=12, num_nodes=graph.num_nodes)
    for v in range(graph.num_nodes):
        row = set(csr.indices[csr.indptr[v] : csr.indptr[v + 1]].tolist()) - {v}
        assert (int(pos[v]) in row) if row else int(pos[v]) == -1
        assert not set(neg[v].tolist()) & (row | {v})
    assert torch.equal(link_seed_nodes(csr), (pos >= 0).nonzero().view(-1))
    # a node's draws depend on (seed, node) only: any subset, any order
    some = torch.tensor([399, 5, 17, 3])
    assert torch.equal(positive_draws(csr, some, seed=11), pos[some])
    assert torch.equal(negative_draws(csr, some, 6, 12, graph.num_nodes), neg[some])
    assert not torch.equal(positive_draws(csr, nid, seed=13), pos)


def test_hop_sampler_samples_the_hashed_uniform_samplers_blocks(graph: Graph) -> None:
    prepared, weight = LAYER_KINDS["gcn"].prepare(graph)
    oracle = UniformNeighborSampler(prepared, [3, 4], edge_weight=weight, hashed=True)
    ours = HopSampler(_whole(graph, "gcn"), [3, 4])
    seeds = torch.tensor([7, 1, 300, 42])
    for got, want in zip(
        ours.sample(seeds, 99).blocks, oracle.sample(seeds, 99).blocks, strict=True
    ):
        for field in ("src_nid", "indptr", "indices", "eid", "edge_weight"):
            assert torch.equal(getattr(got, field), getattr(want, field)), field


@pytest.mark.parametrize("model", ["sage", "gat", "gcn"])
def test_a_merged_batch_computes_each_branch_as_alone(graph: Graph, model: str) -> None:
    sampler = HopSampler(_whole(graph, model), [3, 5])
    roots = [torch.tensor([4, 9, 100]), torch.tensor([9, 250]), torch.tensor([3])]
    branches = [sampler.sample(r, 5) for r in roots]
    merged, at = merge_branches(branches)
    assert torch.equal(merged.seeds, torch.cat(roots))
    for lower, upper in zip(merged.blocks, merged.blocks[1:], strict=False):
        assert torch.equal(lower.dst_nid, upper.src_nid)  # a stack, as any
        assert torch.equal(lower.src_nid[: lower.num_dst], lower.dst_nid)
    for branch, where in zip(branches, at, strict=True):
        assert torch.equal(merged.input_nid[where], branch.input_nid)
    torch.manual_seed(0)
    net = build_model(model, 5, 8, 3, num_layers=2, dropout=0.0)
    net.eval()
    x = graph.x
    assert x is not None
    alone = torch.cat([net(b.blocks, x[b.input_nid]) for b in branches])
    together = net(merged.blocks, x[merged.input_nid])
    torch.testing.assert_close(together, alone, rtol=1e-5, atol=1e-6)  # sum order


def _draw(transport: Transport, folder: str, nid: list[int]) -> dict[str, Any]:
    part = load_part(folder, transport.rank)
    csr = owned_csr(part, transport, LAYER_KINDS["sage"])
    pairs = DistPairSampler(csr, part.book, transport, SamplingFunctions(k=4))
    ids = torch.tensor(nid)
    out = {"pos": pairs.positives(ids, 21), "neg": pairs.negatives(ids, 22)}
    # one owner's share at a time, as the task graphs draw them
    pos = torch.empty_like(out["pos"])
    for peer, where in pairs.owners(ids):
        pos[where] = pairs.positive_group(ids, where, peer, 21)
    out["by_owner"] = pos
    out["remote"] = int((part.book.owner(ids) != transport.rank).sum())
    out["counters"] = pairs.counters
    transport.barrier()
    pairs.close()
    out["tags"] = {row[2] for row in transport.ledger.snapshot()["sent"]}
    return out


@pytest.mark.parametrize("world", [2, 3])
def test_owners_draw_what_one_process_draws(
    graph: Graph, tmp_path: Path, world: int
) -> None:
    partition = get_partitioner("metis").partition(graph, world, seed=0)
    folder = str(write_partitioned(graph, partition, tmp_path / "p"))
    nid = list(range(0, graph.num_nodes, 3))
    results = run_local(lambda t: _draw(t, folder, nid), world)
    owned = [load_part(folder, r) for r in range(world)]
    new_graph = Graph(
        indptr=torch.cat(
            [torch.zeros(1, dtype=torch.int64)] + _offsets([p.indptr for p in owned])
        ),
        indices=torch.cat([p.local_to_global_table[p.indices] for p in owned]),
    )
    whole = _whole(new_graph, "sage")
    ids = torch.tensor(nid)
    for result in results:
        assert torch.equal(result["pos"], positive_draws(whole, ids, 21))
        assert torch.equal(result["by_owner"], result["pos"])
        want = negative_draws(whole, ids, 4, 22, graph.num_nodes)
        assert torch.equal(result["neg"], want)
        assert {"pair.pos", "pair.neg"} <= result["tags"]
        # the positives twice (all at once, then by owner), the negatives once
        assert result["counters"]["pos"]["remote_rows"] == 2 * result["remote"]
        assert result["counters"]["neg"]["remote_rows"] == result["remote"]
        assert result["counters"]["neg"]["requests"] == world - 1


def _offsets(indptrs: list[torch.Tensor]) -> list[torch.Tensor]:
    out, base = [], 0
    for indptr in indptrs:
        out.append(indptr[1:] + base)
        base += int(indptr[-1])
    return out
