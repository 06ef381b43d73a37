"""DistNeighborSampler: owner-compute sampling equals single-process sampling.

The oracle is the hashed single-process sampler on the graph the parts make
up (their :class:`OwnedCSR` s concatenated): the distributed blocks must equal
its blocks bit for bit, for seeds owned anywhere, with 2-4 ranks, in-process
and in gloo processes. Every sampled edge is also checked against the
original graph (through the relabelling).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from graphwire.comm.base import Transport
from graphwire.comm.local import run_local
from graphwire.graph.graph import Graph
from graphwire.graph.synthetic import ProductsConfig, products_graph
from graphwire.minibatch.owned import owned_csr
from graphwire.nn.models import LAYER_KINDS
from graphwire.partition import get_partitioner, load_part, write_partitioned
from graphwire.sampler.dist import DistNeighborSampler
from graphwire.sampler.uniform import UniformNeighborSampler
from graphwire.testing import run_workers
from tests.sampler.probes import (
    BLOCK_FIELDS,
    owned_graph,
    sample_batches,
)

FANOUTS = [3, 5]


@pytest.fixture(scope="module")
def graph() -> Graph:
    return products_graph(
        ProductsConfig(nodes=500, degree=9, features=4, classes=3, seed=2)
    )


def _parts(graph: Graph, tmp: Path, method: str, parts: int) -> str:
    partition = get_partitioner(method).partition(graph, parts, seed=0)
    return str(write_partitioned(graph, partition, tmp / f"{method}{parts}"))


def _oracle(folder: str, world: int, model: str) -> UniformNeighborSampler:
    owned = run_local(lambda t: owned_graph(t, folder, model), world)
    indptr = [torch.zeros(1, dtype=torch.int64)]
    for rank, part in enumerate(owned):
        assert part["edge_offset"] == int(indptr[-1][-1])
        indptr.append(part["indptr"][1:] + part["edge_offset"])
        del rank
    whole = Graph(
        indptr=torch.cat(indptr),
        indices=torch.cat([p["indices"] for p in owned]),
    )
    weight = None
    if owned[0]["weight"] is not None:
        weight = torch.cat([p["weight"] for p in owned])
    return UniformNeighborSampler(whole, FANOUTS, edge_weight=weight, hashed=True)


def _batches(num_nodes: int, count: int = 6) -> list[tuple[list[int], int]]:
    """``count`` batches of 40 seeds, then one without seeds (GCN's blocks
    had no edge weight where the oracle's is empty)."""
    gen = torch.Generator().manual_seed(3)
    return [
        (torch.randperm(num_nodes, generator=gen)[:40].tolist(), 1000 + i)
        for i in range(count)
    ] + [([], 999)]


def _check_equal(
    results: list[dict[str, Any]], oracle: UniformNeighborSampler, batches: list
) -> None:
    seen = 0
    for result in results:
        for index, blocks in result["batches"]:
            seeds, batch_seed = batches[index]
            want = oracle.sample(torch.tensor(seeds), batch_seed)
            for got, block in zip(blocks, want.blocks, strict=True):
                for field in BLOCK_FIELDS:
                    expected = getattr(block, field)
                    if expected is None:
                        assert got[field] is None, field
                    else:
                        assert got[field] is not None, field
                        assert torch.equal(got[field], expected), field
            seen += 1
    assert seen == len(batches)


CASES = [
    ("local", 2, "metis", "sage"),
    ("local", 3, "random", "gcn"),
    ("local", 4, "metis", "gat"),
    ("torch", 2, "metis", "gcn"),
    ("torch", 3, "random", "sage"),
]


@pytest.mark.parametrize("kind,world,method,model", CASES)
def test_distributed_blocks_equal_single_process(
    graph: Graph, tmp_path: Path, kind: str, world: int, method: str, model: str
) -> None:
    folder = _parts(graph, tmp_path, method, world)
    batches = _batches(graph.num_nodes)
    if kind == "local":
        results = run_local(
            lambda t: sample_batches(t, folder, model, FANOUTS, batches), world
        )
    else:
        results = run_workers(
            sample_batches, world, folder, model, FANOUTS, batches, timeout_s=90
        )
    _check_equal(results, _oracle(folder, world, model), batches)
    # Remote frontiers went to their owners, one request per owner per hop.
    total = {
        k: sum(r["counters"][k] for r in results) for k in ("remote_rows", "requests")
    }
    assert total["remote_rows"] > 0
    assert total["requests"] <= len(batches) * len(FANOUTS) * (world - 1)
    for rank, result in enumerate(results):
        sent = [row for row in result["ledger"]["sent"] if row[2] == "sample.hop.req"]
        assert sum(row[4] for row in sent) == result["counters"]["requests"], rank


def test_sampled_edges_are_edges_of_the_original_graph(
    graph: Graph, tmp_path: Path
) -> None:
    folder = _parts(graph, tmp_path, "metis", 3)
    batches = _batches(graph.num_nodes, 3)
    results = run_local(lambda t: sample_batches(t, folder, "gat", FANOUTS, batches), 3)
    book = load_part(folder, 0).book
    offsets = book.offsets
    orig = torch.cat([load_part(folder, p).orig_nid for p in range(3)])
    assert orig.numel() == int(offsets[-1])
    looped, _ = LAYER_KINDS["gat"].prepare(graph)
    src, dst = looped.edge_index()
    edges = set(zip(src.tolist(), dst.tolist(), strict=True))
    for result in results:
        for _, blocks in result["batches"]:
            for b in blocks:
                rows = torch.repeat_interleave(
                    torch.arange(b["indptr"].numel() - 1), b["indptr"].diff()
                )
                pairs = zip(
                    orig[b["src_nid"][b["indices"]]].tolist(),
                    orig[b["dst_nid"][rows]].tolist(),
                    strict=True,
                )
                assert all(pair in edges for pair in pairs)


def test_fanouts_that_are_not_integers_are_refused(
    graph: Graph, tmp_path: Path
) -> None:
    """0.5 was truncated to 0 (nothing sampled), True taken as 1."""
    folder = _parts(graph, tmp_path, "metis", 2)

    def work(transport: Transport) -> None:
        part = load_part(folder, transport.rank)
        csr = owned_csr(part, transport, LAYER_KINDS["sage"])
        for bad in ([0.5], [3, 2.5], [True, 3]):
            with pytest.raises(ValueError, match="fanouts: expected positive ints"):
                DistNeighborSampler(csr, part.book, transport, bad)  # type: ignore[arg-type]

    run_local(work, 2)


def test_a_batch_seed_that_is_not_an_integer_is_refused(
    graph: Graph, tmp_path: Path
) -> None:
    """``int()`` of the seed took 7.5 as 7 and the str "7" as 7."""
    folder = _parts(graph, tmp_path, "metis", 2)

    def work(transport: Transport) -> int:
        part = load_part(folder, transport.rank)
        csr = owned_csr(part, transport, LAYER_KINDS["sage"])
        sampler = DistNeighborSampler(csr, part.book, transport, FANOUTS)
        try:
            for bad in (7.5, "7", True):
                with pytest.raises(ValueError, match="batch_seed: expected an int"):
                    sampler.sample(torch.tensor([0, 1]), bad)  # type: ignore[arg-type]
            return sampler.sample(torch.tensor([0, 1]), np.int64(7)).input_nid.numel()
        finally:
            sampler.close()

    assert min(run_local(work, 2)) > 2
