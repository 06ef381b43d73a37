"""`G3Engine` (``--exchange g3``): G3's hybrid-parallel peer-to-peer exchange.

G3 (Wan et al., "Scaling Graph Neural Network Training with Hybrid
Parallelism") sends each boundary row once to each peer that needs it and hides
the transfer behind computation:

- **One autograd node for the whole stack**
  (:class:`~graphwire.fullgraph.g3.stack.G3Stack`, through the model's
  ``run_layers`` hook). The engine applies the model's activation and hashed
  dropout between layers itself, bin by bin, so that a bin's graph runs from
  its source rows to what it hands on (the next layer's rows, projected when
  that layer exchanges projected rows) and the backward can pipeline across
  layers.
- **Bins** (:mod:`graphwire.fullgraph.g3.bins`). A rank computes its owned
  rows of a layer in bins: in BFS order with the rows that have remote
  neighbours first (G3's Step 1; ``order="priority"``: most-needed rows
  first), each bin as many rows as the layer's memory budget allows
  (``bin_mb``, from the layer's input and output widths), at most
  ``bin_rows`` in a layer whose output is sent (the first bins of rows peers
  need start smaller and double up to it).
- **Inter-layer pipelining.** As soon as a bin of layer ``l`` is computed and
  finished for layer ``l + 1``, the rows of it that peers need are sent with
  ``isend``, one message per (bin, peer), while later bins compute
  (:mod:`graphwire.fullgraph.g3.messages`, :mod:`graphwire.fullgraph.g3.wire`).
  Sends are driven by torch.distributed's (gloo's) own communication
  threads; receives for layer ``l + 1`` are posted before layer ``l`` starts.
- **Intra-layer eager computation.** Bins whose inputs are all owned compute
  first, while halo rows are in flight; each bin that needs halo rows waits
  only for the messages carrying its own remote inputs. The cached input
  layer drops out each halo row when the first bin that reads it runs.
- **The input layer's source rows** (:mod:`graphwire.fullgraph.g3.table`). A
  bin gathers the rows it reads (its own, then their in-neighbours), and
  neighbours shared by bins are gathered again by each. When the input layer
  only aggregates its rows before transforming them (GCN or GraphSAGE
  widening the input) and they need no gradient, its bins read the whole
  ``[owned; halo]`` table in place instead (counter ``bins.in_place``). When
  the cached input layer transforms every row it reads (GAT; GCN or
  GraphSAGE projecting first), the table is projected once per forward and
  the bins gather their rows of the projection (counter ``proj.table``),
  whose backward runs once on the sum of the bins' gradients.
- **Backward in reverse bins, pipelined across layers**
  (:mod:`graphwire.fullgraph.g3.backward`). Layer by layer, top down: the
  bins that read halo rows first, after which each halo row's gradient is
  complete and goes back to its owner (``isend``, tag ``bwd.L{l}``, one
  message per forward message, in reverse order; only rows whose gradients
  the loss can make nonzero: ``Engine.grad_plans``); then the bins that read
  only owned rows while those gradients are in flight. The layer below does
  not wait for them all: its bins whose rows no peer read run their backward
  at once, and each other bin runs as soon as the messages carrying its
  rows' gradients are in. Parameter gradients accumulate bin by bin.
- **Last layer.** Its output goes to no peer, so no row cap applies: it runs
  in as few bins as the budget allows (two with the defaults here: rows
  without and with halo inputs), since smaller bins would only gather shared
  source rows again. A last layer that sums its sources (GCN's ``Â m + b``,
  GraphSAGE's neighbour mean) computes eagerly message by message instead
  (``last="sums"``, the default where they apply;
  :mod:`graphwire.fullgraph.g3.sums`): the owned rows' terms while the halo
  rows are in flight, each message's as it is in, and in the backward each
  message's gradients leave as soon as they are computed, where a halo bin
  waits for nearly every message and returns its gradients only once its
  whole backward is done.
- **Layer-wise parameter synchronisation** (``sync="layer"``, G3 §6.2;
  :mod:`graphwire.fullgraph.g3.sync`). As soon as a layer's gradients are
  complete they start their all-reduce (tag ``sync.grad.L{l}``,
  non-blocking), which completes once every rank has finished that layer,
  while the layers below run their backward;
  :meth:`G3Engine.sync_gradients` collects them before the one optimizer
  step of the epoch. A layer that exchanges projected rows is complete once
  the layer below has run its bins' backward (its projection runs in those
  bins). The sums are bitwise those of one flat all-reduce (``sync="epoch"``,
  tag ``sync.grad``).
- **Projected rows.** A layer that narrows its rows
  (:func:`~graphwire.nn.models.projects_first`, e.g. GCN's output layer into
  the classes) exchanges them projected: the bins of the layer before end
  with the projection, and the layer's bins run ``layer.propagate`` on
  projected rows; its backward returns the projected rows' gradients to their
  owners, whose bins of the layer below take them through the projection.

- **Bounded staleness** (``--staleness``, SANCUS's bounds on G3's messages;
  :mod:`graphwire.fullgraph.g3.stale`). A sender skips a message while its
  rows are within the bound and the peer reads the copy it cached; ``gap``
  is decided one epoch ahead (tag ``flags``). Gradients are never skipped.

``mode`` switches the two overlaps off for G3's ablation
(:mod:`graphwire.fullgraph.g3.schedule`): ``full`` (both), ``inter``
(pipelined sends, but a layer waits for all its halo rows before computing),
``intra`` (sends start when a layer starts, eager computation) and
``sequential`` (send everything, wait, compute). The backward is the same in
every mode. All settings: :class:`~graphwire.fullgraph.g3.config.G3Config`.

Forward bytes per layer equal ``num_halo * width * 4`` on every rank, where
``width`` is the exchanged row width: each halo row arrives exactly once
(less the rows of skipped messages under ``--staleness``).
"""

