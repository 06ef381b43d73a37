"""G3's bins: the node order and the bins every layer computes in.

Built once per rank at set-up (G3 §5.3) for
:class:`~graphwire.fullgraph.g3.engine.G3Engine`:

1. **Order.** ``bfs`` (the paper's Step 1): a breadth-first traversal of the
   part's own sub-graph, one connected component after another (each from its
   lowest local ID), then the rows with remote in-neighbours moved to the
   front, keeping BFS order inside both groups. ``priority`` (§5.2's "more
   remote neighbours first"): rows needed by more peers first, then rows with
   more remote in-neighbours, then by ID.
2. **Bins per layer** (Step 2-3). Rows without halo inputs and rows with them
   form two groups, each cut in order into bins whose estimated memory stays
   within a budget::

       bytes(bin) = 4 * (num_src * (in_width + out_width) + rows * out_width)

   where ``num_src`` is the bin's distinct source rows (its own rows and their
   in-neighbours, as its MessageGraph holds them): the gathered inputs and
   their transform, then the output. A layer with wider rows gets smaller
   bins. ``max_rows`` additionally caps the rows of a bin (G3's "initial bin
   size"); a single row over the budget gets a bin of its own. For the rows
   with halo inputs (on an undirected graph, the rows peers need) the cap
   starts at ``max_rows / RAMP`` and doubles bin by bin up to ``max_rows``:
   a layer's first sends leave after a small bin instead of a full one,
   while later bins keep their size (small bins throughout would gather
   shared source rows more often).

How the rows travel between the bins of peers:
:mod:`graphwire.fullgraph.g3.messages`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import scipy.sparse as sp
import torch
from scipy.sparse import csgraph

from graphwire.comm.plan import ExchangePlan
from graphwire.nn.base import MessageGraph

__all__ = [
    "NODE_ORDERS",
    "RAMP",
    "Bin",
    "LayerBins",
    "bfs_order",
    "bin_bytes",
    "layer_bins",
    "priority_order",
]

RAMP = 32  # the first bin's row cap is max_rows / RAMP (module docstring, 2)
_FLOAT_BYTES = 4


@dataclass(frozen=True, eq=False)
class Bin:
    """One bin of owned destination rows and the sub-graph they aggregate over.

    Attributes:
        rows: int64 [b], owned-local IDs of the bin's destinations.
        mg: MessageGraph with ``b`` destinations; its sources are ``rows`` then
            the other local rows its edges use (sorted: owned before halo).
        src_owned: int64 [*], owned-local rows feeding ``mg``'s sources.
        src_halo: int64 [*], halo positions feeding the sources after them.
        needs: the messages ``(peer, sender bin)`` its halo rows come in.
        src_ids: int64 [mg.num_src], the original node ID of each source row
            (the engine fills it in).
    """

    rows: torch.Tensor
    mg: MessageGraph
    src_owned: torch.Tensor
    src_halo: torch.Tensor
    needs: frozenset[tuple[int, int]] = frozenset()
    src_ids: torch.Tensor | None = None

    def local_sources(
        self, num_owned: int, slots: torch.Tensor | None = None
    ) -> torch.Tensor:
        """int64 [mg.num_src]: each source row's local row (owned rows, then
        halo positions after the ``num_owned`` of them; with ``slots``, int64
        [num_halo], halo position ``h`` is at ``slots[h]`` instead)."""
        halo = self.src_halo if slots is None else slots[self.src_halo]
        return torch.cat([self.src_owned, num_owned + halo])


@dataclass(frozen=True, eq=False)
class LayerBins:
    """The bins of one layer: rows without halo inputs first.

    Attributes:
        bins: in schedule order; ``bins[:num_local]`` read no halo row.
        num_local: bins of rows without halo inputs.
        position: int64 [n], each owned row's position in the schedule.
        bin_of_row: int64 [n], each owned row's bin.
        bin_start: int64 [len(bins)], schedule position of each bin's first row.
    """

    bins: list[Bin]
    num_local: int
    position: torch.Tensor
    bin_of_row: torch.Tensor
    bin_start: torch.Tensor


# ------------------------------------------------------------------- order
def priority_order(mg: MessageGraph, plan: ExchangePlan) -> torch.Tensor:
    """Owned rows, most-needed first: by peers needing the row, then by remote
    in-neighbours, then by ID."""
    n = mg.num_dst
    peers = torch.zeros(n, dtype=torch.int64)
    for idx in plan.send_idx:
        peers[idx] += 1
    remote = torch.bincount(mg.dst_of_edges[mg.indices >= n], minlength=n)
    key = (peers * (remote.max() + 1) + remote) * n + (n - 1 - torch.arange(n))
    return torch.argsort(key, descending=True)


def bfs_order(mg: MessageGraph) -> torch.Tensor:
    """Owned rows in BFS order over the part's own (undirected) sub-graph, one
    component after another from its lowest row, then the rows with remote
    in-neighbours moved to the front (a stable partition)."""
    n = mg.num_dst
    dst = mg.dst_of_edges.numpy()
    src = mg.indices.numpy()
    own = src < n
    ones = np.ones(int(own.sum()), dtype=np.int8)
    adjacency = sp.csr_matrix((ones, (dst[own], src[own])), shape=(n, n))
    adjacency = (adjacency + adjacency.T).tocsr()
    _, labels = csgraph.connected_components(adjacency, directed=False)
    # Each component's lowest row starts it; components in order of that row.
    first = np.full(int(labels.max()) + 1 if n else 0, n, dtype=np.int64)
    np.minimum.at(first, labels, np.arange(n))
    sizes = np.bincount(labels, minlength=first.size)
    order = []
    for component in np.argsort(first, kind="stable"):
        start = int(first[component])
        if sizes[component] == 1:
            order.append(np.array([start], dtype=np.int64))
            continue
        visit = csgraph.breadth_first_order(
            adjacency, start, directed=False, return_predecessors=False
        )
        order.append(visit.astype(np.int64))
    bfs = (
        torch.from_numpy(np.concatenate(order))
        if order
        else torch.empty(0, dtype=torch.int64)
    )
    remote = torch.zeros(n, dtype=torch.bool)
    remote[mg.dst_of_edges[mg.indices >= n]] = True
    return torch.cat([bfs[remote[bfs]], bfs[~remote[bfs]]]).to(torch.int64)


# The node orders by name (G3Config.order): every owned row once.
NODE_ORDERS: dict[str, Callable[[MessageGraph, ExchangePlan], torch.Tensor]] = {
    "bfs": lambda mg, plan: bfs_order(mg),
    "priority": priority_order,
}


# -------------------------------------------------------------------- bins
def bin_bytes(num_src: int, rows: int, widths: tuple[int, int]) -> int:
    """The estimated memory of a bin (module docstring, 2)."""
    in_width, out_width = widths
    return _FLOAT_BYTES * (num_src * (in_width + out_width) + rows * out_width)


def layer_bins(
    mg: MessageGraph,
    order: torch.Tensor,
    widths: tuple[int, int],
    budget_bytes: int,
    max_rows: int | None,
) -> LayerBins:
    """Cut ``order`` into one layer's bins (module docstring, 2).

    Args:
        mg: the part's MessageGraph (owned destinations; owned then halo
            sources).
        order: int64 [n], every owned row once.
        widths: the layer's ``(input, output)`` row widths.
        budget_bytes: the memory budget of a bin.
        max_rows: the most rows in a bin, or None; the caps of the bins with
            halo inputs ramp up to it.
    """
    n = mg.num_dst
    has_halo = torch.zeros(n, dtype=torch.bool)
    has_halo[mg.dst_of_edges[mg.indices >= n]] = True
    groups = [order[~has_halo[order]], order[has_halo[order]]]
    cuts = [
        _cut(mg, groups[0], widths, budget_bytes, max_rows),
        _cut(mg, groups[1], widths, budget_bytes, max_rows, ramp=True),
    ]
    bins = [_bin(mg, rows) for group_cuts in cuts for rows in group_cuts]
    schedule = torch.cat([b.rows for b in bins]) if bins else order
    position = torch.empty(n, dtype=torch.int64)
    position[schedule] = torch.arange(n)
    sizes = torch.tensor([b.rows.numel() for b in bins], dtype=torch.int64)
    bin_of_row = torch.repeat_interleave(torch.arange(len(bins)), sizes)
    return LayerBins(
        bins=bins,
        num_local=len(cuts[0]),
        position=position,
        bin_of_row=bin_of_row[position],
        bin_start=torch.cumsum(sizes, 0) - sizes,
    )


def _cut(
    mg: MessageGraph,
    group: torch.Tensor,
    widths: tuple[int, int],
    budget_bytes: int,
    max_rows: int | None,
    ramp: bool = False,
) -> list[torch.Tensor]:
    """Consecutive bins of ``group``, each the longest prefix of what is left
    that fits the budget (and the row cap: ``max_rows``, or with ``ramp``
    ``max_rows / RAMP`` doubling bin by bin); at least one row each."""
    bins: list[torch.Tensor] = []
    start, window = 0, 1024
    total = group.numel()
    while start < total:
        cap = max_rows
        if max_rows is not None and ramp:
            cap = min(max_rows, max(1, max_rows // RAMP) << min(len(bins), 62))
        end = min(total, start + (cap or total), start + window)
        cost = _prefix_bytes(mg, group[start:end], widths)
        take = max(1, int(torch.searchsorted(cost, budget_bytes, right=True)))
        capped = cap is not None and take >= cap
        if take == end - start and end < total and not capped:
            window *= 2  # the budget was not reached: look further
            continue
        bins.append(group[start : start + take])
        start += take
    return bins


def _prefix_bytes(
    mg: MessageGraph, rows: torch.Tensor, widths: tuple[int, int]
) -> torch.Tensor:
    """int64 [len(rows)]: :func:`bin_bytes` of the bin ``rows[: i + 1]``."""
    counts = mg.indptr[rows + 1] - mg.indptr[rows]
    eids = _edge_ids(mg, rows, counts)
    # Each source counts from the first prefix that holds it (as a row or as
    # an in-neighbour of one).
    position = torch.repeat_interleave(torch.arange(rows.numel()), counts)
    sources = torch.cat([rows, mg.indices[eids]])
    at = torch.cat([torch.arange(rows.numel()), position])
    first = torch.full((mg.num_src,), rows.numel(), dtype=torch.int64)
    first.scatter_reduce_(0, sources, at, reduce="amin")
    new = torch.bincount(first[first < rows.numel()], minlength=rows.numel())
    num_src = torch.cumsum(new, 0)
    in_width, out_width = widths
    prefix_rows = torch.arange(1, rows.numel() + 1)
    return _FLOAT_BYTES * (num_src * (in_width + out_width) + prefix_rows * out_width)


def _edge_ids(
    mg: MessageGraph, rows: torch.Tensor, counts: torch.Tensor
) -> torch.Tensor:
    """The CSR positions of the in-edges of ``rows``, row after row."""
    indptr = torch.zeros(rows.numel() + 1, dtype=torch.int64)
    torch.cumsum(counts, 0, out=indptr[1:])
    starts = torch.repeat_interleave(mg.indptr[rows], counts)
    offsets = torch.arange(int(indptr[-1])) - torch.repeat_interleave(
        indptr[:-1], counts
    )
    return starts + offsets


def _bin(mg: MessageGraph, rows: torch.Tensor) -> Bin:
    """Sub-graph of ``rows``: its own rows first among the sources."""
    n = mg.num_dst
    counts = mg.indptr[rows + 1] - mg.indptr[rows]
    eids = _edge_ids(mg, rows, counts)
    indptr = torch.zeros(rows.numel() + 1, dtype=torch.int64)
    torch.cumsum(counts, 0, out=indptr[1:])
    sources = mg.indices[eids]
    slot = torch.full((mg.num_src,), -1, dtype=torch.int64)
    slot[rows] = torch.arange(rows.numel())
    is_other = torch.zeros(mg.num_src, dtype=torch.bool)
    is_other[sources] = True
    is_other[rows] = False
    others = is_other.nonzero().view(-1)  # ascending: owned before halo
    slot[others] = torch.arange(rows.numel(), rows.numel() + others.numel())
    src_rows = torch.cat([rows, others])
    weight = mg.edge_weight[eids] if mg.edge_weight is not None else None
    sub = MessageGraph(indptr, slot[sources], src_rows.numel(), rows.numel(), weight)
    is_halo = src_rows >= n
    return Bin(rows, sub, src_rows[~is_halo], src_rows[is_halo] - n)
