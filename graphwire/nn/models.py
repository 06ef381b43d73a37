"""`GNN`: a stack of one kind of layer, and `build_model` to make one by name.

The model is written against :class:`~graphwire.nn.base.MessageGraph` only, so
the same module trains on a full graph (the same MessageGraph for every layer),
on sampled blocks (block ``l`` for layer ``l``, input layer first) and in
distributed engines, through the hooks of :meth:`GNN.forward` (``fetch`` appends
halo rows; ``run_layer`` and ``run_layers`` run the layers in pieces).

Layer ``l`` runs::

    h     = dropout(h)                       # input_dropout for l = 0
    h_src = fetch(l, h) if fetch else h      # [num_src_l, width_l]
    h     = layer_l(mgs[l], h_src)           # [num_dst_l, width_{l+1}]
    h     = activation(h)                    # all but the last layer

Dropout comes before ``fetch`` so a row is dropped once, by its owner, and every
consumer sees the same row (as in a single process). With ``dropout_seed`` the
mask is hashed from (seed, layer, global row ID) and equal on every process
(:mod:`graphwire.nn.dropout`); without it, dropout draws from torch's generator.
GAT's attention dropout is hashed likewise, from (seed, layer, source ID,
destination ID, head), when :func:`layer_call_kwargs` passes the layer a seed.

Layer kinds are registered by name in :data:`LAYER_KINDS`, each with the graph it
expects (:meth:`LayerKind.prepare`): GCN aggregates over ``A + I`` with
``gcn_norm`` weights, GAT over ``A + I``, SAGE over ``A`` (its self term is
separate).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, cast

import torch
import torch.nn.functional as F
from torch import nn

from graphwire.graph.graph import Graph
from graphwire.graph.seeds import derive_seed
from graphwire.nn.base import MessageGraph
from graphwire.nn.dropout import check_dropout, hashed_dropout
from graphwire.nn.gat import GATConv
from graphwire.nn.gcn import GCNConv
from graphwire.nn.layer import check_size
from graphwire.nn.sage import SAGEConv

__all__ = [
    "GNN",
    "LAYER_KINDS",
    "LayerKind",
    "ModelOptions",
    "Projecting",
    "SumsSources",
    "build_model",
    "feature_dropout",
    "layer_call_kwargs",
    "projecting",
    "projects_first",
    "sums_sources",
]

Fetch = Callable[[int, torch.Tensor], torch.Tensor]
RunLayer = Callable[[int, nn.Module, MessageGraph, torch.Tensor], torch.Tensor]
RunLayers = Callable[[torch.Tensor], torch.Tensor]

# Attention-dropout seeds are derive_seed(dropout_seed, ATTENTION_STREAM, layer):
# three parts, where feature dropout's derive_seed(dropout_seed, layer) has two,
# so the two streams never share a seed.
ATTENTION_STREAM = 0x41545444  # "ATTD"


@dataclass(kw_only=True, slots=True, frozen=True)
class ModelOptions:
    """Per-kind options that only some layer kinds read."""

    heads: int = 8
    out_heads: int = 1
    attn_dropout: float = 0.0


@dataclass(frozen=True, slots=True)
class LayerKind:
    """How to build one kind of layer.

    Attributes:
        hidden_layer: ``(in_dim, hidden, options) -> (module, output width)``.
        output_layer: ``(in_dim, out_dim, options) -> module`` of width out_dim.
        activation: applied after every layer but the last.
        self_loops: the kind expects one self-loop per node in the graph it
            aggregates over (GCN's ``A + I``, GAT attending to itself).
        gcn_weights: the kind expects ``Graph.gcn_norm`` as ``edge_weight``.
    """

    hidden_layer: Callable[[int, int, ModelOptions], tuple[nn.Module, int]]
    output_layer: Callable[[int, int, ModelOptions], nn.Module]
    activation: Callable[[torch.Tensor], torch.Tensor]
    self_loops: bool = False
    gcn_weights: bool = False

    def prepare(self, graph: Graph) -> tuple[Graph, torch.Tensor | None]:
        """The graph this kind aggregates over, and its edge weights (or None)."""
        if self.self_loops:
            graph = graph.add_self_loops()
        return graph, graph.gcn_norm if self.gcn_weights else None

    def full_graph(self, graph: Graph) -> MessageGraph:
        """The whole (prepared) graph as one MessageGraph."""
        graph, weight = self.prepare(graph)
        n = graph.num_nodes
        return MessageGraph(graph.indptr, graph.indices, n, n, weight)


def _gat_hidden(in_dim: int, hidden: int, opt: ModelOptions) -> tuple[nn.Module, int]:
    layer = GATConv(in_dim, hidden, opt.heads, True, attn_dropout=opt.attn_dropout)
    return layer, hidden * opt.heads


def _gat_output(in_dim: int, out_dim: int, opt: ModelOptions) -> nn.Module:
    # The GAT paper averages the output heads (one head on Cora).
    return GATConv(in_dim, out_dim, opt.out_heads, False, attn_dropout=opt.attn_dropout)


LAYER_KINDS: dict[str, LayerKind] = {
    "gcn": LayerKind(
        hidden_layer=lambda i, h, _: (GCNConv(i, h), h),
        output_layer=lambda i, o, _: GCNConv(i, o),
        activation=F.relu,
        self_loops=True,
        gcn_weights=True,
    ),
    "sage": LayerKind(
        hidden_layer=lambda i, h, _: (SAGEConv(i, h), h),
        output_layer=lambda i, o, _: SAGEConv(i, o),
        activation=F.relu,
    ),
    "gat": LayerKind(
        hidden_layer=_gat_hidden,
        output_layer=_gat_output,
        activation=F.elu,
        self_loops=True,
    ),
}


def feature_dropout(x: torch.Tensor, p: float, training: bool) -> torch.Tensor:
    """Dropout that draws random numbers only for the non-zero entries of ``x``.

    Same distribution as ``F.dropout`` (a zero stays zero either way), but input
    features are often sparse (Cora: 1.3% non-zero), where one random number per
    entry would be drawn mostly for zeros. Dense inputs (over a
    quarter non-zero) go to ``F.dropout``, and so does an ``x`` that needs a
    gradient: a zero entry passes it on only where it is kept.

    Args:
        x: float [N, F].
        p: drop probability.
        training: apply only in training mode.

    Returns:
        float [N, F].
    """
    if not training or p == 0.0:
        return x
    if x.requires_grad:
        return F.dropout(x, p, True)
    flat = x.reshape(-1)
    nonzero = flat.nonzero().view(-1)  # host sync: sizes the draw
    if 4 * nonzero.numel() > flat.numel():
        return F.dropout(x, p, True)
    dropped = nonzero[torch.rand(nonzero.numel()) < p]
    mask = torch.full_like(flat, 1.0 / (1.0 - p))
    mask[dropped] = 0.0
    return (flat * mask).view_as(x)


class Projecting(Protocol):
    """A layer that splits into a row-wise projection and the rest.

    ``forward(mg, h_src) == propagate(mg, project(h_src), mg.dst_rows(h_src))``."""

    message_width: int
    reads_dst_rows: bool  # whether propagate() reads h_dst (else it may be None)

    def project(self, h: torch.Tensor) -> torch.Tensor: ...

    def propagate(
        self,
        mg: MessageGraph,
        m_src: torch.Tensor,
        h_dst: torch.Tensor | None,
        **kwargs: Any,
    ) -> torch.Tensor: ...


def projecting(layer: nn.Module) -> Projecting | None:
    """``layer`` as :class:`Projecting` when :func:`projects_first` holds, else None."""
    return cast(Projecting, layer) if projects_first(layer) else None


class SumsSources(Projecting, Protocol):
    """A :class:`Projecting` layer whose propagate is a weighted sum, then a finish.

    Its ``propagate(mg, m_src, h_dst)`` is ``finish(A m_src, h_dst)``, ``A``
    [num_dst, num_src] holding ``edge_weights(mg)`` (float [E], CSR order) and
    ``finish`` row-wise: the
    weighted sum splits over any grouping of the source rows, so a caller may
    sum the rows it has while others are still on their way (GCN's ``Â m +
    b``; GraphSAGE's neighbour mean, then its root term and bias)."""

    def edge_weights(self, mg: MessageGraph) -> torch.Tensor: ...

    def finish(self, agg: torch.Tensor, h_dst: torch.Tensor | None) -> torch.Tensor: ...


def sums_sources(layer: nn.Module) -> SumsSources | None:
    """``layer`` as :class:`SumsSources`, or None.

    It is one when it projects first and says ``sums_sources``."""
    if not getattr(layer, "sums_sources", False) or not projects_first(layer):
        return None
    return cast(SumsSources, layer)


def projects_first(layer: nn.Module) -> bool:
    """Whether ``layer`` is better fed projected rows than input rows.

    A layer that splits as ``forward(mg, h_src) == propagate(mg,
    project(h_src), mg.dst_rows(h_src))``, with ``project`` row-wise and narrower
    than its input (``message_width < in_dim``), says so with
    ``projects_first``. A distributed engine then has each row's owner project
    it and exchanges the narrower rows (GCN, GraphSAGE and GAT layers do, when
    the width shrinks: the output layer to the classes, for one).
    """
    return bool(getattr(layer, "projects_first", False))


def layer_call_kwargs(
    layer: nn.Module,
    index: int,
    dropout_seed: int | None,
    training: bool,
    src_ids: torch.Tensor | None,
) -> dict[str, Any]:
    """Keyword arguments for ``layer(mg, h_src, **kwargs)``: hashed attention.

    Only layers with ``attn_dropout > 0`` (GAT) take them, and only in training
    with a ``dropout_seed``; every other call gets ``{}``, so GCN and SAGE
    layers are called as ``layer(mg, h_src)``.

    Args:
        layer: layer ``index`` of the model.
        index: its position, input layer 0 (each layer gets its own seed).
        dropout_seed: the model's hashed-dropout seed, or None (no hashing).
        training: the model is in training mode.
        src_ids: int64 [num_src], global (original) ID of every source row of
            the layer's MessageGraph.

    Returns:
        ``{"src_ids": src_ids, "seed": derive_seed(dropout_seed,
        ATTENTION_STREAM, index)}`` or ``{}``.
    """
    if not training or dropout_seed is None:
        return {}
    if float(getattr(layer, "attn_dropout", 0.0)) <= 0.0:
        return {}
    return {
        "src_ids": src_ids,
        "seed": derive_seed(dropout_seed, ATTENTION_STREAM, index),
    }


class GNN(nn.Module):
    """``L`` message-passing layers with activation and dropout between them.

    Args:
        layers: the layers, input layer first.
        activation: applied after every layer but the last.
        dropout: dropout on the input of layers ``1..L-1``.
        input_dropout: dropout on the input features (layer 0).
    """

    def __init__(
        self,
        layers: Sequence[nn.Module],
        activation: Callable[[torch.Tensor], torch.Tensor],
        dropout: float,
        input_dropout: float,
    ) -> None:
        super().__init__()
        self.layers = nn.ModuleList(layers)
        self.activation = activation
        self.dropout = check_dropout(dropout, "dropout")
        self.input_dropout = check_dropout(input_dropout, "input_dropout")

    @property
    def num_layers(self) -> int:
        return len(self.layers)

    def forward(
        self,
        mgs: Sequence[MessageGraph],
        x: torch.Tensor,
        fetch: Fetch | None = None,
        *,
        run_layer: RunLayer | None = None,
        run_layers: RunLayers | None = None,
        row_ids: torch.Tensor | None = None,
        dropout_seed: int | None = None,
    ) -> torch.Tensor:
        """Run every layer.

        Args:
            mgs: one MessageGraph per layer, input layer first; ``mgs[l].num_src``
                rows go in, ``mgs[l].num_dst`` rows come out.
            x: float [mgs[0].num_src, in_dim] (or the rows ``fetch(0, x)``
                completes to that).
            fetch: ``fetch(l, h) -> h_src``, called before layer ``l``; a
                distributed engine appends halo rows. ``None``: ``h_src = h``.
            run_layer: ``run_layer(l, layer, mgs[l], h) -> layer output``, in
                place of ``layer(mgs[l], fetch(l, h))``, for engines that run a
                layer in pieces (G3's bins) with communication in between.
            row_ids: int64 [>= len(h_src)], global IDs of the rows of ``h``
                and then of the rows ``fetch`` appends; layer ``l``'s feature
                dropout uses the first ``len(h)``, GAT's attention dropout the
                first ``len(h_src)`` (full-graph training: all nodes, or a
                worker's owned nodes first); needed with ``dropout_seed``.
                ``run_layer`` gets no IDs: the engine knows its own.
            run_layers: ``run_layers(h) -> output of the last layer``, called
                with layer 0's input after its dropout, in place of the whole
                loop: for engines that pipeline computation across layers
                (G3's bins). They apply the activation and the dropout
                between layers exactly as the loop does (hashed masks, keyed
                by ``derive_seed(dropout_seed, l)`` and global row IDs).
            dropout_seed: hash dropout masks (features, and GAT attention) from
                this seed (per layer) and ``row_ids`` instead of drawing them.

        Returns:
            float [mgs[-1].num_dst, out_dim] logits.
        """
        if len(mgs) != self.num_layers:
            raise ValueError(
                f"mgs: expected one MessageGraph per layer ({self.num_layers}), "
                f"got {len(mgs)}"
            )
        h = x
        last = self.num_layers - 1
        if dropout_seed is not None and row_ids is None:
            raise ValueError("dropout_seed: needs row_ids, the global ID of each row")
        for index, (layer, mg) in enumerate(zip(self.layers, mgs, strict=True)):
            p = self.input_dropout if index == 0 else self.dropout
            if not self.training or p == 0.0:
                pass
            elif dropout_seed is not None:
                assert row_ids is not None
                seed = derive_seed(dropout_seed, index)
                h = hashed_dropout(h, p, row_ids[: h.shape[0]], seed)
            elif index == 0:
                h = feature_dropout(h, p, True)
            else:
                h = F.dropout(h, p, True)
            if run_layers is not None:
                return run_layers(h)
            if run_layer is not None:
                h = run_layer(index, layer, mg, h)
            else:
                h_src = fetch(index, h) if fetch is not None else h
                src_ids = None if row_ids is None else row_ids[: h_src.shape[0]]
                kwargs = layer_call_kwargs(
                    layer, index, dropout_seed, self.training, src_ids
                )
                h = layer(mg, h_src, **kwargs)
            if index < last:
                h = self.activation(h)
        return h


def build_model(
    name: str,
    in_dim: int,
    hidden: int,
    out_dim: int,
    num_layers: int = 2,
    dropout: float = 0.5,
    *,
    input_dropout: float | None = None,
    heads: int = 8,
    out_heads: int = 1,
    attn_dropout: float = 0.0,
) -> GNN:
    """Build a :class:`GNN` of ``num_layers`` layers of kind ``name``.

    Args:
        name: a key of :data:`LAYER_KINDS` ("gcn", "sage", "gat").
        in_dim: input feature width.
        hidden: hidden width (per head for GAT, whose hidden layers concatenate
            ``heads`` heads).
        out_dim: number of classes.
        num_layers: number of layers (>= 1).
        dropout: dropout between layers.
        input_dropout: dropout on the input features (default: ``dropout``).
        heads: GAT heads in hidden layers.
        out_heads: GAT heads (averaged) in the output layer.
        attn_dropout: GAT attention dropout.

    Returns:
        The model, with freshly initialised parameters (seed torch first).
    """
    if name not in LAYER_KINDS:
        raise ValueError(
            f"model: unknown layer kind {name!r}; known: {sorted(LAYER_KINDS)}"
        )
    # Checked here, so an error names build_model's argument (hidden is the
    # layers' out_dim), not a layer's.
    for size, arg in (
        (in_dim, "in_dim"),
        (hidden, "hidden"),
        (out_dim, "out_dim"),
        (num_layers, "num_layers"),
        (heads, "heads"),
        (out_heads, "out_heads"),
    ):
        check_size(size, arg)
    kind = LAYER_KINDS[name]
    options = ModelOptions(heads=heads, out_heads=out_heads, attn_dropout=attn_dropout)
    layers: list[nn.Module] = []
    width = in_dim
    for _ in range(num_layers - 1):
        layer, width_out = kind.hidden_layer(width, hidden, options)
        layers.append(layer)
        width = width_out
    layers.append(kind.output_layer(width, out_dim, options))
    p_in = dropout if input_dropout is None else input_dropout
    return GNN(layers, kind.activation, dropout, p_in)
