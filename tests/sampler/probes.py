"""Worker functions for the distributed sampler tests (in-process and gloo)."""

from __future__ import annotations

from typing import Any

import torch

from graphwire.comm.base import Transport
from graphwire.minibatch.owned import owned_csr
from graphwire.nn.models import LAYER_KINDS
from graphwire.partition.format import load_part
from graphwire.sampler.dist import DistNeighborSampler

BLOCK_FIELDS = ("src_nid", "dst_nid", "indptr", "indices", "eid", "edge_weight")


def owned_graph(transport: Transport, folder: str, model: str) -> dict[str, Any]:
    """This rank's :class:`OwnedCSR` as plain tensors (for the oracle graph)."""
    part = load_part(folder, transport.rank)
    csr = owned_csr(part, transport, LAYER_KINDS[model])
    return {
        "indptr": csr.indptr,
        "indices": csr.indices,
        "weight": csr.weight,
        "edge_offset": csr.edge_offset,
    }


def sample_batches(
    transport: Transport,
    folder: str,
    model: str,
    fanouts: list[int],
    batches: list[tuple[list[int], int]],
) -> dict[str, Any]:
    """Sample ``(seeds, batch_seed)`` batches (each rank its share: batch
    ``i`` on rank ``i % world``); every rank serves the others meanwhile."""
    part = load_part(folder, transport.rank)
    csr = owned_csr(part, transport, LAYER_KINDS[model])
    sampler = DistNeighborSampler(csr, part.book, transport, fanouts)
    out = []
    for i, (seeds, batch_seed) in enumerate(batches):
        if i % transport.world_size != transport.rank:
            continue
        batch = sampler.sample(torch.tensor(seeds), batch_seed)
        out.append(
            (i, [{f: getattr(b, f) for f in BLOCK_FIELDS} for b in batch.blocks])
        )
    counters = dict(sampler.counters)
    sampler.close()
    return {"batches": out, "counters": counters, "ledger": transport.ledger.snapshot()}
