"""`HaloEngine` (``--exchange halo``): one bulk exchange of boundary rows per layer.

The DistDGL / BNS-GCN-style baseline: before layer ``l``, every rank sends each
peer the rows of its owned nodes that the peer holds as halo, in one
``all_to_all`` (tag ``fwd.L{l}``), then computes the layer on owned + halo rows.
Backward sends the halo rows' gradients back to their owners in one
``all_to_all`` (tag ``bwd.L{l}``), where they are summed into the owned rows;
only those the loss can make nonzero are sent
(:meth:`~graphwire.fullgraph.base.Engine.grad_plans`).
Communication and computation do not overlap.

A layer that projects first (GCN's output layer: ``Â(hW) = (Âh)W`` with ``W``
narrowing 128 columns to the classes) has each owner project its rows and
exchanges the projected rows: the same rows, fewer columns, and no rank
projects a halo row its owner already projected.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from graphwire.comm.base import Transport
from graphwire.comm.plan import ExchangePlan
from graphwire.fullgraph.base import Engine
from graphwire.nn.base import MessageGraph
from graphwire.run.local_graph import local_message_graph

__all__ = ["HaloConfig", "HaloEngine", "HaloExchange"]


class HaloExchange(torch.autograd.Function):
    """``h_owned [n, *S] -> h_local [n + h, *S]``: owned rows, then halo rows.

    Backward: the halo rows' gradients go to their owners along ``grad_plan``
    (``plan`` itself, or the part of it whose gradients can be nonzero: see
    :meth:`Engine.grad_plans`) and are added to the owned rows' gradients.
    """

    @staticmethod
    def forward(  # type: ignore[override]
        ctx: Any,
        h_owned: torch.Tensor,
        plan: ExchangePlan,
        grad_plan: ExchangePlan,
        transport: Transport,
        layer: int,
        engine: Engine,
    ) -> torch.Tensor:
        ctx.plan, ctx.transport = grad_plan, transport
        ctx.layer, ctx.engine = layer, engine
        halo = engine.timed(
            lambda: plan.gather_halo(
                h_owned.detach(), transport, f"{engine.phase}fwd.L{layer}"
            )
        )
        return torch.cat([h_owned, halo])

    @staticmethod
    def backward(  # type: ignore[override]
        ctx: Any, grad_local: torch.Tensor
    ) -> tuple[torch.Tensor | None, None, None, None, None, None]:
        plan: ExchangePlan = ctx.plan
        grad_halo = grad_local[plan.num_owned :].contiguous()
        returned = ctx.engine.timed(
            lambda: plan.scatter_grad(
                grad_halo, ctx.transport, f"{ctx.engine.phase}bwd.L{ctx.layer}"
            )
        )
        return grad_local[: plan.num_owned] + returned, None, None, None, None, None


@dataclass(frozen=True, kw_only=True, slots=True)
class HaloConfig:
    """The halo exchange has no settings."""


class HaloEngine(Engine):
    """Bulk halo exchange per layer, then compute (see the module docstring)."""

    config_type = HaloConfig

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        mg = local_message_graph(self.part, self.plan, self.transport, self.kind)
        self._mgs = [mg] * self.num_layers
        assert self.local_orig_nid is not None  # every layer's sources: all local rows
        self._src_ids = self.local_orig_nid
        # Each layer returns only the gradients the loss can make nonzero.
        self._grad_plans = self.grad_plans(self._mgs)

    @property
    def mgs(self) -> list[MessageGraph]:
        return self._mgs

    def fetch(self, index: int, h: torch.Tensor) -> torch.Tensor:
        """Owned rows of ``h`` followed by the halo rows from their owners."""
        if index == 0 and self.cache_input:
            return self.with_input_halo(h)
        out: torch.Tensor = HaloExchange.apply(
            h, self.plan, self._grad_plans[index], self.transport, index, self
        )
        return out

    def run_layer(
        self, index: int, layer: nn.Module, mg: MessageGraph, h: torch.Tensor
    ) -> torch.Tensor:
        projected = self.exchanged_projection(index, layer)
        if projected is None:
            h_src = self.fetch(index, h)
            out = self.call_layer(index, layer, mg, h_src, self._src_ids)
        else:
            # Each owner projects its rows; the narrower rows cross the wire.
            m_src = self.fetch(index, projected.project(h))
            out = self.call_propagate(index, projected, mg, m_src, h, self._src_ids)
        if index == self.num_layers - 1 and out.requires_grad:
            out.register_hook(self.check_output_grad)
        return out