from __future__ import annotations

import importlib
from collections.abc import Sequence
from functools import partial
from typing import Any, cast

import torch
from torch import nn

from graphwire.fullgraph.base import Engine
from graphwire.fullgraph.g3.backward import G3Backward
from graphwire.fullgraph.g3.bins import Bin
from graphwire.fullgraph.g3.config import G3Config
from graphwire.fullgraph.g3.forward import G3Forward
from graphwire.fullgraph.g3.messages import plan_layers, send_order
from graphwire.fullgraph.g3.schedule import SCHEDULES
from graphwire.fullgraph.g3.stack import G3Stack
from graphwire.fullgraph.g3.stale import StaleMessages
from graphwire.fullgraph.g3.sums import MessageSums, plan_sums, sums_left_out
from graphwire.fullgraph.g3.sync import GRADIENT_SYNCS
from graphwire.fullgraph.g3.table import InputTable
from graphwire.fullgraph.g3.wire import Wire
from graphwire.nn.base import MessageGraph
from graphwire.nn.models import GNN, sums_sources
from graphwire.run.local_graph import local_message_graph

__all__ = ["G3Engine"]


class G3Engine(Engine):
    """G3 peer-to-peer exchange in bins (see the module docstring).

    Args:
        *args: the base :class:`~graphwire.fullgraph.base.Engine`'s ``part``,
            ``transport``, ``kind`` and ``num_layers``.
        widths: each layer's ``(input, output)`` row widths, for the bins'
            budget (``build_engine`` passes the model's); default 128 for all.
        **options: the base Engine's ``config`` (a :class:`G3Config`; None:
            the defaults), ``cache_input`` and ``loss_rows``.

    Attributes:
        config: the settings.
        layers: every layer's bins, input layer first.
        messages: how every layer's halo rows travel, input layer first.
        schedule: when rows are sent and bins compute (from ``config.mode``).
        wire: the messages in flight.
        table: the input layer's table of local rows.
        forward: the forward
            (:class:`~graphwire.fullgraph.g3.forward.G3Forward`).
        backward: the backward
            (:class:`~graphwire.fullgraph.g3.backward.G3Backward`).
        grad_sync: the parameter synchronisation (from ``config.sync``).
        stale: the messages' staleness (None with ``staleness="none"``).
        model_layers: the model's layers (:meth:`begin`).
        sums: the layers planned so far (:meth:`prepare` or the first
            forward): layer -> its sum split message by message (the last
            layer, where sums apply), or None (bins).
        counters: ``bins`` and ``bins.L{l}`` (bins per layer), and counts
            since set-up: ``bins.in_place`` (bins run on the input table in
            place), ``sums.messages`` (messages summed as they came),
            ``proj.table`` (input tables projected once).
    """

    takes_widths = True
    config_type = G3Config
    config: G3Config

    def __init__(
        self,
        *args: Any,
        widths: Sequence[tuple[int, int]] | None = None,
        **options: Any,
    ) -> None:
        super().__init__(*args, **options)
        config = self.config
        widths = list(widths) if widths is not None else [(128, 128)] * self.num_layers
        if len(widths) != self.num_layers:
            raise ValueError(
                f"g3 widths: expected one (input, output) pair per layer "
                f"({self.num_layers}), got {widths}"
            )
        self.schedule = SCHEDULES[config.mode]
        self.grad_sync = GRADIENT_SYNCS[config.sync](self.transport)
        self._mg = local_message_graph(self.part, self.plan, self.transport, self.kind)
        self._mgs = [self._mg] * self.num_layers
        assert self.local_orig_nid is not None
        # Collective: every layer's bins, and the messages carrying its halo
        # rows (layer k's grouped by the sender's bins of layer k - 1; the
        # input layer's by its own bins); then what the backward returns.
        self.layers, self.messages = plan_layers(
            self._mg,
            self.plan,
            self.transport,
            self.local_orig_nid,
            widths=widths,
            budget_bytes=int(config.bin_mb * 2**20),
            bin_rows=config.bin_rows,
            order=config.order,
            halo_first=[self._halo_first(i) for i in range(self.num_layers)],
        )
        self.backward = G3Backward(self, self.grad_plans(self._mgs))
        self.forward = G3Forward(self)
        self.stale = self._stale_messages()
        self.wire = Wire(self, self.messages, self._halo_rows, self.stale)
        self.table = InputTable(
            self.layers[0].bins if self.num_layers else [],
            order=[b for b, _ in self.bin_order(0)] if self.num_layers else [],
            num_owned=self.part.num_owned,
            ids=self.local_orig_nid,
            x_halo=self._x_halo if self.cache_input else None,
            cached_rows=self.cached_input_halo,
            drop_rows=self.drop_input_rows,
            dropping=lambda: self._dropout[2],
        )
        self.sums: dict[int, MessageSums | None] = {}  # see summed()
        self.model_layers: list[nn.Module] = []
        self.counters = {"bins": sum(len(layer.bins) for layer in self.layers)}
        for index, layer in enumerate(self.layers):
            self.counters[f"bins.L{index}"] = len(layer.bins)
        self.counters |= {"bins.in_place": 0, "sums.messages": 0, "proj.table": 0}
        # The bins' backward passes explicit gradients to autograd.backward,
        # whose first call imports this (and sympy with it) in the middle of
        # epoch 0 while the link idles; import it at set-up.
        importlib.import_module("torch.fx.experimental.symbolic_shapes")

    @property
    def mgs(self) -> list[MessageGraph]:
        return self._mgs

    # ---------------------------------------------------------------- runtime
    def prepare(self, model: nn.Module) -> None:
        """Build the plans a forward would otherwise build the first time it
        runs: the summed last layer's split of its sum (:meth:`summed`) and
        the input layer's graphs over the table of local rows (as a forward
        whose input needs no gradient uses them)."""
        layers = list(cast(GNN, model).layers)
        if len(layers) != self.num_layers:
            raise ValueError(
                f"g3: the model has {len(layers)} layers, the engine was built "
                f"for {self.num_layers}"
            )
        self.table_graphs(0, layers[0], False)
        self.summed(self.num_layers - 1, layers[-1])

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
        if self.grad_sync.pending:
            raise RuntimeError(
                "g3: the last backward's gradients were never collected "
                "(call engine.sync_gradients(model) after each backward)"
            )
        super().begin(model, dropout_seed)
        gnn = cast(GNN, model)
        self.forward.begin(gnn.activation, p, dropout_seed, training)
        self.model_layers = list(gnn.layers)
        self.wire.reset()
        if self.stale is not None:  # evaluation sends everything
            self.stale.training = self.phase == "" and self._training

    def model_hooks(self) -> dict[str, Any]:
        return {"run_layers": self.run_layers}

    def run_layers(self, h: torch.Tensor) -> torch.Tensor:
        """The whole stack on the owned input rows ``h`` (after the model's
        input dropout): one autograd node
        (:class:`~graphwire.fullgraph.g3.stack.G3Stack`)."""
        if not self.forward.begun:
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
            for layer in self.model_layers
            for p in layer.parameters()
            if p.requires_grad
        ]
        out: torch.Tensor = G3Stack.apply(h, self, (track, needs_grad), *params)
        return out

    def sync_gradients(self, model: nn.Module) -> None:
        """After the backward: every gradient summed over ranks, layer by
        layer as the backward went or in one flat all-reduce
        (:mod:`~graphwire.fullgraph.g3.sync`)."""
        self.grad_sync.collect(model)

    # ----------------------------------------------------------- staleness
    def _stale_messages(self) -> StaleMessages | None:
        """Collective when the bound skips: every rank's halo size (for the
        report's cache sizes)."""
        spec, transport = self.config.spec, self.transport
        if not spec.skips:
            return None
        halo_sizes = transport.all_gather_object(self.part.num_halo, "setup.plan")
        return StaleMessages(
            spec,
            self.config.staleness_norm,
            self.messages,
            rank=transport.rank,
            world_size=transport.world_size,
            first=1 if self.cache_input else 0,
            halo_sizes=halo_sizes,
        )

    def begin_epoch(self, epoch: int) -> None:
        if self.stale is not None:
            self.stale.begin_epoch(epoch)

    def end_epoch(self) -> dict[str, Any]:
        """The epoch's staleness report
        (:meth:`~graphwire.fullgraph.g3.stale.StaleMessages.report`);
        ``gap``'s flags for the next epoch go out here."""
        stale = self.stale
        if stale is None:
            return {}
        return {"staleness": self.timed(partial(stale.end_epoch, self.transport))}

    def state_dict(self) -> dict[str, Any]:
        return {} if self.stale is None else {"stale": self.stale.state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if self.stale is not None:
            self.stale.load_state_dict(state["stale"])

    # ------------------------------------------------------------------ plans
    def _halo_first(self, index: int) -> bool:
        """Whether layer ``index`` computes its bins with halo inputs first.

        A layer whose halo rows are already here (the cached input layer)
        computes the rows peers need first, so their sends start early; any
        other layer computes the bins that need no halo rows first, while the
        halo rows are in flight (eager computation).
        """
        return index == 0 and self.cache_input

    def bin_order(self, index: int) -> list[tuple[int, Bin]]:
        """The bins of layer ``index`` in forward order, with their indices."""
        layer = self.layers[index]
        order = send_order(len(layer.bins), layer.num_local, self._halo_first(index))
        return [(b, layer.bins[b]) for b in order]

    def table_graphs(
        self, index: int, layer: nn.Module, reads_grad: bool
    ) -> list[MessageGraph] | None:
        """Layer ``index``'s bins over the input table
        (:meth:`~graphwire.fullgraph.g3.table.InputTable.graphs`) when it is
        the input layer, its source rows need no gradient (``reads_grad``
        false) and are not exchanged projected; else None."""
        if index or reads_grad or self.exchanged_projection(0, layer) is not None:
            return None
        return self.table.graphs(layer)

    def _halo_rows(self, index: int) -> int:
        """Rows of layer ``index``'s halo buffer: none for a summed layer,
        which reads its messages from their receive buffers."""
        summed = self.summed(index, self.model_layers[index]) is not None
        return 0 if summed else self.plan.num_halo

    def summed(self, index: int, layer: nn.Module) -> MessageSums | None:
        """Layer ``index``'s sum split message by message
        (:mod:`~graphwire.fullgraph.g3.sums`, planned once) when it is the
        last layer (the ones below hand their rows on bin by bin) and sums
        apply to it (:func:`~graphwire.fullgraph.g3.sums.sums_left_out`)
        unless ``last`` is ``bins``; else None (bins).

        Raises:
            ValueError: ``last`` is ``sums`` and they do not apply.
        """
        if index not in self.sums:
            plan = None
            last = self.config.last
            if index == self.num_layers - 1 and last != "bins":
                projected = self.exchanged_projection(index, layer) is not None
                eager = self.schedule.bins.eager
                why = sums_left_out(index, layer, projected, self.config.mode, eager)
                if why and last == "sums":
                    raise ValueError(
                        f"g3 last='sums' (--g3-last sums): {why}; leave it "
                        "unset for sums where they apply, or ask for bins"
                    )
                if why is None:
                    summing = sums_sources(layer)
                    assert summing is not None  # (sums_left_out)
                    mg = self._mgs[index]
                    weight = summing.edge_weights(mg)
                    returned = self.backward.return_pos[index]
                    plan = plan_sums(mg, weight, self.messages[index], returned)
            self.sums[index] = plan
        return self.sums[index]
