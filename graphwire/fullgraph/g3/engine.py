"""`P2PEngine` (``--exchange g3``): G3's hybrid-parallel peer-to-peer exchange.

G3 (Wan et al., "Scaling Graph Neural Network Training with Hybrid
Parallelism") sends each boundary row once to each peer that needs it and hides
the transfer behind computation:

- **One autograd node for the whole stack** (:class:`G3Stack`, through the
  model's ``run_layers`` hook). The engine applies the model's activation and
  hashed dropout between layers itself, bin by bin, so that a bin's graph
  runs from its source rows to what it hands on (the next layer's rows,
  projected when that layer exchanges projected rows) and the backward can
  pipeline across layers.
- **Bins** (:mod:`graphwire.fullgraph.g3.bins`). A rank computes its owned
  rows of a layer in bins: in BFS order with the rows that have remote
  neighbours first (G3's Step 1; ``order="priority"``: most-needed rows
  first), each bin as many rows as the layer's memory budget allows
  (``bin_mb``, from the layer's input and output widths), at most ``bin_rows``
  in a layer whose output is sent (the first bins of rows peers need start
  smaller and double up to it).
- **Inter-layer pipelining.** As soon as a bin of layer ``l`` is computed and
  finished for layer ``l + 1``, the rows of it that peers need are sent with
  ``isend``, one message per (bin, peer), while later bins compute. Sends are
  driven by torch.distributed's (gloo's) own communication threads; receives
  for layer ``l + 1`` are posted before layer ``l`` starts.
- **Intra-layer eager computation.** Bins whose inputs are all owned compute
  first, while halo rows are in flight; each bin that needs halo rows waits
  only for the messages carrying its own remote inputs. The cached input
  layer drops out each halo row when the first bin that reads it runs.
- **The input layer's source rows.** A bin gathers the rows it reads (its
  own, then their in-neighbours), and neighbours shared by bins are gathered
  again by each. When the input layer only aggregates its rows before
  transforming them (GCN or GraphSAGE widening the input) and they need no
  gradient, its bins read the whole ``[owned; halo]`` table in place instead
  (counter ``bins.in_place``). When the cached input layer transforms every
  row it reads (GAT; GCN or GraphSAGE projecting first), the table is
  projected once per forward and the bins gather their rows of the
  projection (counter ``proj.table``), whose backward runs once on the sum
  of the bins' gradients.
- **Backward in reverse bins, pipelined across layers.** Layer by layer, top
  down: the bins that read halo rows first, after which each halo row's
  gradient is complete and goes back to its owner (``isend``, tag
  ``bwd.L{l}``, one message per forward message, in reverse order; only rows
  whose gradients the loss can make nonzero: ``Engine.grad_plans``); then the
  bins that read only owned rows while those gradients are in flight. The
  layer below does not wait for them all: its bins whose rows no peer read
  run their backward at once, and each other bin runs as soon as the messages
  carrying its rows' gradients are in. Parameter gradients accumulate bin by
  bin.
- **Last layer.** Its output goes to no peer, so no row cap applies: it runs
  in as few bins as the budget allows (two with the defaults here: rows
  without and with halo inputs), since smaller bins would only gather shared
  source rows again. A last layer that sums its sources (GCN's ``Â m + b``,
  GraphSAGE's neighbour mean) computes eagerly message by message instead
  (``last="sums"``, the default; :mod:`~graphwire.fullgraph.g3.sums`): the
  owned rows' terms while the halo rows are in flight, each message's as it
  is in, and in the backward each message's gradients leave as soon as they
  are computed, where a halo bin waits for nearly every message and returns
  its gradients only once its whole backward is done.
- **Layer-wise parameter synchronisation** (``sync="layer"``, G3 §6.2). As
  soon as a layer's gradients are complete they start their all-reduce (tag
  ``sync.grad.L{l}``, non-blocking), which completes once every rank has
  finished that layer, while the layers below run their backward;
  :meth:`P2PEngine.sync_gradients` collects them before the one optimizer step
  of the epoch. A layer that exchanges projected rows is complete once the
  layer below has run its bins' backward (its projection runs in those bins).
  The sums are bitwise those of one flat all-reduce (``sync="epoch"``, tag
  ``sync.grad``).

``mode`` switches parts off for G3's ablation: ``full`` (both), ``inter``
(pipelined sends, but a layer waits for all its halo rows before computing),
``intra`` (sends start when a layer starts, eager computation) and
``sequential`` (send everything, wait, compute). The backward is the same in
every mode.

- **Projected rows.** A layer that narrows its rows
  (:func:`~graphwire.nn.models.projects_first`, e.g. GCN's output layer into
  the classes) exchanges them projected: the bins of the layer before end
  with the projection, and the layer's bins run ``layer.propagate`` on
  projected rows; its backward returns the projected rows' gradients to their
  owners, whose bins of the layer below take them through the projection.

Forward bytes per layer equal ``num_halo * width * 4`` on every rank, where
``width`` is the exchanged row width: each halo row arrives exactly once.

The forward is here; the backward and the gradient sums are in
:class:`~graphwire.fullgraph.g3.backward.G3Backward`, its base class.
"""

