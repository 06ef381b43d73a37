"""`P2PEngine` (``--exchange g3``): G3's hybrid-parallel peer-to-peer exchange.

G3 (Wan et al., "Scaling Graph Neural Network Training with Hybrid
Parallelism") sends each boundary row once to each peer that needs it and hides
the transfer behind computation:

- **Bins** (:mod:`graphwire.fullgraph.g3_bins`). A rank computes its owned
  rows of a layer in bins: in BFS order with the rows that have remote
  neighbours first (G3's Step 1; ``order="priority"``: most-needed rows
  first), each bin as many rows as the layer's memory budget allows
  (``bin_mb``, from the layer's input and output widths), at most ``bin_rows``
  in a layer whose output is sent.
- **Inter-layer pipelining.** As soon as a bin of layer ``l`` is computed, the
  rows of it that peers need at layer ``l + 1`` are finished (activation and
  the layer's hashed dropout, exactly what the model will apply) and sent with
  ``isend``, one message per (bin, peer), while later bins compute. Sends are
  driven by torch.distributed's (gloo's) own communication threads; receives
  for layer ``l + 1`` are posted before layer ``l`` starts.
- **Intra-layer eager computation.** Bins whose inputs are all owned compute
  first, while halo rows are in flight; each bin that needs halo rows waits
  only for the messages carrying its own remote inputs.
- **Backward in reverse bins.** Each layer is one autograd node
  (:class:`BinnedLayer`) that keeps every bin's graph. Its backward walks the
  bins in reverse: the bins that read halo rows first, after which each halo
  row's gradient is complete and goes to its owner (``isend``, tag
  ``bwd.L{l}``), then the bins that read only owned rows while those
  gradients are in flight. Parameter gradients accumulate bin by bin.
- **Last layer.** Its output goes to no peer, so no row cap applies: it runs
  in as few bins as the budget allows (two with the defaults here: rows
  without and with halo inputs), since a bin transforms all of its source rows
  and smaller bins would only repeat work.
- **Layer-wise parameter synchronisation** (``sync="layer"``, G3 §6.2). As
  soon as a layer's backward is done its parameter gradients start their
  all-reduce (tag ``sync.grad.L{l}``, non-blocking), which completes once every
  rank has finished that layer, while the layers below run their backward;
  :meth:`P2PEngine.sync_gradients` collects them before the one optimizer step
  of the epoch. The sums are bitwise those of one flat all-reduce
  (``sync="epoch"``, tag ``sync.grad``).

``mode`` switches parts off for G3's ablation: ``full`` (both), ``inter``
(pipelined sends, but a layer waits for all its halo rows before computing),
``intra`` (sends start when a layer starts, eager computation) and
``sequential`` (send everything, wait, compute).

- **Projected rows.** A layer that narrows its rows
  (:func:`~graphwire.nn.models.projects_first`, e.g. GCN's output layer into
  the classes) exchanges them projected: the layer before applies the
  projection to the rows it sends as their bins finish, and the layer's bins
  run ``layer.propagate`` on projected rows; its backward returns the
  projected rows' gradients to their owners, which finish the projection's
  backward once their own rows' gradient is complete.

Forward bytes per layer equal ``num_halo * width * 4`` on every rank, where
``width`` is the exchanged row width: each halo row arrives exactly once.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any, cast

import torch
from torch import nn

from graphwire.comm.base import PendingSum, Work
from graphwire.fullgraph.base import (
    Engine,
    assign_gradients,
    flat_gradients,
    local_message_graph,
    register,
    sum_gradients,
)
from graphwire.fullgraph.g3_bins import (
    ORDERS,
    Bin,
    bfs_order,
    layer_bins,
    priority_order,
    send_order,
    setup_messages,
    with_needs,
)
from graphwire.graph.seeds import derive_seed
from graphwire.nn.base import MessageGraph
from graphwire.nn.dropout import hashed_dropout
from graphwire.nn.models import GNN

__all__ = ["MODES", "P2PEngine", "SYNCS"]

MODES = ("full", "inter", "intra", "sequential")
SYNCS = ("layer", "epoch")


@dataclass(frozen=True, slots=True, eq=False)
class BinGraph:
    """One bin's autograd graph, kept from the forward for the backward.

    Attributes:
        bin: the bin.
        src: the leaf of its source rows (input rows, or projected rows when
            the layer exchanges them).
        out: its output rows.
        dst: the leaf of its destinations' input rows (projected layers).
    """

    bin: Bin
    src: torch.Tensor
    out: torch.Tensor
    dst: torch.Tensor | None


@dataclass(frozen=True, slots=True, eq=False)
class LayerGraph:
    """A layer's bins' graphs, and its projection when it exchanged
    projected rows (``h`` is then the owned input leaf, ``projection`` is
    ``layer.project(h)``)."""

    bins: list[BinGraph]
    h: torch.Tensor
    projection: torch.Tensor | None


@register("g3")
class P2PEngine(Engine):
    """G3 peer-to-peer exchange in bins (see the module docstring).

    Options:
        mode: one of :data:`MODES` (default ``full``).
        bin_mb: memory budget of a bin in MiB (default 256), per layer from its
            widths (:mod:`graphwire.fullgraph.g3_bins`). G3 uses half a GPU's
            memory; on CPU the budget bounds a bin's working set.
        bin_rows: at most this many rows in a bin of a layer whose output is
            sent (G3's initial bin size, default 8192): smaller bins start
            sends earlier but repeat more source rows.
        order: node order, one of :data:`~graphwire.fullgraph.g3_bins.ORDERS`
            (default ``bfs``, G3's Step 1).
        widths: each layer's ``(input, output)`` row widths, for the budget
            (``build_engine`` passes the model's); default 128 for all.
        sync: parameter synchronisation, one of :data:`SYNCS`: ``layer`` (each
            layer's gradients all-reduced as soon as its backward is done, the
            default) or ``epoch`` (one flat all-reduce after the backward).
    """

    takes_widths = True

    def __init__(
        self,
        *args: Any,
        mode: str = "full",
        bin_mb: float = 256.0,
        bin_rows: int = 8192,
        order: str = "bfs",
        widths: Sequence[tuple[int, int]] | None = None,
        sync: str = "layer",
        **kwargs: Any,
    ) -> None:
        super().__init__(*args, **kwargs)
        if mode not in MODES:
            raise ValueError(f"g3 mode: expected one of {MODES}, got {mode!r}")
        if sync not in SYNCS:
            raise ValueError(f"g3 sync: expected one of {SYNCS}, got {sync!r}")
        if order not in ORDERS:
            raise ValueError(f"g3 order: expected one of {ORDERS}, got {order!r}")
        if not bin_mb > 0:
            raise ValueError(f"g3 bin_mb: expected > 0, got {bin_mb}")
        if bin_rows < 1:
            raise ValueError(f"g3 bin_rows: expected >= 1, got {bin_rows}")
        widths = list(widths) if widths is not None else [(128, 128)] * self.num_layers
        if len(widths) != self.num_layers:
            raise ValueError(
                f"g3 widths: expected one (input, output) pair per layer "
                f"({self.num_layers}), got {widths}"
            )
        self.mode, self.sync, self.order = mode, sync, order
        self.bin_mb, self.bin_rows = bin_mb, bin_rows
        # Layer-wise gradient sums in flight: (parameters, pending sum).
        self._layer_sums: list[tuple[list[torch.Tensor], PendingSum]] = []
        self._mg = local_message_graph(self.part, self.plan, self.transport, self.kind)
        self._mgs = [self._mg] * self.num_layers
        self._plan_bins(widths)
        self.counters = {"bins": sum(len(layer.bins) for layer in self.layers)}
        for index, layer in enumerate(self.layers):
            self.counters[f"bins.L{index}"] = len(layer.bins)
        self._pending_recv: dict[int, dict[tuple[int, int], tuple[Work, Any]]] = {}
        self._sends: list[Work] = []
        self._halo: dict[int, torch.Tensor] = {}
        self._begin: tuple[Any, float, int | None, bool] | None = None
        self._model_layers: list[nn.Module] = []

    @property
    def mgs(self) -> list[MessageGraph]:
        return self._mgs

    # ------------------------------------------------------------------ setup
    def _plan_bins(self, widths: Sequence[tuple[int, int]]) -> None:
        """Every layer's bins, and the messages carrying every layer's halo
        rows (layer ``k``'s grouped by the sender's bins of layer ``k - 1``;
        the input layer's by its own bins)."""
        n = self.part.num_owned
        order = (
            bfs_order(self._mg)
            if self.order == "bfs"
            else priority_order(self._mg, self.plan)
        )
        budget = int(self.bin_mb * 2**20)
        last = self.num_layers - 1
        layers = [
            # The last layer's output goes to no peer, so the row cap (which
            # makes sends start early) does not apply to it.
            layer_bins(
                self._mg,
                order,
                widths[index],
                budget,
                None if index == last else self.bin_rows,
            )
            for index in range(self.num_layers)
        ]
        self.messages = [
            setup_messages(
                layers[max(index - 1, 0)],
                self.plan,
                self.transport,
                self._halo_first(max(index - 1, 0)),
            )
            for index in range(self.num_layers)
        ]
        ids = self.local_orig_nid
        assert ids is not None
        self.layers = []
        for layer, messages in zip(layers, self.messages, strict=True):
            layer = with_needs(layer, messages)
            bins = [
                replace(b, src_ids=ids[torch.cat([b.src_owned, n + b.src_halo])])
                for b in layer.bins
            ]
            self.layers.append(replace(layer, bins=bins))

    # ---------------------------------------------------------------- runtime
    def begin(self, model: nn.Module, dropout_seed: int | None) -> None:
        """Before each forward: learn how the model finishes a layer's rows
        (activation, then the next layer's dropout), so that pipelined sends
        carry exactly the rows the model will use."""
        p = float(getattr(model, "dropout", 0.0))
        training = bool(model.training) and p > 0.0
        if training and dropout_seed is None and self.mode in ("full", "inter"):
            raise ValueError(
                "g3: pipelined sends need hashed dropout (a dropout_seed) in training"
            )
        if self._layer_sums:
            raise RuntimeError(
                "g3: the last backward's gradients were never collected "
                "(call engine.sync_gradients(model) after each backward)"
            )
        super().begin(model, dropout_seed)
        self._begin = (model.activation, p, dropout_seed, training)
        self._model_layers = list(cast(GNN, model).layers)
        self._halo.clear()
        self._pending_recv.clear()

    def _post_recvs(self, layer: int, width: int, like: torch.Tensor) -> None:
        """Post the receives of layer ``layer``'s halo rows (once per forward)."""
        if layer in self._halo:
            return
        self._halo[layer] = like.new_empty((self.plan.num_halo, width))
        tag = f"{self.phase}fwd.L{layer}"
        pending = self._pending_recv[layer] = {}
        messages = self.messages[layer]
        for key in messages.keys:
            buf = like.new_empty((messages.recv_pos[key].numel(), width))
            pending[key] = (self.transport.irecv(buf, key[0], tag), buf)

    def _wait(self, layer: int, keys: frozenset[tuple[int, int]] | None) -> None:
        """Wait for the messages ``keys`` of ``layer`` (all when None) and put
        their rows in the halo buffer."""
        pending = self._pending_recv.get(layer, {})
        wanted = list(pending) if keys is None else [k for k in keys if k in pending]
        if not wanted:
            return
        # Each row is written once, before any bin reads it; the buffer is
        # outside autograd (each bin's graph starts from its gathered rows).
        halo = self._halo[layer]
        recv_pos = self.messages[layer].recv_pos

        def wait() -> None:
            for key in wanted:
                work, buf = pending.pop(key)
                work.wait()
                halo[recv_pos[key]] = buf

        self.timed(wait)

    def _send_bin(self, layer: int, b: int, rows: torch.Tensor) -> None:
        """Send every peer the rows of bin ``b`` it needs at ``layer``;
        ``rows`` holds bin ``b``'s rows in bin order."""
        tag = f"{self.phase}fwd.L{layer}"
        for peer, chunks in enumerate(self.messages[layer].send_rows):
            if b in chunks:
                payload = rows.index_select(0, chunks[b][1])
                self._sends.append(self.transport.isend(payload, peer, tag))

    def _send_all(self, layer: int, h: torch.Tensor) -> None:
        """Send every peer all the owned rows of ``h`` it needs at ``layer``,
        message by message in send order."""
        tag = f"{self.phase}fwd.L{layer}"
        for peer, chunks in enumerate(self.messages[layer].send_rows):
            for rows, _ in chunks.values():
                payload = h.index_select(0, rows)
                self._sends.append(self.transport.isend(payload, peer, tag))

    def _finish_rows(
        self, layer: int, out: torch.Tensor, rows: torch.Tensor
    ) -> torch.Tensor:
        """Layer ``layer``'s output rows as layer ``layer + 1`` consumes them
        (projected, if it exchanges projected rows)."""
        assert self._begin is not None
        activation, p, seed, training = self._begin
        h = activation(out.detach())
        if training:
            assert seed is not None
            ids = self.part.orig_nid[rows]
            h = hashed_dropout(h, p, ids, derive_seed(seed, layer + 1))
        following = self.exchanged_projection(layer + 1, self._model_layers[layer + 1])
        if following is not None:
            with torch.no_grad():
                h = following.project(h)
        return h

    def _row_width(self, index: int, out: torch.Tensor) -> int:
        """Width of the rows layer ``index`` exchanges, ``out`` being rows of
        its input."""
        projected = self.exchanged_projection(index, self._model_layers[index])
        return int(out.shape[1]) if projected is None else projected.message_width

    def run_layer(
        self, index: int, layer: nn.Module, mg: MessageGraph, h: torch.Tensor
    ) -> torch.Tensor:
        if self._begin is None:
            raise RuntimeError("g3: begin(model, dropout_seed) must precede forward")
        params = tuple(p for p in layer.parameters() if p.requires_grad)
        track = torch.is_grad_enabled()
        needs_grad = track and h.requires_grad
        out: torch.Tensor = BinnedLayer.apply(
            h, self, index, layer, (track, needs_grad), *params
        )
        return out

    def _halo_first(self, index: int) -> bool:
        """Whether layer ``index`` computes its bins with halo inputs first.

        A layer whose halo rows are already here (the cached input layer)
        computes the rows peers need first, so their sends start early; any
        other layer computes the bins that need no halo rows first, while the
        halo rows are in flight (eager computation).
        """
        return index == 0 and self.cache_input

    def _bin_order(self, index: int) -> list[tuple[int, Bin]]:
        """The bins of layer ``index`` in forward order, with their indices."""
        layer = self.layers[index]
        order = send_order(len(layer.bins), layer.num_local, self._halo_first(index))
        return [(b, layer.bins[b]) for b in order]

    def _forward_bins(
        self,
        index: int,
        layer: nn.Module,
        h: torch.Tensor,
        track: bool,
        needs_grad: bool,
    ) -> tuple[torch.Tensor, LayerGraph]:
        """Layer ``index`` in bins; the sends of the next layer's rows overlap.

        A layer that exchanges projected rows first projects the owned rows
        (``layer.project``; the rows sent to peers were projected by the layer
        before, see :meth:`_finish_rows`) and its bins run
        ``layer.propagate`` on projected source rows.

        Returns the owned output rows and, when ``track``, the bins' autograd
        graphs for :meth:`_backward_bins` (the source leaves require grad when
        ``needs_grad``, or when they are projected rows).
        """
        pipelined = self.mode in ("full", "inter")
        eager = self.mode in ("full", "intra")
        projected = self.exchanged_projection(index, layer)
        source = h  # the owned rows the bins read
        projection = None
        if projected is not None:
            with torch.set_grad_enabled(track):
                h = h.detach().requires_grad_(needs_grad)
                projection = projected.project(h)
            source = projection.detach()
        if index == 0 and self.cache_input:
            halo = self.cached_input_halo()  # nothing to send or wait for
        else:
            self._post_recvs(index, source.shape[1], source)
            if index == 0 or not pipelined:
                self._send_all(index, source)
            halo = self._halo[index]
        if not eager:
            self._wait(index, None)
        send_next = pipelined and index < self.num_layers - 1
        graphs: list[BinGraph] = []
        out: torch.Tensor | None = None
        for b, bin_ in self._bin_order(index):
            if eager and bin_.needs:
                self._wait(index, bin_.needs)
            h_src = source.index_select(0, bin_.src_owned)
            if bin_.src_halo.numel():
                h_src = torch.cat([h_src, halo.index_select(0, bin_.src_halo)])
            assert bin_.src_ids is not None
            with torch.set_grad_enabled(track):
                # Projected rows carry the projection's gradient even where
                # the layer's input needs none.
                h_src = h_src.requires_grad_(needs_grad or projected is not None)
                h_dst = None
                if projected is None:
                    out_b = self.call_layer(index, layer, bin_.mg, h_src, bin_.src_ids)
                else:
                    if projected.reads_dst_rows:
                        h_dst = h.detach()[bin_.rows].requires_grad_(needs_grad)
                    out_b = self.call_propagate(
                        index, projected, bin_.mg, h_src, h_dst, bin_.src_ids
                    )
            if track:
                graphs.append(BinGraph(bin_, h_src, out_b, h_dst))
            if out is None:
                out = out_b.new_empty((self.part.num_owned, out_b.shape[1]))
            out[bin_.rows] = out_b.detach()
            if send_next:
                self._post_recvs(index + 1, self._row_width(index + 1, out_b), out_b)
                if b in self.messages[index + 1].bins_sent:
                    rows = self._finish_rows(index, out_b, bin_.rows)
                    self._send_bin(index + 1, b, rows)
        self._wait(index, None)
        if index == self.num_layers - 1 or not pipelined:
            # Pipelined sends of the next layer's rows stay in flight while it
            # computes; every send is complete before the forward returns.
            self.timed(self._drain_sends)
        assert out is not None
        return out, LayerGraph(graphs, h, projection)

    def _backward_bins(
        self,
        index: int,
        graph: LayerGraph,
        grad_out: torch.Tensor,
        needs_input_grad: bool,
    ) -> torch.Tensor | None:
        """Backward of layer ``index``, bins in reverse: G3's backward pipeline.

        Bins that read halo rows go first; once they are done every halo row's
        gradient is complete and goes to its owner (``isend``, tag
        ``bwd.L{index}``) while the bins that read only owned rows run their
        backward. Parameter gradients accumulate in ``.grad`` as each bin's
        graph is walked; a layer that exchanged projected rows then runs its
        projection's backward on the owned rows' complete gradient. Returns
        the owned input rows' gradient, or None when the input needs none.
        """
        projected = graph.projection is not None
        halo_bins = [g for g in graph.bins if g.bin.src_halo.numel()]
        local_bins = [g for g in graph.bins if not g.bin.src_halo.numel()]
        if not needs_input_grad and not projected:
            # Parameter gradients only, nothing to send.
            for g in [*reversed(halo_bins), *reversed(local_bins)]:
                torch.autograd.backward(g.out, grad_out.index_select(0, g.bin.rows))
            return None
        width = graph.bins[0].src.shape[1]
        grad_owned = grad_out.new_zeros((self.part.num_owned, width))
        grad_halo = grad_out.new_zeros((self.plan.num_halo, width))
        # Gradients of the destinations' own input rows (SAGE's root term),
        # added to the projection's input gradient at the end.
        dst_grads: list[tuple[torch.Tensor, torch.Tensor]] = []
        tag = f"{self.phase}bwd.L{index}"

        def walk(group: list[BinGraph]) -> None:
            for g in reversed(group):
                torch.autograd.backward(g.out, grad_out.index_select(0, g.bin.rows))
                if g.dst is not None and g.dst.grad is not None:
                    dst_grads.append((g.bin.rows, g.dst.grad))
                if g.src.grad is None:
                    continue
                num_owned = g.bin.src_owned.numel()
                grad_owned.index_add_(0, g.bin.src_owned, g.src.grad[:num_owned])
                if g.bin.src_halo.numel():
                    grad_halo.index_add_(0, g.bin.src_halo, g.src.grad[num_owned:])

        walk(halo_bins)
        pending = self.plan.start_scatter_grad(grad_halo, self.transport, tag)
        walk(local_bins)  # overlaps the gradients in flight
        self.timed(lambda: pending.wait(grad_owned))
        if graph.projection is None:
            return grad_owned
        torch.autograd.backward(graph.projection, grad_owned)
        if not needs_input_grad:
            return None
        grad = graph.h.grad
        assert grad is not None
        for rows, part in dst_grads:
            grad.index_add_(0, rows, part)
        return grad

    def _layer_done(self, index: int, params: tuple[torch.Tensor, ...]) -> None:
        """Layer ``index``'s backward is over: its gradients start their sum
        (``sync="layer"``), and the sums started before it move on to their
        second phase."""
        if self.sync != "layer" or self.phase or not params:
            return
        for _, pending in self._layer_sums:
            pending.advance()
        flat = flat_gradients(list(params))
        tag = f"sync.grad.L{index}"
        pending = self.transport.start_all_reduce_sum(flat, tag)
        self._layer_sums.append((list(params), pending))

    def sync_gradients(self, model: nn.Module) -> None:
        """Collect the layer-wise sums, then sum any gradient no layer covered
        (one flat all-reduce); with ``sync="epoch"``, just the flat one."""
        synced: set[int] = set()
        for params, pending in self._layer_sums:
            total = pending.wait()
            assign_gradients(params, total)
            synced.update(id(p) for p in params)
        self._layer_sums.clear()
        rest = [p for p in model.parameters() if id(p) not in synced]
        if rest:
            sum_gradients(rest, self.transport, "sync.grad")

    def _drain_sends(self) -> None:
        for work in self._sends:
            work.wait()
        self._sends.clear()


class BinnedLayer(torch.autograd.Function):
    """``h_owned -> layer output of the owned rows``, computed in G3's bins.

    Forward runs :meth:`P2PEngine._forward_bins` (halo rows arrive through the
    engine's messages; each bin's autograd graph starts from its own source
    rows). Backward runs :meth:`P2PEngine._backward_bins`: the bins' graphs in
    reverse order, sending halo gradients to their owners as soon as they are
    complete. The layer's parameters are inputs only so that the output
    requires grad; their gradients accumulate through the bins' graphs.
    """

    @staticmethod
    def forward(  # type: ignore[override]
        ctx: Any,
        h: torch.Tensor,
        engine: P2PEngine,
        index: int,
        layer: nn.Module,
        flags: tuple[bool, bool],
        *params: torch.Tensor,
    ) -> torch.Tensor:
        out, graph = engine._forward_bins(index, layer, h.detach(), *flags)
        ctx.engine, ctx.index, ctx.graph = engine, index, graph
        ctx.params = params
        return out

    @staticmethod
    def backward(  # type: ignore[override]
        ctx: Any, grad_out: torch.Tensor
    ) -> tuple[torch.Tensor | None, ...]:
        engine: P2PEngine = ctx.engine
        graph, ctx.graph = ctx.graph, None  # free the bins' graphs after use
        if graph is None or not graph.bins:
            raise RuntimeError("g3: backward through a layer run without grad")
        grad = engine._backward_bins(
            ctx.index, graph, grad_out.contiguous(), ctx.needs_input_grad[0]
        )
        engine._layer_done(ctx.index, ctx.params)
        return (grad, None, None, None, None, *([None] * len(ctx.params)))
