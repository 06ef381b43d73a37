"""`G3Forward`: G3's forward, every layer in bins, as the mode schedules them.

The engine owns one (:class:`~graphwire.fullgraph.g3.engine.G3Engine`
``forward``); :class:`~graphwire.fullgraph.g3.stack.G3Stack` runs it. Per
rank, layer by layer (input layer first): the layer's receives are posted and
its schedule (:mod:`~graphwire.fullgraph.g3.schedule`) starts its sends and
says when each bin may compute; each bin computes its rows on its source rows
(gathered, or the input layer's table read in place:
:mod:`~graphwire.fullgraph.g3.table`), finishes them for the next layer
(activation, the next layer's hashed dropout, then its projection when it
exchanges projected rows) inside the bin's graph, and hands the rows peers
need to the schedule. A last layer summed message by message
(:mod:`~graphwire.fullgraph.g3.sums`) runs no bins.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, cast

import torch

from graphwire.fullgraph.g3.bins import Bin
from graphwire.fullgraph.g3.stack import BinGraph, StackGraph, SumGraph
from graphwire.fullgraph.g3.sums import MessageSums
from graphwire.graph.seeds import derive_seed
from graphwire.nn.base import MessageGraph
from graphwire.nn.dropout import hashed_dropout
from graphwire.nn.models import Projecting, SumsSources

if TYPE_CHECKING:
    from graphwire.fullgraph.g3.engine import G3Engine

__all__ = ["G3Forward"]


# A bin's source rows: (rows [num_src, width], its MessageGraph, their IDs).
_Sources = tuple[torch.Tensor, MessageGraph, torch.Tensor]
# Between layers: (activation, dropout p, dropout seed, whether it drops out).
_Between = tuple[Callable[[torch.Tensor], torch.Tensor], float, int | None, bool]


class G3Forward:
    """G3's forward of the whole stack (see the module docstring).

    Args:
        engine: the engine it runs for (its model's layers, bins, schedule,
            wire and input table).
    """

    def __init__(self, engine: G3Engine) -> None:
        self._engine = engine
        # How the model finishes a layer's rows for the next (begin()).
        self._between: _Between | None = None

    @property
    def begun(self) -> bool:
        """Whether :meth:`begin` has told it how the model finishes rows."""
        return self._between is not None

    def begin(
        self,
        activation: Callable[[torch.Tensor], torch.Tensor],
        p: float,
        seed: int | None,
        training: bool,
    ) -> None:
        """Before each forward: the model's ``activation`` between layers,
        then its hashed dropout (``p``, ``seed``), applied in ``training``."""
        self._between = (activation, p, seed, training)

    def stack(
        self, h0: torch.Tensor, track: bool, needs_grad: bool
    ) -> tuple[torch.Tensor, StackGraph | None]:
        """Every layer in bins (:meth:`layer`) on the owned input rows ``h0``;
        returns the last layer's owned rows and, when ``track``, the graphs
        for the backward (``needs_grad``: whether ``h0`` needs a gradient)."""
        engine = self._engine
        h0 = h0.detach().requires_grad_(needs_grad)
        source, dst_rows, projection = h0.detach(), None, None
        # Layer 0 reads projected rows when it exchanges them (the owned rows
        # projected here) or when it projects its table here (the owned and
        # the cached halo rows, once; the bins gather their rows of it).
        here = engine.table.projection(engine.model_layers[0])
        first = engine.exchanged_projection(0, engine.model_layers[0])
        if first is None:
            first = here
        if first is not None:
            rows = h0
            if here is not None:
                rows = torch.cat([h0, engine.cached_input_halo()])
                engine.counters["proj.table"] += 1
            with torch.set_grad_enabled(track):
                projection = first.project(rows)
            source = projection.detach()
            dst_rows = h0.detach() if first.reads_dst_rows else None
        layers: list[list[BinGraph] | SumGraph] = []
        for index in range(engine.num_layers):
            grads = (track and index > 0, track and index > 0)
            if index == 0:
                grads = (needs_grad or first is not None, needs_grad)
            source, dst_rows, graphs = self.layer(index, source, dst_rows, track, grads)
            layers.append(graphs)
        if not track:
            return source, None
        return source, StackGraph(layers, h0, projection, here is not None)

    def layer(
        self,
        index: int,
        source: torch.Tensor,
        dst_rows: torch.Tensor | None,
        track: bool,
        grads: tuple[bool, bool],
    ) -> tuple[torch.Tensor, torch.Tensor | None, list[BinGraph] | SumGraph]:
        """Layer ``index`` in bins, as the mode schedules them; the sends of
        the next layer's rows overlap.

        ``source`` holds the owned rows the bins read as sources (projected
        when the layer exchanges projected rows), ``dst_rows`` the owned input
        rows when its ``propagate`` reads them; with ``track`` the bins keep
        their graphs, and ``grads`` says whether the source and destination
        leaves need gradients.

        Returns the next layer's ``source`` and ``dst_rows`` (the last layer:
        its output rows and None) and, with ``track``, the bins' graphs.
        """
        engine, wire, schedule = self._engine, self._engine.wire, self._engine.schedule
        layer = engine.model_layers[index]
        n = engine.part.num_owned
        projected = engine.exchanged_projection(index, layer)
        here = engine.table.projection(layer) if index == 0 else None
        if here is not None:  # source: the projected table (stack)
            projected = here
            wire.halo[index] = source[n:]
        table_mgs = engine.table_graphs(index, layer, grads[0])
        table = engine.table.table(source) if table_mgs is not None else None
        cached = index == 0 and engine.cache_input
        if not cached:
            halo = table[n:] if table is not None else None
            wire.post(index, source.shape[1], source, halo)
            schedule.sends.start(wire, index, source)
            schedule.bins.start(wire, index)
        sums = engine.summed(index, layer)
        if sums is not None:
            out, summed = self._sums(index, sums, source, dst_rows, track)
            return out, None, summed if summed is not None else []
        last = index == engine.num_layers - 1
        graphs: list[BinGraph] = []
        out_src: torch.Tensor | None = None
        out_dst: torch.Tensor | None = None
        for b, bin_ in engine.bin_order(index):
            schedule.bins.before(wire, index, bin_)
            if table is not None:  # the bins read [owned; halo] in place
                assert table_mgs is not None and engine.table.ids is not None
                if cached:
                    engine.table.fill_halo(b, table[n:])
                sources = (table, table_mgs[b], engine.table.ids)
                engine.counters["bins.in_place"] += 1
            else:
                h_src = self._gather(index, b, bin_, source, here is None and cached)
                assert bin_.src_ids is not None
                sources = (h_src, bin_.mg, bin_.src_ids)
            h_src, h_dst, outs = self._bin(
                index, projected, bin_, sources, dst_rows, track, grads
            )
            if track:
                graphs.append(BinGraph(b, bin_, h_src, h_dst, outs))
            if out_src is None:
                out_src = outs[0].new_empty((n, outs[0].shape[1]))
                if len(outs) > 1:
                    out_dst = outs[1].new_empty((n, outs[1].shape[1]))
            out_src.index_copy_(0, bin_.rows, outs[0].detach())
            if out_dst is not None:
                out_dst.index_copy_(0, bin_.rows, outs[1].detach())
            if not last:
                schedule.sends.after(wire, index, b, outs[0].detach())
        wire.wait(index, None)
        schedule.sends.end(wire, last)
        if out_src is None:
            out_src, out_dst = self._no_rows(index, source)
        return out_src, out_dst, graphs

    def _bin(
        self,
        index: int,
        projected: Projecting | None,
        bin_: Bin,
        sources: _Sources,
        dst_rows: torch.Tensor | None,
        track: bool,
        grads: tuple[bool, bool],
    ) -> tuple[torch.Tensor, torch.Tensor | None, tuple[torch.Tensor, ...]]:
        """Bin ``bin_`` of layer ``index`` on its ``sources``: ``propagate``
        of ``projected`` on them when the layer reads projected rows (with the
        destinations' rows of ``dst_rows`` when it reads them), else the
        layer; the output is finished for the next layer (:meth:`_finish`)
        inside the bin's graph. Returns the source and destination leaves
        and what the bin hands on (:class:`~graphwire.fullgraph.g3.stack.BinGraph`
        ``outs``)."""
        engine = self._engine
        layer = engine.model_layers[index]
        h_src, mg, src_ids = sources
        assert bin_.src_ids is not None
        with torch.set_grad_enabled(track):
            h_src = h_src.requires_grad_(track and grads[0])
            h_dst = None
            if projected is None:
                out = engine.call_layer(index, layer, mg, h_src, src_ids)
            else:
                if projected.reads_dst_rows:
                    assert dst_rows is not None
                    h_dst = dst_rows.index_select(0, bin_.rows)
                    h_dst.requires_grad_(track and grads[1])
                out = engine.call_propagate(
                    index, projected, bin_.mg, h_src, h_dst, bin_.src_ids
                )
            ids = bin_.src_ids[: bin_.rows.numel()]  # the bin's own rows
            last = index == engine.num_layers - 1
            outs = (out,) if last else self._finish(index, out, ids)
        return h_src, h_dst, outs

    def _finish(
        self, index: int, out: torch.Tensor, ids: torch.Tensor
    ) -> tuple[torch.Tensor, ...]:
        """Layer ``index``'s output rows (global IDs ``ids``) as layer
        ``index + 1`` reads them: the activation, that layer's dropout, then
        its projection when it exchanges projected rows."""
        assert self._between is not None
        activation, p, seed, training = self._between
        h = activation(out)
        if training:
            assert seed is not None
            h = hashed_dropout(h, p, ids, derive_seed(seed, index + 1))
        engine = self._engine
        following = engine.exchanged_projection(
            index + 1, engine.model_layers[index + 1]
        )
        if following is None:
            return (h,)
        m = following.project(h)
        return (m, h) if following.reads_dst_rows else (m,)

    def _no_rows(
        self, index: int, source: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """What layer ``index`` hands on from a part without rows: the next
        layer's source rows (and destination rows), none of them."""
        engine = self._engine
        layer = engine.model_layers[index]
        width = int(getattr(layer, "output_width", getattr(layer, "out_dim", 0)))
        projection, out_dst = None, None
        if index < engine.num_layers - 1:
            following = engine.model_layers[index + 1]
            projection = engine.exchanged_projection(index + 1, following)
        if projection is not None:
            if projection.reads_dst_rows:
                out_dst = source.new_zeros((0, width))
            width = int(cast(Any, projection).message_width)
        return source.new_zeros((0, width)), out_dst

    def _gather(
        self, index: int, b: int, bin_: Bin, source: torch.Tensor, cached: bool
    ) -> torch.Tensor:
        """Bin ``b``'s source rows of layer ``index``: owned rows from
        ``source``, then its halo rows (``cached``: the input layer's cached
        rows), each gathered straight into its part of one buffer."""
        num_owned, num_halo = bin_.src_owned.numel(), bin_.src_halo.numel()
        if not num_halo:
            return source.index_select(0, bin_.src_owned)
        h_src = source.new_empty((num_owned + num_halo, *source.shape[1:]))
        torch.index_select(source, 0, bin_.src_owned, out=h_src[:num_owned])
        if cached:
            self._engine.table.gather_halo(b, bin_, h_src[num_owned:])
        else:
            halo = self._engine.wire.halo[index]
            torch.index_select(halo, 0, bin_.src_halo, out=h_src[num_owned:])
        return h_src

    def _sums(
        self,
        index: int,
        sums: MessageSums,
        source: torch.Tensor,
        dst_rows: torch.Tensor | None,
        track: bool,
    ) -> tuple[torch.Tensor, SumGraph | None]:
        """Layer ``index`` summed message by message: the owned source rows'
        terms while the halo rows are in flight, then each message's, straight
        from its receive buffer, as it is in (in send order); then the
        layer's ``finish`` (with ``dst_rows``, the owned input rows, when it
        reads them). Returns its output rows and, with ``track``, the graph
        for the backward."""
        engine = self._engine
        sums = sums.matrices(source.dtype)
        agg = sums.sum_owned(source)
        for key, rows in engine.wire.arrivals(index):
            sums.add_message(agg, key, rows)
            engine.counters["sums.messages"] += 1
        engine.wire.drain()
        summing = cast(SumsSources, engine.model_layers[index])
        h_dst = None
        if summing.reads_dst_rows:
            assert dst_rows is not None
            h_dst = dst_rows.requires_grad_(track)  # its own buffer: a leaf
        with torch.set_grad_enabled(track):
            out = summing.finish(agg.requires_grad_(track), h_dst)
        # The stack's output is a tensor of its own: G3Stack's node becomes
        # its grad_fn, and the backward runs finish's graph through ``out``.
        return out.detach(), SumGraph(agg, h_dst, out) if track else None
