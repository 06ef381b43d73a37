"""`InputTable`: G3's input layer over one table of its local rows.

A bin gathers the rows it reads (its own, then their in-neighbours), and
neighbours shared by bins are gathered again by each. The input layer can do
better, reading one table ``[owned; halo]`` (float [num_owned + num_halo, F]):

- **In place.** When it only aggregates its rows before transforming them
  (GCN or GraphSAGE widening the input: ``transforms_sources`` false) and
  they need no gradient, its bins read the table as it is, each through its
  MessageGraph over the table's rows (:func:`table_graph`).
- **Projected once.** When its halo rows are cached and it transforms every
  row it reads with a row-wise projection (GAT; GCN or GraphSAGE projecting
  first), the table is projected once per forward
  (:meth:`InputTable.projection`) and the bins gather their rows of the
  projection, whose backward runs once on the sum of the bins' gradients.

With cached halo rows, the input dropout is applied to each halo row once
per forward, by the first bin that reads it: the table holds its halo rows
in the order bins first read them (then any that no bin reads), so a bin
fills its span of them with one slice (:meth:`InputTable.fill_halo`); bins
that gather their rows take them from a dropped-out copy filled the same
way (:meth:`InputTable.gather_halo`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import cast

import torch
from torch import nn

from graphwire.fullgraph.g3.bins import Bin
from graphwire.nn.base import MessageGraph
from graphwire.nn.models import Projecting

__all__ = ["InputTable", "table_graph"]


def table_graph(
    bin_: Bin, num_owned: int, num_halo: int, slots: torch.Tensor | None = None
) -> MessageGraph:
    """``bin_``'s MessageGraph over the whole table of local rows (owned, then
    halo) instead of its gathered source rows: the same edges and weights,
    each source its local row, the destinations ``bin_.rows``
    (``dst_index``). With ``slots`` (int64 [num_halo]) the table holds halo
    position ``h`` in its halo row ``slots[h]`` instead of ``h``."""
    mg = bin_.mg
    return MessageGraph(
        mg.indptr,
        bin_.local_sources(num_owned, slots)[mg.indices],
        num_owned + num_halo,
        mg.num_dst,
        mg.edge_weight,
        dst_index=bin_.rows,
    )


class InputTable:
    """The input layer's table of local rows (see the module docstring).

    Args:
        bins: the input layer's bins.
        order: their indices in forward order.
        num_owned: owned rows.
        ids: int64 [num_owned + num_halo], each local row's original ID.
        x_halo: float [num_halo, F], the cached halo input rows (None: the
            halo rows are exchanged).
        cached_rows: the engine's ``cached_input_halo(rows, out)``: the
            cached halo rows ``rows`` after the input dropout.
        drop_rows: the engine's ``drop_input_rows(x, ids, out)``: input rows
            ``x`` after the input dropout.
        dropping: whether this forward drops input rows out (training).

    Attributes:
        ids: int64 [num_owned + num_halo], the original ID of each of the
            table's rows, once :meth:`graphs` has built them.
    """

    def __init__(
        self,
        bins: list[Bin],
        order: Sequence[int],
        num_owned: int,
        ids: torch.Tensor,
        x_halo: torch.Tensor | None,
        cached_rows: Callable[..., torch.Tensor],
        drop_rows: Callable[..., torch.Tensor],
        dropping: Callable[[], bool],
    ) -> None:
        self._bins, self._n, self._local_ids = bins, num_owned, ids
        self._num_halo = ids.numel() - num_owned
        self._x_halo, self._cached_rows, self._drop_rows = (
            x_halo,
            cached_rows,
            drop_rows,
        )
        self._dropping = dropping
        # Bin -> the halo positions first read there; the halo positions in
        # first-read order, then any that no bin reads; each bin's span of it.
        self._first_read: dict[int, torch.Tensor] = {}
        self._first_order = torch.arange(self._num_halo)
        self._first_span: dict[int, tuple[int, int]] = {}
        if x_halo is not None and bins:
            seen = torch.zeros(self._num_halo, dtype=torch.bool)
            first, start = [], 0
            for b in order:
                src_halo = bins[b].src_halo
                fresh = src_halo[~seen[src_halo]]
                seen[fresh] = True
                self._first_read[b] = fresh
                first.append(fresh)
                self._first_span[b] = (start, start + fresh.numel())
                start += fresh.numel()
            self._first_order = torch.cat([*first, (~seen).nonzero().view(-1)])
        self._graphs: list[MessageGraph] | None = None
        self.ids: torch.Tensor | None = None
        self._x_first: torch.Tensor | None = None  # cached halo rows, table order
        self._table: torch.Tensor | None = None
        # The dropped-out halo rows for bins that gather theirs, made the first
        # time one does: inputs run in place or projected here never do.
        self._x_dropped: torch.Tensor | None = None

    def projection(self, layer: nn.Module) -> Projecting | None:
        """The input ``layer`` when its halo rows are cached and it transforms
        every source row it reads with a row-wise projection (GAT's ``lin``;
        GCN and GraphSAGE projecting first): the table is then projected
        once per forward and each bin gathers its rows of that and runs
        ``propagate``, instead of projecting its own source rows, which
        repeat from bin to bin. Else None."""
        if self._x_halo is None:
            return None
        if not getattr(layer, "transforms_sources", False):
            return None  # aggregates first: graphs()
        if not (hasattr(layer, "project") and hasattr(layer, "propagate")):
            return None
        return cast(Projecting, layer)

    def graphs(self, layer: nn.Module) -> list[MessageGraph] | None:
        """The bins as MessageGraphs over the table (:func:`table_graph`,
        built once) when the input ``layer`` only aggregates its source rows
        (``transforms_sources`` false), else None; the caller has checked
        that the rows need no gradient and are not exchanged projected. The
        table is one buffer, rewritten by every forward: such a layer's
        backward keeps no source row (autograd would refuse the rewritten
        buffer if it did)."""
        if getattr(layer, "transforms_sources", True):
            return None
        if self._graphs is None:
            n, num_halo = self._n, self._num_halo
            slots, ids = None, self._local_ids
            if self._x_halo is not None:  # halo rows in first-read order
                order = self._first_order
                slots = torch.empty_like(order)
                slots[order] = torch.arange(order.numel())
                ids = torch.cat([ids[:n], ids[n:][order]])
                self._x_first = self._x_halo[order]
            self._graphs = [table_graph(b, n, num_halo, slots) for b in self._bins]
            self.ids = ids
        return self._graphs

    def table(self, owned: torch.Tensor) -> torch.Tensor:
        """The table, float [num_owned + num_halo, width]: one buffer, reused
        by every forward, whose owned rows are now ``owned``."""
        shape = (self._n + self._num_halo, owned.shape[1])
        if self._table is None or self._table.shape != shape:
            self._table = owned.new_empty(shape)
        self._table[: self._n] = owned
        return self._table

    def fill_halo(self, b: int, halo: torch.Tensor) -> None:
        """Put in ``halo`` (the table's halo rows, in first-read order) the
        cached input rows bin ``b`` reads first, after the input dropout: one
        slice of a copy of the cached rows kept in that order, dropped out
        straight into the table, instead of a gather of them and a scatter
        into the table."""
        start, end = self._first_span[b]
        if start == end:
            return
        assert self._x_first is not None and self.ids is not None
        ids = self.ids[self._n :]
        self._drop_rows(self._x_first[start:end], ids[start:end], halo[start:end])

    def gather_halo(self, b: int, bin_: Bin, out: torch.Tensor) -> None:
        """Put in ``out`` bin ``b``'s cached halo rows, after the input
        dropout: each row is dropped out once per forward, by the first bin
        that reads it."""
        if not self._dropping():
            self._cached_rows(bin_.src_halo, out)
            return
        assert self._x_halo is not None
        if self._x_dropped is None:
            self._x_dropped = self._x_halo.new_empty(self._x_halo.shape)
        fresh = self._first_read[b]
        if fresh.numel():
            self._x_dropped.index_copy_(0, fresh, self._cached_rows(fresh))
        torch.index_select(self._x_dropped, 0, bin_.src_halo, out=out)
