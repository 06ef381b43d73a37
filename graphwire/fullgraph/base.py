"""`Engine`: how one rank runs a layer of distributed full-graph training.

Every rank owns the nodes of its part and computes their rows at every layer;
an engine decides how the rows of neighbours owned elsewhere get there. It
gives the model three things:

- ``mgs``: one :class:`~graphwire.nn.base.MessageGraph` per layer whose
  destinations are the rows this rank computes at that layer;
- ``x`` and ``row_ids``: the input rows and the global (original) node ID of
  each row, for hashed dropout;
- ``run_layer(l, layer, mg, h)``: runs layer ``l`` on ``h``, the rows this rank
  holds, bringing in remote rows as the engine sees fit. Remote rows enter
  through :class:`torch.autograd.Function` s whose backward sends gradients back
  to the owners along the same plan, so GCN, GraphSAGE and GAT layers run
  unchanged on every engine. An engine calls each layer through
  :meth:`Engine.call_layer` with the original ID of every source row, so GAT's
  hashed attention dropout draws the single-process mask. An engine that
  pipelines across layers (G3) runs the whole stack instead, through the
  model's ``run_layers`` hook (:meth:`Engine.model_hooks`).

Engines are registered by name with their config in
:data:`~graphwire.fullgraph.engines.EXCHANGES` (``--exchange NAME``).
"""

from __future__ import annotations

import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from typing import Any, TypeVar, cast

import torch
from torch import nn

from graphwire.comm.base import Transport
from graphwire.comm.plan import ExchangePlan
from graphwire.graph.seeds import derive_seed
from graphwire.nn.base import MessageGraph
from graphwire.nn.dropout import hashed_dropout
from graphwire.nn.models import LayerKind, Projecting, layer_call_kwargs, projecting
from graphwire.partition.local import LocalPart
from graphwire.run.collective import sync_gradients

__all__ = ["Engine"]


