"""Layer-wise sampling across ranks (FastGCN, LADIES): DGS's baselines.

- FastGCN's distribution is the whole graph's column norms, synced once
  (``setup.fastgcn``);
- every layer's edges are edges of the graph into the layer's sampled set,
  ``t`` distinct nodes (LADIES: all of them in-neighbours of the layer's
  destinations), and each row's weights sum to its full row's;
- LADIES asks the destinations' owners for their sums every layer
  (``layer.norms``), FastGCN never;
- the same seed gives the same blocks.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch

from graphwire.comm.base import Transport
from graphwire.comm.local import run_local
from graphwire.graph.graph import Graph
from graphwire.graph.synthetic import ProductsConfig, products_graph
from graphwire.minibatch.owned import owned_csr
from graphwire.nn.models import LAYER_KINDS
from graphwire.partition import get_partitioner, load_part, write_partitioned
from graphwire.sampler.layerwise import DistLayerSampler, column_norms

T = 40
WORLD = 3


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> str:
    graph = products_graph(
        ProductsConfig(nodes=600, degree=10, features=4, classes=3, seed=4)
    )
    partition = get_partitioner("metis").partition(graph, WORLD, seed=0)
    out = tmp_path_factory.mktemp("layerwise") / "parts"
    return str(write_partitioned(graph, partition, out))


def _sample(transport: Transport, folder: str, kind: str, model: str) -> dict[str, Any]:
    part = load_part(folder, transport.rank)
    csr = owned_csr(part, transport, LAYER_KINDS[model])
    sampler = DistLayerSampler(csr, part.book, transport, [T, T], kind)
    gen = torch.Generator().manual_seed(transport.rank)
    start, stop = part.global_range
    seeds = torch.arange(start, stop)[torch.randperm(stop - start, generator=gen)[:20]]
    batches = [
        sampler.sample(seeds, 7),
        sampler.sample(seeds, 7),
        sampler.sample(seeds, 8),
    ]
    transport.barrier()
    sampler.close()
    return {
        "csr": csr,
        "q": sampler.q,
        "batches": batches,
        "ledger": transport.ledger.snapshot(),
    }


def _messages(result: dict[str, Any], tag: str) -> int:
    return sum(row[4] for row in result["ledger"]["sent"] if row[2] == tag)


@pytest.mark.parametrize("kind,model", [("fastgcn", "gcn"), ("ladies", "sage")])
def test_layers_sample_edges_into_t_nodes_with_unbiased_rows(
    folder: str, kind: str, model: str
) -> None:
    results = run_local(lambda t: _sample(t, folder, kind, model), WORLD)
    csrs = [r["csr"] for r in results]
    whole = Graph(
        indptr=torch.cat(
            [torch.zeros(1, dtype=torch.int64)]
            + [c.indptr[1:] + c.edge_offset for c in csrs]
        ),
        indices=torch.cat([c.indices for c in csrs]),
    )
    full_weight = torch.cat(
        [
            c.weight
            if c.weight is not None
            else torch.repeat_interleave(1.0 / c.indptr.diff().float(), c.indptr.diff())
            for c in csrs
        ]
    )
    if kind == "fastgcn":
        u, sums = zip(*(column_norms(c) for c in csrs), strict=True)
        want = torch.zeros(whole.num_nodes, dtype=torch.float64)
        want.index_add_(0, torch.cat(u), torch.cat(sums))
        for result in results:
            assert torch.allclose(result["q"].double(), want, rtol=1e-5)
            assert _messages(result, "layer.norms.req") == 0
    for result in results:
        first, again, other = result["batches"]
        for a, b in zip(first.blocks, again.blocks, strict=True):
            assert torch.equal(a.src_nid, b.src_nid) and torch.equal(a.eid, b.eid)
        assert any(
            not torch.equal(a.src_nid, b.src_nid)
            for a, b in zip(first.blocks, other.blocks, strict=True)
        )
        for block in first.blocks:
            rows = torch.repeat_interleave(
                torch.arange(block.num_dst), block.indptr.diff()
            )
            dst, src = block.dst_nid[rows], block.src_nid[block.indices]
            # Edges of the graph, at their CSR positions.
            assert torch.equal(whole.indices[block.eid], src)
            assert bool(
                (
                    (block.eid >= whole.indptr[dst])
                    & (block.eid < whole.indptr[dst + 1])
                ).all()
            )
            sampled = src.unique()
            assert sampled.numel() <= T
            if kind == "ladies":  # candidates: in-neighbours of the layer
                neighbours = torch.cat(
                    [
                        whole.indices[whole.indptr[v] : whole.indptr[v + 1]]
                        for v in block.dst_nid
                    ]
                )
                assert bool(torch.isin(sampled, neighbours).all())
            kept = torch.zeros(block.num_dst, dtype=torch.float64)
            kept.index_add_(0, rows, block.edge_weight.double())
            full = torch.tensor(
                [
                    float(full_weight[whole.indptr[v] : whole.indptr[v + 1]].sum())
                    for v in block.dst_nid
                ],
                dtype=torch.float64,
            )
            has = block.indptr.diff() > 0
            assert torch.allclose(kept[has], full[has], rtol=1e-4)
        if kind == "ladies":
            assert _messages(result, "layer.norms.req") > 0
