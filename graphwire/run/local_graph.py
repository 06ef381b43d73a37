"""`local_message_graph`: a part's in-edges as a layer kind aggregates over them.

Both loops read it: the full-graph engines aggregate over it, and the
distributed sampler samples its edges (with sources in global IDs).
"""

from __future__ import annotations

import torch

from graphwire.comm.base import Transport
from graphwire.comm.plan import ExchangePlan
from graphwire.nn.base import MessageGraph
from graphwire.nn.models import LayerKind
from graphwire.partition.local import LocalPart

__all__ = ["global_out_degrees", "local_message_graph", "with_self_loops"]


def local_message_graph(
    part: LocalPart, plan: ExchangePlan, transport: Transport, kind: LayerKind
) -> MessageGraph:
    """The part's in-edges as ``kind`` expects them, over local IDs.

    Destinations are the owned nodes, sources owned then halo nodes. With
    ``kind.self_loops`` existing self-loops are replaced by one per owned node
    (as :meth:`Graph.add_self_loops`); with ``kind.gcn_weights`` the weights
    are ``1 / sqrt(out_deg(src) * in_deg(dst))`` over the *global* degrees of
    that graph: out-degrees are partial on each part, so the halo parts are
    summed at their owners and sent back (tag ``setup.degree``).
    """
    n = part.num_owned
    indptr, indices = part.indptr.to(torch.int64), part.indices.to(torch.int64)
    if kind.self_loops:
        indptr, indices = with_self_loops(indptr, indices, n)
    weight = None
    if kind.gcn_weights:
        out_deg = global_out_degrees(part, plan, transport, indices)
        out_deg = out_deg.clamp(min=1).to(torch.float32)
        in_deg = (indptr[1:] - indptr[:-1]).clamp(min=1).to(torch.float32)
        dst = torch.repeat_interleave(torch.arange(n), indptr[1:] - indptr[:-1])
        weight = (out_deg[indices] * in_deg[dst]).rsqrt()
    return MessageGraph(indptr, indices, part.num_local, n, weight)


def global_out_degrees(
    part: LocalPart, plan: ExchangePlan, transport: Transport, indices: torch.Tensor
) -> torch.Tensor:
    """int64 [num_local]: every local row's out-degree in the whole graph.

    ``indices`` are the source rows of the part's in-edges (owned then halo
    rows); each part sees only its share of a row's out-edges, so the halo
    shares are summed at their owners and the totals sent back (collective,
    tag ``setup.degree``)."""
    n = part.num_owned
    partial = torch.bincount(indices, minlength=part.num_local)
    owned = partial[:n] + plan.scatter_grad(partial[n:], transport, "setup.degree")
    halo = plan.gather_halo(owned, transport, "setup.degree")
    return torch.cat([owned, halo])


def with_self_loops(
    indptr: torch.Tensor, indices: torch.Tensor, n: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """CSR with each row's self-loops removed and one appended per row."""
    counts = indptr[1:] - indptr[:-1]
    dst = torch.repeat_interleave(torch.arange(n), counts)
    keep = indices != dst
    kept = torch.bincount(dst[keep], minlength=n) + 1
    new_indptr = torch.zeros(n + 1, dtype=torch.int64)
    torch.cumsum(kept, 0, out=new_indptr[1:])
    new_indices = torch.empty(int(new_indptr[-1]), dtype=torch.int64)
    loop_pos = new_indptr[1:] - 1
    is_loop = torch.zeros(new_indices.numel(), dtype=torch.bool)
    is_loop[loop_pos] = True
    new_indices[is_loop] = torch.arange(n)
    new_indices[~is_loop] = indices[keep]
    return new_indptr, new_indices
