"""`ReplicateEngine` (``--exchange replicate``): L-hop halo stored and recomputed.

The DGL / ROC-style alternative G3 argues against: at set-up every rank pulls
the in-edges and input rows of its whole ``L``-hop in-neighbourhood from their
owners (tag ``setup.replicate``); afterwards an epoch needs no exchange at all
but the gradient all-reduce, at the price of computing layer ``l`` for every
node within ``L - 1 - l`` hops, not just the owned ones. ``counters`` reports
that price: ``replicated_rows`` (nodes held beyond the owned ones) and
``redundant_rows`` (rows computed per forward beyond the owned ones, over all
layers).

Local numbering puts hop 0 (owned) first, then hop 1 (the halo), hop 2, ...
(each hop sorted by global ID); layer ``l`` reads the first ``|H_{L-l}|`` rows
and writes the first ``|H_{L-1-l}|``, so every layer's MessageGraph is a prefix
of one CSR.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from graphwire.comm.base import Transport
from graphwire.fullgraph.base import Engine
from graphwire.graph.order import stable_order
from graphwire.nn.base import MessageGraph
from graphwire.partition.local import LocalPart
from graphwire.run.local_graph import with_self_loops

__all__ = ["ReplicateConfig", "ReplicateEngine"]

TAG = "setup.replicate"


@dataclass(frozen=True, kw_only=True, slots=True)
class ReplicateConfig:
    """Replication has no settings."""


class ReplicateEngine(Engine):
    """Replicated L-hop neighbourhood, no per-layer exchange."""

    config_type = ReplicateConfig
    fetches_halo_ids = False  # ``row_ids`` has every local row's original ID

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs["cache_input"] = False  # every input row is held locally anyway
        super().__init__(*args, **kwargs)
        part, transport = self.part, self.transport
        owned_csr = _owned_csr(part, self.kind.self_loops)
        out_deg = self._global_out_degrees(owned_csr)

        # Grow hop by hop: nodes (global IDs) in local order, rows fetched so far.
        start = part.global_range[0]
        nodes = torch.arange(start, start + part.num_owned)
        rows_ptr, rows_src = owned_csr  # in-edges of nodes[:len(rows_ptr) - 1]
        hop_sizes = [part.num_owned]
        for hop in range(1, self.num_layers + 1):
            frontier = _new_sources(rows_src, nodes)
            nodes = torch.cat([nodes, frontier])
            hop_sizes.append(nodes.numel())
            if hop < self.num_layers:  # the last hop's rows are never computed
                ptr, src = _pull_rows(part, transport, frontier, owned_csr)
                rows_ptr = torch.cat([rows_ptr[:-1], ptr + rows_ptr[-1]])
                rows_src = torch.cat([rows_src, src])
        self.hop_sizes = hop_sizes
        # Relabel sources to local IDs (their position in ``nodes``).
        order = torch.argsort(nodes)
        local_src = order[torch.searchsorted(nodes[order], rows_src)]
        features, orig, degree = _pull_node_data(part, transport, nodes, out_deg)
        self._x, self._row_ids = features, orig
        weight = None
        if self.kind.gcn_weights:
            in_deg = (rows_ptr[1:] - rows_ptr[:-1]).clamp(min=1).to(torch.float32)
            dst = torch.repeat_interleave(
                torch.arange(rows_ptr.numel() - 1), rows_ptr[1:] - rows_ptr[:-1]
            )
            src_deg = degree.clamp(min=1).to(torch.float32)[local_src]
            weight = (src_deg * in_deg[dst]).rsqrt()
        self._mgs = []
        for layer in range(self.num_layers):
            num_dst = hop_sizes[self.num_layers - 1 - layer]
            num_src = hop_sizes[self.num_layers - layer]
            num_edges = int(rows_ptr[num_dst])
            self._mgs.append(
                MessageGraph(
                    rows_ptr[: num_dst + 1].clone(),
                    local_src[:num_edges],
                    num_src,
                    num_dst,
                    None if weight is None else weight[:num_edges],
                )
            )
        # Layer l's sources are the first num_src local rows: their original
        # IDs key GAT's hashed attention dropout.
        self._src_ids = [orig[: mg.num_src] for mg in self._mgs]
        n = part.num_owned
        self.counters = {
            "replicated_rows": nodes.numel() - n,
            "redundant_rows": sum(mg.num_dst - n for mg in self._mgs),
        }

    def _global_out_degrees(self, owned_csr: tuple[torch.Tensor, torch.Tensor]) -> Any:
        """Global out-degree of every owned node (partial counts summed at owners)."""
        part = self.part
        n = part.num_owned
        local = part.global_to_local(owned_csr[1])
        partial = torch.bincount(local, minlength=part.num_local)
        returned = self.plan.scatter_grad(partial[n:], self.transport, TAG)
        return partial[:n] + returned

    @property
    def mgs(self) -> list[MessageGraph]:
        return self._mgs

    @property
    def x(self) -> torch.Tensor:
        return self._x

    @property
    def row_ids(self) -> torch.Tensor:
        return self._row_ids

    def run_layer(
        self, index: int, layer: nn.Module, mg: MessageGraph, h: torch.Tensor
    ) -> torch.Tensor:
        return self.call_layer(index, layer, mg, h, self._src_ids[index])


def _owned_csr(part: LocalPart, self_loops: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """In-edges of the owned nodes as ``(indptr, global source IDs)``."""
    indptr, indices = part.indptr.to(torch.int64), part.indices.to(torch.int64)
    if self_loops:
        indptr, indices = with_self_loops(indptr, indices, part.num_owned)
    return indptr, part.local_to_global(indices)


def _new_sources(sources: torch.Tensor, known: torch.Tensor) -> torch.Tensor:
    """Distinct IDs in ``sources`` that are not in ``known``, sorted."""
    candidates = torch.unique(sources)
    return candidates[~torch.isin(candidates, known)]


def _by_owner(
    part: LocalPart, gids: torch.Tensor
) -> tuple[list[torch.Tensor], torch.Tensor]:
    """``gids`` grouped by owner (per-owner lists) and the grouping order."""
    owner = part.book.owner(gids) if gids.numel() else gids
    order = stable_order(owner)
    counts = torch.bincount(owner, minlength=part.num_parts).tolist()
    return list(torch.split(gids[order], counts)), order


def _ask(
    part: LocalPart, transport: Transport, gids: torch.Tensor
) -> tuple[list[torch.Tensor], list[torch.Tensor], torch.Tensor]:
    """Send each owner the IDs asked of it; return (asked of me, asked by me, order)."""
    wanted, order = _by_owner(part, gids)
    sizes = transport.all_gather_object([int(t.numel()) for t in wanted], TAG)
    expect = [sizes[p][transport.rank] for p in range(transport.world_size)]
    asked = transport.all_to_all(wanted, expect, TAG)
    return asked, wanted, order


def _pull_rows(
    part: LocalPart,
    transport: Transport,
    gids: torch.Tensor,
    owned_csr: tuple[torch.Tensor, torch.Tensor],
) -> tuple[torch.Tensor, torch.Tensor]:
    """In-edge rows ``(indptr, global sources)`` of ``gids`` from their owners,
    in the order of ``gids``."""
    asked, wanted, order = _ask(part, transport, gids)
    indptr, sources = owned_csr
    start = part.global_range[0]
    degree = indptr[1:] - indptr[:-1]
    replies_deg, replies_src = [], []
    for ids in asked:
        local = ids - start
        counts = degree[local]
        replies_deg.append(counts)
        starts = torch.repeat_interleave(indptr[local], counts)
        offsets = torch.arange(int(counts.sum())) - torch.repeat_interleave(
            torch.cumsum(counts, 0) - counts, counts
        )
        replies_src.append(sources[starts + offsets])
    got_deg = transport.all_to_all(replies_deg, [t.numel() for t in wanted], TAG)
    got_src = transport.all_to_all(replies_src, [int(t.sum()) for t in got_deg], TAG)
    # Back from owner order to the order of ``gids``.
    deg_grouped, src_grouped = torch.cat(got_deg), torch.cat(got_src)
    ptr_grouped = torch.cumsum(deg_grouped, 0) - deg_grouped
    deg = torch.empty_like(deg_grouped)
    deg[order] = deg_grouped
    first = torch.empty_like(ptr_grouped)
    first[order] = ptr_grouped
    indptr_out = torch.zeros(gids.numel() + 1, dtype=torch.int64)
    torch.cumsum(deg, 0, out=indptr_out[1:])
    offsets = torch.arange(int(deg.sum())) - torch.repeat_interleave(
        indptr_out[:-1], deg
    )
    return indptr_out, src_grouped[torch.repeat_interleave(first, deg) + offsets]


def _pull_node_data(
    part: LocalPart, transport: Transport, gids: torch.Tensor, out_deg: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Features, original IDs and global out-degrees of ``gids`` (owned ones
    read locally), in the order of ``gids``."""
    assert part.x is not None
    asked, wanted, order = _ask(part, transport, gids)
    start = part.global_range[0]
    rows = [t.numel() for t in wanted]
    orig_nid = part.orig_nid.to(torch.int64)
    x = transport.all_to_all([part.x[ids - start] for ids in asked], rows, TAG)
    orig = transport.all_to_all([orig_nid[ids - start] for ids in asked], rows, TAG)
    deg = transport.all_to_all([out_deg[ids - start] for ids in asked], rows, TAG)

    def unsort(parts: list[torch.Tensor]) -> torch.Tensor:
        grouped = torch.cat(parts)
        out = torch.empty_like(grouped)
        out[order] = grouped
        return out

    return unsort(x), unsort(orig), unsort(deg)
