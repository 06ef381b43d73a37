"""G3's eager computation, message by message, for a layer that sums its sources.

A bin of the last layer that reads halo rows waits for every message carrying
one of them, which is nearly all of them: each of its rows reads rows from
many of each peer's bins. A layer whose ``propagate`` is a row-wise ``finish``
of a weighted sum of its source rows
(:class:`~graphwire.nn.models.SumsSources`: GCN's ``Â m + b``, GraphSAGE's
mean, then its root term) need not wait: the sum splits over where the rows
come from. :class:`MessageSums` holds the pieces of ``Â`` (the layer's
``edge_weights``; built once):

- ``own``: ``Â``'s owned columns, CSR [n, n]; ``own_t`` its transpose.
- per message ``(peer, sender bin)``: the rows with an edge from it,
  int64 [d_k], and ``Â``'s entries from it, CSR [d_k, rows_k] over the
  message's rows as they arrive (no copy into a halo buffer, no gather);
- per message whose rows' gradients go back (``return_pos``): the transpose
  restricted to those rows, CSR [r_k, n], in the order they are returned.

Forward: ``agg = own @ m_owned`` while the halo rows are in flight, then
``agg[d_k] += piece_k @ message_k`` as each message is in, in the order they
were sent (a fixed order, so every run sums alike), then ``finish(agg,
h_dst)`` (``h_dst``: the owned input rows, for a layer that reads them).
Backward: ``grad_agg`` alone from ``finish``'s graph; each message's
returned rows' gradient is one product, ``returns_k @ grad_agg``, sent as
soon as it is computed; then the rest of ``finish``'s backward (``h_dst``'s
gradient and the parameters': SAGE's root term) while they are in flight;
the owned rows' gradient is ``own_t @ grad_agg``.

The sums group the terms of each row differently from one product over
``[owned; halo]`` (owned sources first, then message by message), so results
agree with the single process to float rounding, as the bins' do. They apply
to a last layer where :func:`sums_left_out` finds no reason against them.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import nn

from graphwire.fullgraph.g3.messages import Messages
from graphwire.graph.order import index_dtype, stable_order
from graphwire.nn.base import MessageGraph
from graphwire.nn.sparse import sparse_csr, spmm

__all__ = ["MessageSums", "plan_sums", "sums_left_out"]

Key = tuple[int, int]


@dataclass(frozen=True, eq=False)
class MessageSums:
    """``Â`` of one layer split by where its source rows come from (module
    docstring). Matrices are float32 CSR; :meth:`matrices` converts them to
    another dtype once."""

    num_owned: int
    own: torch.Tensor
    own_t: torch.Tensor
    pieces: dict[Key, tuple[torch.Tensor, torch.Tensor]]
    returns: dict[Key, torch.Tensor]
    _cast: dict[torch.dtype, MessageSums] = field(default_factory=dict, repr=False)

    def matrices(self, dtype: torch.dtype) -> MessageSums:
        """These sums with values in ``dtype`` (float32: themselves)."""
        if dtype == self.own.dtype:
            return self
        cast = self._cast.get(dtype)
        if cast is None:
            cast = MessageSums(
                self.num_owned,
                self.own.to(dtype),
                self.own_t.to(dtype),
                {k: (rows, m.to(dtype)) for k, (rows, m) in self.pieces.items()},
                {k: m.to(dtype) for k, m in self.returns.items()},
            )
            self._cast[dtype] = cast
        return cast

    def sum_owned(self, m_owned: torch.Tensor) -> torch.Tensor:
        """float [n, w]: the sum over the owned source rows ``m_owned`` [n, w]."""
        if not self.num_owned:
            return m_owned.new_zeros((0, m_owned.shape[1]))
        return spmm(self.own, m_owned)

    def add_message(self, agg: torch.Tensor, key: Key, rows: torch.Tensor) -> None:
        """Add to ``agg`` [n, w] the terms of message ``key``'s ``rows``."""
        piece = self.pieces.get(key)
        if piece is not None:
            dst, matrix = piece
            agg.index_add_(0, dst, spmm(matrix, rows))

    def returned_grad(self, key: Key, grad_agg: torch.Tensor) -> torch.Tensor | None:
        """float [r_k, w]: the gradients of message ``key``'s returned rows
        (None when it returns none)."""
        matrix = self.returns.get(key)
        return None if matrix is None else spmm(matrix, grad_agg)

    def owned_grad(self, grad_agg: torch.Tensor) -> torch.Tensor:
        """float [n, w]: the gradients of the owned source rows."""
        if not self.num_owned:
            return grad_agg.new_zeros((0, grad_agg.shape[1]))
        return spmm(self.own_t, grad_agg)