from __future__ import annotations

import importlib
import math
from collections.abc import Sequence
from typing import Any, cast

import torch
from torch import nn

from graphwire.comm.base import PendingSum, Work
from graphwire.fullgraph.base import (
    local_message_graph,
    register,
)
from graphwire.fullgraph.g3.backward import G3Backward
from graphwire.fullgraph.g3.bins import (
    ORDERS,
    Bin,
    BinGraph,
    StackGraph,
    SumGraph,
    table_graph,
)
from graphwire.fullgraph.g3.messages import (
    plan_layers,
    plan_returns,
    send_order,
)
from graphwire.fullgraph.g3.sums import MessageSums, plan_sums
from graphwire.graph.seeds import derive_seed
from graphwire.nn.base import MessageGraph
from graphwire.nn.dropout import hashed_dropout
from graphwire.nn.models import GNN, Projecting, SumsSources, sums_sources

__all__ = ["LASTS", "MODES", "P2PEngine", "SYNCS"]

MODES = ("full", "inter", "intra", "sequential")
SYNCS = ("layer", "epoch")
LASTS = ("sums", "bins")


@register("g3")
class P2PEngine(G3Backward):
    """G3 peer-to-peer exchange in bins (see the module docstring).

    Options:
        mode: one of :data:`MODES` (default ``full``).
        bin_mb: memory budget of a bin in MiB (default 256), per layer from its
            widths (:mod:`graphwire.fullgraph.g3.bins`). G3 uses half a GPU's
            memory; on CPU the budget bounds a bin's working set.
        bin_rows: at most this many rows in a bin of a layer whose output is
            sent (G3's initial bin size, default 32768; the bins of rows
            peers need ramp up to it from ``bin_rows / RAMP``, 1024 rows):
            smaller bins start sends earlier but cost more per row (each
            bin's own products, and shared source rows gathered again). On
            the benchmark graph's 2 parts, 8192 took about 8% more CPU time
            per epoch than 32768 (the median of 10 paired runs).
        order: node order, one of :data:`~graphwire.fullgraph.g3.bins.ORDERS`
            (default ``bfs``, G3's Step 1).
        widths: each layer's ``(input, output)`` row widths, for the budget
            (``build_engine`` passes the model's); default 128 for all.
        sync: parameter synchronisation, one of :data:`SYNCS`: ``layer`` (each
            layer's gradients all-reduced as soon as its backward is done, the
            default) or ``epoch`` (one flat all-reduce after the backward).
        last: how the last layer computes: ``sums`` (summed message by
            message as its halo rows arrive; :mod:`~graphwire.fullgraph.g3.sums`),
            ``bins``, or None (the default: sums where they apply, else
            bins). Sums apply to the last of two or more layers when it sums
            its sources (GCN, GraphSAGE; not GAT's softmax), exchanges
            projected rows, and ``mode`` computes eagerly (``full``,
            ``intra``); ``sums`` where they do not is a ValueError naming
            why, at :meth:`prepare` (or the first forward).
    """

    takes_widths = True

    def __init__(
        self,
        *args: Any,
        mode: str = "full",
        bin_mb: float = 256.0,
        bin_rows: int = 32768,
        order: str = "bfs",
        widths: Sequence[tuple[int, int]] | None = None,
        sync: str = "layer",
        last: str | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(*args, **kwargs)
        if mode not in MODES:
            raise ValueError(f"g3 mode: expected one of {MODES}, got {mode!r}")
        if sync not in SYNCS:
            raise ValueError(f"g3 sync: expected one of {SYNCS}, got {sync!r}")
        if last is not None and last not in LASTS:
            raise ValueError(f"g3 last: expected one of {LASTS}, got {last!r}")
        if order not in ORDERS:
            raise ValueError(f"g3 order: expected one of {ORDERS}, got {order!r}")
        if not 0 < bin_mb < math.inf:
            raise ValueError(f"g3 bin_mb: expected a finite value > 0, got {bin_mb}")
        if bin_rows < 1:
            raise ValueError(f"g3 bin_rows: expected >= 1, got {bin_rows}")
        widths = list(widths) if widths is not None else [(128, 128)] * self.num_layers
        if len(widths) != self.num_layers:
            raise ValueError(
                f"g3 widths: expected one (input, output) pair per layer "
                f"({self.num_layers}), got {widths}"
            )
        self.mode, self.sync, self.order, self.last = mode, sync, order, last
        self.bin_mb, self.bin_rows = bin_mb, bin_rows
        # Layer-wise gradient sums in flight: (parameters, pending sum).
        self._layer_sums: list[tuple[list[torch.Tensor], PendingSum]] = []
        self._mg = local_message_graph(self.part, self.plan, self.transport, self.kind)
        self._mgs = [self._mg] * self.num_layers
        self._plan_bins(widths)
        self.counters = {"bins": sum(len(layer.bins) for layer in self.layers)}
        for index, layer in enumerate(self.layers):
            self.counters[f"bins.L{index}"] = len(layer.bins)
        self.counters["bins.in_place"] = 0  # bins run on the table (_table_bins)
        self.counters["sums.messages"] = 0  # messages summed as they came (_summed)
        self.counters["proj.table"] = 0  # tables projected once (_projected_table)
        self._sums: dict[int, MessageSums | None] = {}  # see _summed
        self._pending_recv: dict[int, dict[tuple[int, int], tuple[Work, Any]]] = {}
        self._sends: list[Work] = []
        self._halo: dict[int, torch.Tensor] = {}
        self._table_mgs: list[MessageGraph] | None = None  # see _table_bins
        self._table_ids: torch.Tensor | None = None  # their rows' original IDs
        self._x_first: torch.Tensor | None = None  # cached halo inputs, table order
        self._table: torch.Tensor | None = None
        self._begin: tuple[Any, float, int | None, bool] | None = None
        self._model_layers: list[nn.Module] = []
        # The bins' backward passes explicit gradients to autograd.backward,
        # whose first call imports this (and sympy with it: 0.2-0.5 s a rank)
        # in the middle of epoch 0 while the link idles; import it at set-up.
        importlib.import_module("torch.fx.experimental.symbolic_shapes")

    @property
    def mgs(self) -> list[MessageGraph]:
        return self._mgs

    # ------------------------------------------------------------------ setup
    def _plan_bins(self, widths: Sequence[tuple[int, int]]) -> None:
        """Every layer's bins, and the messages carrying every layer's halo
        rows (layer ``k``'s grouped by the sender's bins of layer ``k - 1``;
        the input layer's by its own bins)."""
        n = self.part.num_owned
        assert self.local_orig_nid is not None
        self.layers, self.messages = plan_layers(
            self._mg,
            self.plan,
            self.transport,
            self.local_orig_nid,
            widths=widths,
            budget_bytes=int(self.bin_mb * 2**20),
            bin_rows=self.bin_rows,
            order=self.order,
            halo_first=[self._halo_first(i) for i in range(self.num_layers)],
        )
        self._return_rows, self._return_pos = plan_returns(
            self.messages, self.grad_plans(self._mgs), self.plan, n
        )
        # Per layer k, the bins that hand on rows peers read at layer k + 1:
        # in the backward they wait for those rows' gradients to come back.
        self._returning = [
            {b for rows in self._return_rows[k + 1] for b in rows}
            for k in range(self.num_layers - 1)
        ]
        # The cached input layer drops out each halo row when the first bin
        # that reads it runs (bin -> halo positions first read there).
        self._first_read: dict[int, torch.Tensor] = {}
        # The halo positions in the order bins first read them, then any that
        # no bin reads, and each bin's span of that order: the table of an
        # input layer run in place (_table_bins) holds its halo rows in this
        # order, and a bin fills its span with one slice of the cached rows
        # kept in the same order (_fill_table_halo).
        self._first_order = torch.arange(self.plan.num_halo)
        self._first_span: dict[int, tuple[int, int]] = {}
        if self.cache_input and self.num_layers:
            seen = torch.zeros(self.plan.num_halo, dtype=torch.bool)
            order, start = [], 0
            for b, bin_ in self._bin_order(0):
                fresh = bin_.src_halo[~seen[bin_.src_halo]]
                seen[fresh] = True
                self._first_read[b] = fresh
                order.append(fresh)
                self._first_span[b] = (start, start + fresh.numel())
                start += fresh.numel()
            self._first_order = torch.cat([*order, (~seen).nonzero().view(-1)])
        # The dropped-out halo inputs of a cached input layer whose bins gather
        # their source rows (_input_halo), made the first time one does: the
        # layers that read the table in place or project it here never do.
        self._x_dropped: torch.Tensor | None = None

    # ---------------------------------------------------------------- runtime
    def prepare(self, model: nn.Module) -> None:
        """Build the plans a forward would otherwise build the first time it
        runs: the summed last layer's split of its sum (:meth:`_summed`) and
        the input layer's graphs over the table of local rows
        (:meth:`_table_bins`, as a forward whose input needs no gradient
        uses them)."""
        layers = list(cast(GNN, model).layers)
        if len(layers) != self.num_layers:
            raise ValueError(
                f"g3: the model has {len(layers)} layers, the engine was built "
                f"for {self.num_layers}"
            )
        self._table_bins(0, layers[0], (False, False))
        self._summed(self.num_layers - 1, layers[-1])

    def begin(self, model: nn.Module, dropout_seed: int | None) -> None:
        """Before each forward: learn the model's layers and how it finishes a
        layer's rows (activation, then the next layer's dropout), which the
        engine applies bin by bin."""
        p = float(getattr(model, "dropout", 0.0))
        training = bool(model.training) and p > 0.0
        if training and dropout_seed is None:
            raise ValueError(
                "g3: dropout between layers runs bin by bin and needs hashed "
                "dropout (a dropout_seed) in training"
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

    def model_hooks(self) -> dict[str, Any]:
        return {"run_layers": self.run_layers}

    def run_layers(self, h: torch.Tensor) -> torch.Tensor:
        """The whole stack on the owned input rows ``h`` (after the model's
        input dropout): one autograd node, :class:`G3Stack`."""
        if self._begin is None:
            raise RuntimeError("g3: begin(model, dropout_seed) must precede forward")
        track = torch.is_grad_enabled()
        needs_grad = track and h.requires_grad
        if needs_grad and self.cache_input:
            raise ValueError(
                "g3: cache_input keeps the halo's input rows as constants; an "
                "input that needs a gradient needs cache_input=False"
            )
        params = [
            p
            for layer in self._model_layers
            for p in layer.parameters()
            if p.requires_grad
        ]
        out: torch.Tensor = G3Stack.apply(h, self, (track, needs_grad), *params)
        return out

    def _post_recvs(
        self,
        layer: int,
        width: int,
        like: torch.Tensor,
        halo: torch.Tensor | None = None,
    ) -> None:
        """Post the receives of layer ``layer``'s halo rows (once per forward),
        to land in ``halo`` (default: a new buffer). A summed layer reads its
        messages from their receive buffers (:meth:`_forward_sums`): its halo
        buffer has no rows, and keeps only the width."""
        if layer in self._halo:
            return
        if halo is None:
            summed = self._summed(layer, self._model_layers[layer]) is not None
            rows = 0 if summed else self.plan.num_halo
            halo = like.new_empty((rows, width))
        self._halo[layer] = halo
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
                halo.index_copy_(0, recv_pos[key], buf)

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

    def _finish(
        self, index: int, out: torch.Tensor, ids: torch.Tensor
    ) -> tuple[torch.Tensor, ...]:
        """Layer ``index``'s output rows (global IDs ``ids``) as layer
        ``index + 1`` reads them: the activation, that layer's dropout, then
        its projection when it exchanges projected rows (see
        :class:`BinGraph` ``outs``)."""
        assert self._begin is not None
        activation, p, seed, training = self._begin
        h = activation(out)
        if training:
            assert seed is not None
            h = hashed_dropout(h, p, ids, derive_seed(seed, index + 1))
        following = self.exchanged_projection(index + 1, self._model_layers[index + 1])
        if following is None:
            return (h,)
        m = following.project(h)
        return (m, h) if following.reads_dst_rows else (m,)

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

    def _input_halo(self, b: int, bin_: Bin, out: torch.Tensor) -> None:
        """Put in ``out`` the cached input layer's halo rows for bin ``b``,
        after dropout: each row is dropped out once per forward, by the first
        bin that reads it."""
        _, _, training = self._dropout
        if not training:
            self.cached_input_halo(bin_.src_halo, out)
            return
        if self._x_dropped is None:
            self._x_dropped = self._x_halo.new_empty(self._x_halo.shape)
        self._fill_input_halo(b, self._x_dropped)
        torch.index_select(self._x_dropped, 0, bin_.src_halo, out=out)

    def _gather(
        self, index: int, b: int, bin_: Bin, source: torch.Tensor, cached: bool
    ) -> torch.Tensor:
        """Bin ``b``'s source rows of layer ``index``: owned rows from
        ``source``, then its halo rows, each gathered straight into its part
        of one buffer."""
        num_owned, num_halo = bin_.src_owned.numel(), bin_.src_halo.numel()
        if not num_halo:
            return source.index_select(0, bin_.src_owned)
        h_src = source.new_empty((num_owned + num_halo, *source.shape[1:]))
        torch.index_select(source, 0, bin_.src_owned, out=h_src[:num_owned])
        if cached:
            self._input_halo(b, bin_, h_src[num_owned:])
        else:
            halo = self._halo[index]
            torch.index_select(halo, 0, bin_.src_halo, out=h_src[num_owned:])
        return h_src

    def _fill_input_halo(self, b: int, halo: torch.Tensor) -> None:
        """Put in ``halo`` (in halo positions) the cached input rows bin ``b``
        reads first."""
        fresh = self._first_read[b]
        if fresh.numel():
            halo.index_copy_(0, fresh, self.cached_input_halo(fresh))

    def _fill_table_halo(self, b: int, halo: torch.Tensor) -> None:
        """Put in ``halo`` (the table's halo rows, in first-read order) the
        cached input rows bin ``b`` reads first, after the model's input
        dropout: one slice of a copy of the cached rows kept in that order,
        dropped out straight into the table, instead of a gather of them and a
        scatter into the table."""
        start, end = self._first_span[b]
        if start == end:
            return
        assert self._x_first is not None and self._table_ids is not None
        ids = self._table_ids[self.part.num_owned :]
        self.drop_input_rows(self._x_first[start:end], ids[start:end], halo[start:end])

    def _table_bins(
        self, index: int, layer: nn.Module, grads: tuple[bool, bool]
    ) -> list[MessageGraph] | None:
        """The input layer's bins as MessageGraphs over the whole table of
        local rows (:func:`~graphwire.fullgraph.g3.bins.table_graph`), when
        the layer only aggregates its source rows
        (``transforms_sources`` false) and they need no gradient; else None.
        Its bins then read the table as it is, with no per-bin gather of
        source rows (which repeat from bin to bin). The table is one buffer,
        rewritten by every forward: such a layer's backward keeps no source
        row (autograd would refuse the rewritten buffer if it did)."""
        if index or grads[0] or getattr(layer, "transforms_sources", True):
            return None
        if self.exchanged_projection(index, layer) is not None:
            return None
        if self._table_mgs is None:
            n, num_halo = self.part.num_owned, self.plan.num_halo
            assert self.local_orig_nid is not None
            slots, ids = None, self.local_orig_nid
            if self.cache_input:  # halo rows in first-read order (_fill_table_halo)
                order = self._first_order
                slots = torch.empty_like(order)
                slots[order] = torch.arange(order.numel())
                ids = torch.cat([ids[:n], ids[n:][order]])
                self._x_first = self._x_halo[order]
            bins = self.layers[index].bins
            self._table_mgs = [table_graph(b, n, num_halo, slots) for b in bins]
            self._table_ids = ids
        return self._table_mgs

    def _forward_stack(
        self, h0: torch.Tensor, track: bool, needs_grad: bool
    ) -> tuple[torch.Tensor, StackGraph | None]:
        """Every layer in bins (:meth:`_forward_layer`); returns the last
        layer's owned rows and, when ``track``, the graphs for
        :meth:`_backward_stack`."""
        h0 = h0.detach().requires_grad_(needs_grad)
        source, dst_rows, projection = h0.detach(), None, None
        # Layer 0 reads projected rows when it exchanges them (the owned rows
        # projected here) or when it projects its table here (the owned and
        # the cached halo rows, once; the bins gather their rows of it).
        here = self._projected_table(0, self._model_layers[0])
        first = self.exchanged_projection(0, self._model_layers[0])
        if first is None:
            first = here
        if first is not None:
            rows = h0
            if here is not None:
                rows = torch.cat([h0, self.cached_input_halo()])
                self.counters["proj.table"] += 1
            with torch.set_grad_enabled(track):
                projection = first.project(rows)
            source = projection.detach()
            dst_rows = h0.detach() if first.reads_dst_rows else None
        layers: list[list[BinGraph] | SumGraph] = []
        for index in range(self.num_layers):
            grads = (track and index > 0, track and index > 0)
            if index == 0:
                grads = (needs_grad or first is not None, needs_grad)
            source, dst_rows, graphs = self._forward_layer(
                index, source, dst_rows, track, grads
            )
            layers.append(graphs)
        if not track:
            return source, None
        return source, StackGraph(layers, h0, projection, here is not None)

    def _projected_table(self, index: int, layer: nn.Module) -> Projecting | None:
        """``layer`` when layer ``index`` is the cached input layer and
        transforms every source row it reads with a row-wise projection
        (GAT's ``lin``; GCN and GraphSAGE projecting first): the owned and
        halo rows are then projected once per forward, and each bin gathers
        its rows of that table and runs ``propagate``, instead of projecting
        its own source rows, which repeat from bin to bin. Else None."""
        if index or not self.cache_input:
            return None
        if not getattr(layer, "transforms_sources", False):
            return None  # aggregates first: _table_bins
        if not (hasattr(layer, "project") and hasattr(layer, "propagate")):
            return None
        return cast(Projecting, layer)

    def _forward_layer(
        self,
        index: int,
        source: torch.Tensor,
        dst_rows: torch.Tensor | None,
        track: bool,
        grads: tuple[bool, bool],
    ) -> tuple[torch.Tensor, torch.Tensor | None, list[BinGraph] | SumGraph]:
        """Layer ``index`` in bins; the sends of the next layer's rows overlap.

        ``source`` holds the owned rows the bins read as sources (projected
        when the layer exchanges projected rows), ``dst_rows`` the owned input
        rows when its ``propagate`` reads them; with ``track`` the bins keep
        their graphs, and ``grads`` says whether the source and destination
        leaves need gradients. Each bin's output is
        finished for the next layer (:meth:`_finish`) inside its graph, and
        the rows peers need leave as soon as the bin is done.

        Returns the next layer's ``source`` and ``dst_rows`` (the last layer:
        its output rows and None) and, with ``track``, the bins' graphs.
        """
        layer = self._model_layers[index]
        last = index == self.num_layers - 1
        pipelined = self.mode in ("full", "inter")
        eager = self.mode in ("full", "intra")
        projected = self.exchanged_projection(index, layer)
        cached = index == 0 and self.cache_input
        n = self.part.num_owned
        here = self._projected_table(index, layer)
        if here is not None:  # source: the projected table (_forward_stack)
            projected = here
            self._halo[index] = source[n:]
        table_mgs = self._table_bins(index, layer, grads)
        table = None
        if table_mgs is not None:  # the bins read [owned; halo] in place
            shape = (n + self.plan.num_halo, source.shape[1])
            if self._table is None or self._table.shape != shape:
                self._table = source.new_empty(shape)
            table = self._table
            table[:n] = source
        if not cached:
            halo = table[n:] if table is not None else None
            self._post_recvs(index, source.shape[1], source, halo)
            if index == 0 or not pipelined:
                self._send_all(index, source)
            if not eager:
                self._wait(index, None)
        sums = self._summed(index, layer)
        if sums is not None:
            out, summed = self._forward_sums(
                index, sums, layer, source, dst_rows, track
            )
            return out, None, summed if summed is not None else []
        send_next = pipelined and not last
        graphs: list[BinGraph] = []
        out_src: torch.Tensor | None = None
        out_dst: torch.Tensor | None = None
        for b, bin_ in self._bin_order(index):
            if eager and bin_.needs:
                self._wait(index, bin_.needs)
            assert bin_.src_ids is not None
            mg, src_ids = bin_.mg, bin_.src_ids
            if table is not None:
                assert table_mgs is not None and self._table_ids is not None
                if cached:
                    self._fill_table_halo(b, table[n:])
                h_src, mg, src_ids = table, table_mgs[b], self._table_ids
                self.counters["bins.in_place"] += 1
            else:
                h_src = self._gather(index, b, bin_, source, here is None and cached)
            with torch.set_grad_enabled(track):
                h_src = h_src.requires_grad_(track and grads[0])
                h_dst = None
                if projected is None:
                    out = self.call_layer(index, layer, mg, h_src, src_ids)
                else:
                    if projected.reads_dst_rows:
                        assert dst_rows is not None
                        h_dst = dst_rows.index_select(0, bin_.rows)
                        h_dst.requires_grad_(track and grads[1])
                    out = self.call_propagate(
                        index, projected, bin_.mg, h_src, h_dst, bin_.src_ids
                    )
                ids = bin_.src_ids[: bin_.rows.numel()]  # the bin's own rows
                outs = (out,) if last else self._finish(index, out, ids)
            if track:
                graphs.append(BinGraph(b, bin_, h_src, h_dst, outs))
            if out_src is None:
                out_src = outs[0].new_empty((n, outs[0].shape[1]))
                if len(outs) > 1:
                    out_dst = outs[1].new_empty((n, outs[1].shape[1]))
            out_src.index_copy_(0, bin_.rows, outs[0].detach())
            if out_dst is not None:
                out_dst.index_copy_(0, bin_.rows, outs[1].detach())
            if send_next:
                self._post_recvs(index + 1, outs[0].shape[1], outs[0])
                if b in self.messages[index + 1].bins_sent:
                    self._send_bin(index + 1, b, outs[0].detach())
        self._wait(index, None)
        if last or not pipelined:
            # Pipelined sends of the next layer's rows stay in flight while it
            # computes; every send is complete before the forward returns.
            self.timed(self._drain_sends)
        if out_src is None:  # a part without rows: what the layer would hand on
            width = int(getattr(layer, "output_width", getattr(layer, "out_dim", 0)))
            projection = None
            if not last:
                following = self._model_layers[index + 1]
                projection = self.exchanged_projection(index + 1, following)
            if projection is not None:
                if projection.reads_dst_rows:
                    out_dst = source.new_zeros((0, width))
                width = int(cast(Any, projection).message_width)
            out_src = source.new_zeros((0, width))
        return out_src, out_dst, graphs

    def _summed(self, index: int, layer: nn.Module) -> MessageSums | None:
        """Layer ``index``'s sum split message by message
        (:mod:`~graphwire.fullgraph.g3.sums`) when it is the last layer (the
        ones below hand their rows on bin by bin) and sums apply to it
        (:meth:`_sums_left_out`) unless ``last`` is ``bins``; else None
        (bins).

        Raises:
            ValueError: ``last`` is ``sums`` and they do not apply.
        """
        if index not in self._sums:
            plan = None
            if index == self.num_layers - 1 and self.last != "bins":
                why = self._sums_left_out(index, layer)
                if why and self.last == "sums":
                    raise ValueError(
                        f"g3 last='sums' (--g3-last sums): {why}; leave it "
                        "unset for sums where they apply, or ask for bins"
                    )
                if why is None:
                    summing = sums_sources(layer)
                    assert summing is not None  # (_sums_left_out)
                    mg = self._mgs[index]
                    weight = summing.edge_weights(mg)
                    messages = self.messages[index]
                    plan = plan_sums(mg, weight, messages, self._return_pos[index])
            self._sums[index] = plan
        return self._sums[index]

    def _sums_left_out(self, index: int, layer: nn.Module) -> str | None:
        """Why the last layer ``index`` cannot be summed message by message,
        or None when it can: it must lie above the input layer (whose halo
        rows may be cached, and whose backward :meth:`_backward_stack`
        finishes itself), sum its sources and exchange them projected
        (:func:`~graphwire.nn.models.sums_sources`), and compute eagerly."""
        name = type(layer).__name__
        if index == 0:
            return "a one-layer model's last layer is its input layer"
        if not getattr(layer, "sums_sources", False):
            return (
                f"the last layer ({name}) does not sum its sources (GCN and "
                "GraphSAGE do; GAT's softmax needs every source row first)"
            )
        if self.exchanged_projection(index, layer) is None:
            return (
                f"the last layer ({name}) does not exchange projected rows "
                "(its output is no narrower than its input)"
            )
        if self.mode not in ("full", "intra"):
            return f"mode {self.mode!r} computes no layer eagerly"
        return None

    def _forward_sums(
        self,
        index: int,
        sums: MessageSums,
        layer: nn.Module,
        source: torch.Tensor,
        dst_rows: torch.Tensor | None,
        track: bool,
    ) -> tuple[torch.Tensor, SumGraph | None]:
        """Layer ``index`` summed message by message: the owned source rows'
        terms while the halo rows are in flight, then each message's, straight
        from its receive buffer, as it is in (in send order); then the
        layer's ``finish`` (with ``dst_rows``, the owned input rows, when it
        reads them). Returns its output rows and, with ``track``, the graph
        for :meth:`_walk_sums`."""
        sums = sums.matrices(source.dtype)
        agg = sums.sum_owned(source)
        pending = self._pending_recv.pop(index, {})
        for key in self.messages[index].keys:
            if key in pending:
                work, rows = pending.pop(key)
                self.timed(work.wait)
                sums.add_message(agg, key, rows)
                self.counters["sums.messages"] += 1
        self.timed(self._drain_sends)
        summing = cast(SumsSources, layer)
        h_dst = None
        if summing.reads_dst_rows:
            assert dst_rows is not None
            h_dst = dst_rows.requires_grad_(track)  # its own buffer: a leaf
        with torch.set_grad_enabled(track):
            out = summing.finish(agg.requires_grad_(track), h_dst)
        # The stack's output is a tensor of its own: G3Stack's node becomes
        # its grad_fn, and the backward runs finish's graph through ``out``.
        return out.detach(), SumGraph(agg, h_dst, out) if track else None


class G3Stack(torch.autograd.Function):
    """``h_owned -> the last layer's owned rows``: the whole stack in G3's bins.

    Forward runs :meth:`P2PEngine._forward_stack` (halo rows arrive through
    the engine's messages; each bin's autograd graph starts from its own
    source rows and ends at what it hands on). Backward runs
    :meth:`P2PEngine._backward_stack`. The parameters are inputs only so that
    the output requires grad; their gradients accumulate through the bins'
    graphs.
    """

    @staticmethod
    def forward(  # type: ignore[override]
        ctx: Any,
        h: torch.Tensor,
        engine: P2PEngine,
        flags: tuple[bool, bool],
        *params: torch.Tensor,
    ) -> torch.Tensor:
        out, graph = engine._forward_stack(h, *flags)
        ctx.engine, ctx.graph, ctx.num_params = engine, graph, len(params)
        return out

    @staticmethod
    def backward(  # type: ignore[override]
        ctx: Any, grad_out: torch.Tensor
    ) -> tuple[torch.Tensor | None, ...]:
        engine: P2PEngine = ctx.engine
        graph, ctx.graph = ctx.graph, None  # free the bins' graphs after use
        if graph is None:
            raise RuntimeError("g3: backward through a forward run without grad")
        engine.check_output_grad(grad_out)
        grad = engine._backward_stack(
            graph, grad_out.contiguous(), ctx.needs_input_grad[0]
        )
        return (grad, None, None, *([None] * ctx.num_params))
