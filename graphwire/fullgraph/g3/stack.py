"""`G3Stack`: G3's whole stack as one autograd node, and the graphs it keeps.

The engine runs every layer in bins inside :meth:`G3Stack.forward`
(:class:`~graphwire.fullgraph.g3.forward.G3Forward`); each bin's
autograd graph starts from its own source rows and ends at what it hands on,
and is kept (:class:`BinGraph`, or :class:`SumGraph` for a layer summed
message by message, all in a :class:`StackGraph`) for
:meth:`G3Stack.backward`, which walks them top down
(:class:`~graphwire.fullgraph.g3.backward.G3Backward`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch

from graphwire.fullgraph.g3.bins import Bin

if TYPE_CHECKING:
    from graphwire.fullgraph.g3.engine import G3Engine

__all__ = ["BinGraph", "G3Stack", "StackGraph", "SumGraph"]


@dataclass(frozen=True, slots=True, eq=False)
class BinGraph:
    """One bin's autograd graph, kept from the forward for the backward.

    Attributes:
        index: the bin's index in its layer.
        bin: the bin.
        src: the leaf of its source rows (input rows, or projected rows when
            the layer exchanges them).
        dst: the leaf of its destinations' input rows (projected layers whose
            ``propagate`` reads them), else None.
        outs: what the bin hands on, with their graph: the last layer's
            output rows, or the next layer's source rows (finished: activation
            and dropout, then projected when the next layer exchanges
            projected rows) and, when the next layer reads its destinations'
            input rows, those rows unprojected.
    """

    index: int
    bin: Bin
    src: torch.Tensor
    dst: torch.Tensor | None
    outs: tuple[torch.Tensor, ...]


@dataclass(frozen=True, slots=True, eq=False)
class SumGraph:
    """The graph of a layer summed message by message
    (:mod:`graphwire.fullgraph.g3.sums`), kept from the forward for the
    backward: the sum's leaf, the leaf of the destinations' input rows when
    ``finish`` reads them (else None), and the layer's output rows, ``finish``
    of them."""

    agg: torch.Tensor
    dst: torch.Tensor | None
    out: torch.Tensor


@dataclass(frozen=True, slots=True, eq=False)
class StackGraph:
    """One forward's graphs: every layer's bins (forward order) or its sum,
    the input rows' leaf and, when layer 0 reads projected rows, their
    projection: of the owned rows when layer 0 exchanges projected rows, of
    the whole table ``[owned; halo]`` when ``projects_halo`` (the cached
    input layer's rows projected here, once per forward)."""

    layers: list[list[BinGraph] | SumGraph]
    h0: torch.Tensor
    projection: torch.Tensor | None
    projects_halo: bool = False


class G3Stack(torch.autograd.Function):
    """``h_owned -> the last layer's owned rows``: the whole stack in G3's bins.

    Forward runs the engine's :class:`~graphwire.fullgraph.g3.forward.G3Forward`
    (halo rows arrive through the engine's messages). Backward runs its
    :class:`~graphwire.fullgraph.g3.backward.G3Backward` on the graphs the
    forward kept. The parameters are inputs only so that the output requires
    grad; their gradients accumulate through the bins' graphs.
    """

    @staticmethod
    def forward(  # type: ignore[override]
        ctx: Any,
        h: torch.Tensor,
        engine: G3Engine,
        flags: tuple[bool, bool],
        *params: torch.Tensor,
    ) -> torch.Tensor:
        out, graph = engine.forward.stack(h, *flags)
        ctx.engine, ctx.graph, ctx.num_params = engine, graph, len(params)
        return out

    @staticmethod
    def backward(  # type: ignore[override]
        ctx: Any, grad_out: torch.Tensor
    ) -> tuple[torch.Tensor | None, ...]:
        engine: G3Engine = ctx.engine
        graph, ctx.graph = ctx.graph, None  # free the bins' graphs after use
        if graph is None:
            raise RuntimeError("g3: backward through a forward run without grad")
        engine.check_output_grad(grad_out)
        grad = engine.backward.run(
            graph, grad_out.contiguous(), ctx.needs_input_grad[0]
        )
        return (grad, None, None, *([None] * ctx.num_params))
