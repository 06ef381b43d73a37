"""Sparse CSR tensors: building them, products with dense rows, per-head indices.

The per-head index is that of an adjacency expanded to several heads.

These work on torch's CSR tensors alone; :class:`~graphwire.nn.base.MessageGraph`
builds its adjacencies with them.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass

import torch

from graphwire.graph.order import index_dtype

__all__ = ["HeadsIndex", "heads_index", "sparse_csr", "spmm"]


def sparse_csr(
    crow: torch.Tensor, col: torch.Tensor, values: torch.Tensor, size: tuple[int, int]
) -> torch.Tensor:
    """A sparse CSR tensor of ``size`` from ``crow``, ``col`` and ``values``.

    torch's beta warning is silenced; invariants are unchecked: callers build
    valid arrays."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="Sparse CSR tensor support")
        return torch.sparse_csr_tensor(
            crow, col, values, size=size, check_invariants=False
        )


def spmm(a: torch.Tensor, h: torch.Tensor) -> torch.Tensor:
    """``a @ h`` for a sparse CSR ``a`` [n, m] and a dense ``h`` [m, w].

    The values ``torch.sparse.mm`` gives, bit for bit, in a new tensor.

    On CPU the product is written by ``addmm`` with ``beta=0`` straight into
    an uninitialised result, one pass over the output where
    ``torch.sparse.mm`` makes two (it zero-fills its result, then copies the
    product into it). ``out=`` records no autograd, so a product autograd
    would record goes through ``torch.sparse.mm``, as does any other device.
    """
    records = torch.is_grad_enabled() and (a.requires_grad or h.requires_grad)
    if records or h.device.type != "cpu":
        return torch.sparse.mm(a, h)
    out = h.new_empty((a.shape[0], h.shape[1]))
    return torch.addmm(out, a, h, beta=0, out=out)


@dataclass(frozen=True, eq=False)
class HeadsIndex:
    """The index arrays of an adjacency expanded to H heads.

    For :meth:`MessageGraph.heads_adjacency`: ``crow`` [R * H + 1] and ``col``
    [E * H] of the expanded CSR, and ``order`` [E * H], the entry of the
    values [E, H] (flattened) each expanded entry takes."""

    crow: torch.Tensor
    col: torch.Tensor
    order: torch.Tensor


def heads_index(
    crow: torch.Tensor, col: torch.Tensor, num_cols: int, heads: int
) -> HeadsIndex:
    """The CSR ``crow``/``col`` (R rows, E entries) expanded to ``heads`` blocks.

    Row ``r * H + k`` holds row ``r``'s entries in their order, at
    columns ``c * H + k``, with the values of head ``k``. Entry ``(e, k)``
    lands at ``H * crow[r] + k * deg(r) + (e - crow[r])``; built a head at a
    time, so that no [E, H] int64 array is ever held."""
    num_rows, num_entries = crow.numel() - 1, col.numel()
    dtype = index_dtype(num_entries * heads, num_cols * heads)
    device = crow.device
    crow64 = crow.to(torch.int64)
    degrees = crow64[1:] - crow64[:-1]
    starts = heads * crow64[:-1]  # row r's first place, head 0
    expanded_crow = torch.empty(num_rows * heads + 1, dtype=dtype, device=device)
    expanded_crow[-1] = num_entries * heads
    expanded_col = torch.empty(num_entries * heads, dtype=dtype, device=device)
    order = torch.empty(num_entries * heads, dtype=dtype, device=device)
    row_of = torch.repeat_interleave(torch.arange(num_rows, device=device), degrees)
    # Entry e's place for head 0: its row's start plus its rank in the row.
    rank = torch.arange(num_entries, device=device) - crow64[:-1][row_of]
    place = starts[row_of] + rank
    step = degrees[row_of]  # from head k to head k + 1: the row's length
    del row_of, rank
    shifted = col.to(torch.int64) * heads
    entries = torch.arange(num_entries, dtype=torch.int64, device=device) * heads
    for k in range(heads):
        expanded_crow[k : num_rows * heads : heads] = starts + k * degrees
        at = place + k * step
        expanded_col[at] = (shifted + k).to(dtype)
        order[at] = (entries + k).to(dtype)
    return HeadsIndex(expanded_crow, expanded_col, order)