class Engine(ABC):
    """One rank's part of a distributed full-graph model.

    Args:
        part: this rank's part (``part.part_id == transport.rank``).
        transport: how ranks talk.
        kind: the layer kind (which graph it aggregates over).
        num_layers: layers of the model.
        config: the engine's settings, an instance of its ``config_type``
            (None: the defaults).
        cache_input: fetch the halo's input rows once at set-up instead of
            every epoch (they never change).
        loss_rows: int64 owned rows whose outputs the loss reads (None: any
            row may be read). Every other output row's gradient is zero, and
            so is that of any halo row that only such rows read in the output
            layer: the backward returns only the gradients of the output
            layer's halo rows a loss row reads, and in the layers below only
            those whose gradients can be nonzero (:meth:`grad_plans`); it
            checks that the output's zeros are zeros (:meth:`check_output_grad`).
    Attributes:
        config: the settings.
        plan: the exchange plan of the part's halo.
        comm_s: seconds spent in communication calls since the last reset.
        counters: engine-specific counts (rows recomputed, bins, ...).
        local_orig_nid: int64 [num_local], the original node ID of every local
            row, owned rows then halo rows (hashed dropout keys); ``None`` for
            engines with ``fetches_halo_ids = False``.
    """

    name = "engine"
    # The engine's settings: a dataclass of option fields (registered with it).
    config_type: type = type(None)
    # The models (``--model``) the engine can train; None: every model.
    models: tuple[str, ...] | None = None
    # Whether the engine takes ``widths``, each layer's (input, output) row
    # widths, as an option (``build_engine`` passes the model's).
    takes_widths = False
    # Fetch the halo's original IDs at set-up (tag ``setup.input``). Engines
    # that hold no halo in the part's local numbering (replicate) opt out.
    fetches_halo_ids = True

    def __init__(
        self,
        part: LocalPart,
        transport: Transport,
        kind: LayerKind,
        num_layers: int,
        *,
        config: Any = None,
        cache_input: bool = True,
        loss_rows: torch.Tensor | None = None,
    ) -> None:
        if config is None:
            config = self.config_type()
        elif not isinstance(config, self.config_type):
            raise TypeError(
                f"{type(self).__name__}: expected a {self.config_type.__name__}, "
                f"got {config!r}"
            )
        self.config = config
        self.cache_input = cache_input
        self._outside_loss: torch.Tensor | None = None
        if loss_rows is not None:
            self._outside_loss = torch.ones(part.num_owned, dtype=torch.bool)
            self._outside_loss[loss_rows.to(torch.int64)] = False
        self.part = part
        self.transport = transport
        self.kind = kind
        self.num_layers = num_layers
        self.comm_s = 0.0
        self.phase = ""  # tag prefix: "" while training, "eval." in evaluation
        self.counters: dict[str, int] = {}
        self.plan = ExchangePlan.build(part, transport)
        self._dropout: tuple[float, int | None, bool] = (0.0, None, False)
        self._training = False
        self.local_orig_nid: torch.Tensor | None = None
        if cache_input:
            # Input features never change: fetch the halo's rows once instead
            # of every epoch.
            assert part.x is not None
            self._x_halo = plan_rows(self.plan, part.x, transport, "setup.input")
        if cache_input or self.fetches_halo_ids:
            # The halo's original IDs key hashed dropout (cached input rows,
            # GAT attention): fetched once, 8 bytes per halo row.
            owned = part.orig_nid.to(torch.int64)
            halo = plan_rows(self.plan, owned, transport, "setup.input")
            self.local_orig_nid = torch.cat([owned, halo])

    # ---------------------------------------------------------------- model
    @property
    @abstractmethod
    def mgs(self) -> list[MessageGraph]:
        """One message graph per layer, input layer first."""

    @property
    def x(self) -> torch.Tensor:
        """float32 [rows, F]: the input rows of layer 0 held by this rank."""
        assert self.part.x is not None
        return self.part.x

    @property
    def row_ids(self) -> torch.Tensor:
        """int64 [rows]: original global node ID of every row of ``x``."""
        return self.part.orig_nid

    def prepare(self, model: nn.Module) -> None:
        """Called once in set-up with the model, before the first forward.

        Build what depends on its layers and does not change between epochs
        (default: nothing), so that epoch 0 times training, not planning."""
        del model  # halo and replicate plan everything from the part alone

    def begin(self, model: nn.Module, dropout_seed: int | None) -> None:
        """Called before every forward pass with the model and its dropout seed."""
        p = float(getattr(model, "input_dropout", 0.0))
        self._training = bool(model.training)
        self._dropout = (p, dropout_seed, self._training and p > 0.0)

    def call_layer(
        self,
        index: int,
        layer: nn.Module,
        mg: MessageGraph,
        h_src: torch.Tensor,
        src_ids: torch.Tensor,
    ) -> torch.Tensor:
        """``layer(mg, h_src)``, with hashed attention dropout where it applies.

        Args:
            index: the layer's position (input layer 0).
            layer: the layer.
            mg: its MessageGraph (or a piece of it, e.g. one bin).
            h_src: float [mg.num_src, width].
            src_ids: int64 [mg.num_src], original node ID of every source row;
                precompute it at set-up, it does not change between epochs.

        Returns:
            float [mg.num_dst, out_width].
        """
        _, seed, _ = self._dropout
        kwargs = layer_call_kwargs(layer, index, seed, self._training, src_ids)
        out: torch.Tensor = layer(mg, h_src, **kwargs)
        return out

    def call_propagate(
        self,
        index: int,
        layer: Projecting,
        mg: MessageGraph,
        m_src: torch.Tensor,
        h_dst: torch.Tensor | None,
        src_ids: torch.Tensor,
    ) -> torch.Tensor:
        """``layer.propagate(mg, m_src, h_dst)``: the layer on owner-projected rows.

        The rows are those of :meth:`exchanged_projection`; hashed attention
        dropout applies where it does in :meth:`call_layer`.

        Args:
            m_src: float [mg.num_src, layer.message_width], ``layer.project``
                of every source row.
            h_dst: float [mg.num_dst, in_width], the destinations' input rows
                (None if the layer does not read them: ``reads_dst_rows``).
        """
        _, seed, _ = self._dropout
        module = cast(nn.Module, layer)
        kwargs = layer_call_kwargs(module, index, seed, self._training, src_ids)
        return layer.propagate(mg, m_src, h_dst, **kwargs)

    def exchanged_projection(self, index: int, layer: nn.Module) -> Projecting | None:
        """``layer`` when layer ``index`` exchanges projected rows, else None.

        It does when the layer projects first
        (:func:`~graphwire.nn.models.projects_first`) and its rows are
        exchanged: the cached input layer's halo rows are already here, so it
        runs on them as they are.
        """
        if index == 0 and self.cache_input:
            return None
        return projecting(layer)

    def grad_plans(self, mgs: Sequence[MessageGraph]) -> list[ExchangePlan]:
        """The plan each layer's halo gradients return along, input layer first.

        Without ``loss_rows``, :attr:`plan` for every layer. With them, the
        part of it whose gradients can be nonzero. Going down from the output
        layer, the owned rows whose output gradient can be nonzero are at first
        the loss rows; a layer's halo row gets a gradient only if one of those
        rows reads it in the layer's message graph (``mgs[l]``, destinations:
        the owned rows), and the rows below that can get one are those rows,
        the owned rows they read, and the rows whose gradients peers return.
        Any other row's gradient is a sum of zero gradients (the activation
        and dropout between layers work row by row), so it stays home.
        Collective: every rank learns which of the rows it sends come back
        (one byte per halo row and layer, tag ``setup.plan.loss``).
        """
        plans = [self.plan] * self.num_layers
        if self._outside_loss is None:
            return plans
        n = self.part.num_owned
        first = 1 if self.cache_input else 0  # (a cached input layer returns none)
        needed = ~self._outside_loss
        for index in range(self.num_layers - 1, first - 1, -1):
            mg = mgs[index]
            assert mg.num_dst == n and mg.num_src == n + self.plan.num_halo
            src = mg.indices[needed[mg.dst_of_edges]]
            keep = torch.zeros(self.plan.num_halo, dtype=torch.bool)
            keep[src[src >= n] - n] = True
            plans[index] = self.plan.restrict(keep, self.transport, "setup.plan.loss")
            needed = needed.clone()
            needed[src[src < n]] = True
            for rows in plans[index].send_idx:
                needed[rows] = True
        return plans

    def check_output_grad(self, grad: torch.Tensor) -> None:
        """Raise if the output rows' gradient ``grad`` is nonzero outside ``loss_rows``.

        ``grad`` is [num_owned, C]; :meth:`grad_plans` would drop part of the
        halo rows' gradients. Only the ranks that find such rows raise;
        their peers then stop at the transport's timeout (or sooner, when
        the failed worker's process ends)."""
        outside = self._outside_loss
        if outside is not None and bool(grad[outside].any()):
            rows = int(grad[outside].any(dim=-1).sum())
            raise RuntimeError(
                f"exchange {self.name!r}: the output gradient is nonzero on "
                f"{rows} owned row(s) outside loss_rows; build the engine with "
                f"the rows the loss reads (loss_rows=None: any row)"
            )

    def cached_input_halo(
        self, rows: torch.Tensor | None = None, out: torch.Tensor | None = None
    ) -> torch.Tensor:
        """The halo's input rows after the model's input dropout (``cache_input``).

        All of them, or those at halo positions ``rows``; written into ``out``
        when given.

        The mask is hashed from the rows' original IDs with the seed the model
        uses for layer 0, so it equals the mask their owners apply.
        """
        x = self._x_halo if rows is None else self._x_halo.index_select(0, rows)
        assert self.local_orig_nid is not None
        ids = self.local_orig_nid[self.part.num_owned :]
        return self.drop_input_rows(x, ids if rows is None else ids[rows], out)

    def with_input_halo(self, h: torch.Tensor) -> torch.Tensor:
        """``[n + num_halo, F]``: the owned input rows ``h``, then the halo's
        cached ones after input dropout (``cache_input``)."""
        # The halo rows dropped out straight into their part of the buffer.
        n = h.shape[0]
        local = h.new_empty((n + self.plan.num_halo, *h.shape[1:]))
        self.cached_input_halo(out=local[n:])
        local[:n] = h  # last: through autograd, should h need a gradient
        return local

    def drop_input_rows(
        self, x: torch.Tensor, ids: torch.Tensor, out: torch.Tensor | None = None
    ) -> torch.Tensor:
        """Input rows ``x`` after the model's input dropout in this forward.

        ``ids`` are their original node IDs; the mask is the one their owners
        apply. Written into ``out`` when given (a slice of a table, say)."""
        p, seed, training = self._dropout
        if not training:
            return x if out is None else out.copy_(x)
        if seed is None:
            raise ValueError("cache_input: training needs hashed dropout (a seed)")
        return hashed_dropout(x, p, ids, derive_seed(seed, 0), out=out)

    def model_hooks(self) -> dict[str, Any]:
        """Keyword arguments that run the model's layers on this engine.

        For :meth:`GNN.forward <graphwire.nn.models.GNN.forward>`: ``run_layer``
        (layer by layer), or ``run_layers`` for an engine that runs the whole
        stack."""
        return {"run_layer": self.run_layer}

    def run_layer(
        self, index: int, layer: nn.Module, mg: MessageGraph, h: torch.Tensor
    ) -> torch.Tensor:
        """Layer ``index`` on ``h`` (this rank's rows); returns its output rows."""
        raise NotImplementedError(
            f"exchange {self.name!r} runs the whole stack: see model_hooks()"
        )

    # ----------------------------------------------------------------- epochs
    def begin_epoch(self, epoch: int) -> None:
        """Called before epoch ``epoch``'s training forward (not evaluation's)."""
        del epoch  # only engines that keep state across epochs need it

    def end_epoch(self) -> dict[str, Any]:
        """Called after the epoch's step: what its record adds to ``extra``."""
        return {}

    def state_dict(self) -> dict[str, Any]:
        """What a checkpoint keeps of the engine besides the model (caches)."""
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore :meth:`state_dict`'s state (a resumed run)."""
        del state

    def close(self) -> None:  # noqa: B027 - optional hook
        """Release what the engine holds outside the process (called once,
        after the last epoch; default: nothing)."""

    # ------------------------------------------------------------- accounting
    def timed(self, fn: Callable[[], T]) -> T:
        """Run ``fn`` and add its wall time to ``comm_s``."""
        start = time.perf_counter()
        try:
            return fn()
        finally:
            self.comm_s += time.perf_counter() - start

    def reset_timers(self) -> None:
        self.comm_s = 0.0

    # -------------------------------------------------------------- gradients
    def sync_gradients(self, model: nn.Module) -> None:
        """After the backward: every parameter's gradient summed over ranks.

        One flat all-reduce, tag ``sync.grad``."""
        sync_gradients(model, self.transport)


T = TypeVar("T")


def plan_rows(
    plan: ExchangePlan, rows: torch.Tensor, transport: Transport, tag: str
) -> torch.Tensor:
    """The halo's rows of an owned per-node array, fetched once."""
    return plan.gather_halo(rows, transport, tag)