def sums_left_out(
    index: int, layer: nn.Module, projected: bool, mode: str, eager: bool
) -> str | None:
    """Why the last layer (``layer``, layer ``index``) cannot be summed
    message by message, or None when it can: it must lie above the input
    layer (whose halo rows may be cached, and whose backward the engine's
    backward finishes itself), sum its sources
    (:func:`~graphwire.nn.models.sums_sources`) and exchange them projected
    (``projected``), and ``mode`` must compute ``eager``-ly."""
    name = type(layer).__name__
    if index == 0:
        return "a one-layer model's last layer is its input layer"
    if not getattr(layer, "sums_sources", False):
        return (
            f"the last layer ({name}) does not sum its sources (GCN and "
            "GraphSAGE do; GAT's softmax needs every source row first)"
        )
    if not projected:
        return (
            f"the last layer ({name}) does not exchange projected rows "
            "(its output is no narrower than its input)"
        )
    if not eager:
        return f"mode {mode!r} computes no layer eagerly"
    return None


def plan_sums(
    mg: MessageGraph,
    weight: torch.Tensor,
    messages: Messages,
    return_pos: dict[Key, torch.Tensor],
) -> MessageSums:
    """Split ``Â`` (``mg`` with per-edge ``weight``, float [E]) by source.

    Args:
        mg: the part's MessageGraph: owned destinations ``0..n-1``, owned
            sources ``0..n-1`` then halo sources ``n..n+num_halo-1``.
        weight: ``Â``'s entry of every edge of ``mg``, CSR order.
        messages: how the layer's halo rows arrive.
        return_pos: per message, the halo positions whose gradients go back.
    """
    n = mg.num_dst
    dst, src = mg.dst_of_edges, mg.indices
    weight = weight.detach().to(torch.float32)
    owned = src < n
    owned_edges, halo_edges = owned.nonzero().view(-1), (~owned).nonzero().view(-1)
    o_dst, o_src = dst[owned_edges], src[owned_edges]
    o_weight = weight[owned_edges]
    own = _csr(o_dst, o_src, o_weight, (n, n))
    perm = stable_order(o_src)
    own_t = _csr(o_src[perm], o_dst[perm], o_weight[perm], (n, n))

    # Each halo position's message and its place among that message's rows.
    num_halo = messages.halo_message.numel()
    place = torch.empty(num_halo, dtype=torch.int64)
    for positions in messages.recv_pos.values():
        place[positions] = torch.arange(positions.numel())
    halo_pos = src[halo_edges] - n
    halo_dst, halo_weight = dst[halo_edges], weight[halo_edges]
    message = messages.halo_message[halo_pos]
    # Grouped by message; within one, edges keep CSR order (by destination).
    order = stable_order(message)
    counts = torch.bincount(message, minlength=len(messages.keys)).tolist()
    pieces: dict[Key, tuple[torch.Tensor, torch.Tensor]] = {}
    returns: dict[Key, torch.Tensor] = {}
    returned_as = torch.full((num_halo,), -1, dtype=torch.int64)
    for key, edges in zip(messages.keys, torch.split(order, counts), strict=True):
        e_dst, e_pos, e_weight = halo_dst[edges], halo_pos[edges], halo_weight[edges]
        if edges.numel():
            rows, e_row = torch.unique_consecutive(e_dst, return_inverse=True)
            size = (rows.numel(), messages.recv_pos[key].numel())
            pieces[key] = (rows, _csr(e_row, place[e_pos], e_weight, size))
        back = return_pos.get(key)
        if back is None:
            continue
        returned_as[back] = torch.arange(back.numel())
        e_back = returned_as[e_pos]
        keep = (e_back >= 0).nonzero().view(-1)
        keep = keep[stable_order(e_back[keep])]
        size = (back.numel(), n)
        returns[key] = _csr(e_back[keep], e_dst[keep], e_weight[keep], size)
        returned_as[back] = -1
    return MessageSums(n, own, own_t, pieces, returns)


def _csr(
    row: torch.Tensor, col: torch.Tensor, values: torch.Tensor, size: tuple[int, int]
) -> torch.Tensor:
    """Sparse CSR ``size`` from entries sorted by ``row`` (int32 indices where
    they fit, as MessageGraph's products use)."""
    crow = torch.zeros(size[0] + 1, dtype=torch.int64)
    torch.cumsum(torch.bincount(row, minlength=size[0]), 0, out=crow[1:])
    dtype = index_dtype(col.numel(), *size)
    crow, col = crow.to(dtype), col.to(dtype)
    return sparse_csr(crow, col, values, size)
