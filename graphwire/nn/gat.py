"""`GATConv`: multi-head graph attention (Veličković et al., ICLR 2018).

For each head ``k``, with ``z = h W`` split into heads:

    e_{s->d,k}     = LeakyReLU(a_src_k · z_{s,k} + a_dst_k · z_{d,k})
    alpha_{s->d,k} = softmax of e over the in-edges of d   (edge_softmax)
    h'_{d,k}       = sum_s alpha_{s->d,k} z_{s,k}

Heads are concatenated (``concat=True``, hidden layers) or averaged (the output
layer of the paper). Attention dropout drops normalised coefficients in training:
with a ``seed`` (and the global ID of every source row) the mask is hashed from
``(seed, source ID, destination ID, head)`` and equal on every process
(:func:`~graphwire.nn.dropout.hashed_edge_dropout`); without, ``F.dropout``.
Full-graph GAT expects self-loops in the graph (each node attends to itself);
``mg.edge_weight`` is ignored.

Shapes: ``h_src`` float [num_src, in_dim] -> float [num_dst, heads * out_dim]
(concat) or [num_dst, out_dim] (mean). Memory per layer: O(E * heads) for scores
and O((num_src + num_dst) * heads * out_dim) for projections.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from graphwire.nn.aggregate import spmm_sum
from graphwire.nn.base import MessageGraph
from graphwire.nn.dropout import check_dropout, hashed_edge_dropout
from graphwire.nn.edges import edge_softmax
from graphwire.nn.layer import ProjectsToOutput, check_size

__all__ = ["GATConv", "attention_scores"]


class _Scores(torch.autograd.Function):
    """``(z * att_src).sum(-1)`` and ``(z[:num_dst] * att_dst).sum(-1)``
    without any [N, H, F] product: forward as batched products (einsum);
    backward writes ``z``'s gradient once, both terms in it (no zero-filled
    copy for the slice of destination rows, no sum of two gradients)."""

    @staticmethod
    def forward(  # type: ignore[override]
        ctx: Any,
        z: torch.Tensor,
        att_src: torch.Tensor,
        att_dst: torch.Tensor,
        num_dst: int,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        ctx.save_for_backward(z, att_src, att_dst)
        ctx.num_dst = num_dst
        src = torch.einsum("nhf,hf->nh", z, att_src)
        dst = torch.einsum("nhf,hf->nh", z[:num_dst], att_dst)
        return src, dst

    @staticmethod
    def backward(  # type: ignore[override]
        ctx: Any, grad_src: torch.Tensor, grad_dst: torch.Tensor
    ) -> tuple[torch.Tensor | None, ...]:
        z, att_src, att_dst = ctx.saved_tensors
        z_dst = z[: ctx.num_dst]
        grad_z = grad_att_src = grad_att_dst = None
        if ctx.needs_input_grad[0]:
            grad_z = grad_src.unsqueeze(-1) * att_src
            grad_z[: ctx.num_dst].addcmul_(grad_dst.unsqueeze(-1), att_dst)
        if ctx.needs_input_grad[1]:
            grad_att_src = torch.einsum("nh,nhf->hf", grad_src, z)
        if ctx.needs_input_grad[2]:
            grad_att_dst = torch.einsum("nh,nhf->hf", grad_dst, z_dst)
        return grad_z, grad_att_src, grad_att_dst, None


def attention_scores(
    mg: MessageGraph, z: torch.Tensor, att_src: torch.Tensor, att_dst: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """GAT's per-head scores of the source rows and of the destinations' rows.

    float [S, H, F] with [H, F] each -> [S, H] and [D, H], equal to
    ``(z * att_src).sum(-1)`` and ``(mg.dst_rows(z) * att_dst).sum(-1)`` up
    to the order of the additions."""
    if mg.dst_index is None:
        src, dst = _Scores.apply(z, att_src, att_dst, mg.num_dst)
        return src, dst
    src, every = _Scores.apply(z, att_src, att_dst, z.shape[0])
    return src, mg.dst_rows(every)


class GATConv(ProjectsToOutput, nn.Module):
    """One multi-head graph attention layer.

    Args:
        in_dim: input feature width.
        out_dim: output width per head.
        heads: number of attention heads.
        concat: concatenate heads (else average them).
        negative_slope: LeakyReLU slope of the attention scores.
        attn_dropout: dropout probability on attention coefficients.
        bias: add a learnable bias.
    """

    def __init__(
        self,
        in_dim: int,
        out_dim: int,
        heads: int = 1,
        concat: bool = True,
        negative_slope: float = 0.2,
        attn_dropout: float = 0.0,
        bias: bool = True,
    ) -> None:
        super().__init__()
        self.in_dim = check_size(in_dim, "GATConv in_dim")
        self.out_dim = check_size(out_dim, "GATConv out_dim")
        self.heads = heads = check_size(heads, "GATConv heads")
        self.concat = concat
        self.negative_slope = negative_slope
        self.attn_dropout = check_dropout(attn_dropout, "attn_dropout")
        # float32 as Graph.x is, whatever torch's default dtype.
        f32 = torch.float32
        self.lin = nn.Linear(in_dim, heads * out_dim, bias=False, dtype=f32)
        self.att_src = nn.Parameter(torch.empty(heads, out_dim, dtype=f32))
        self.att_dst = nn.Parameter(torch.empty(heads, out_dim, dtype=f32))
        width = heads * out_dim if concat else out_dim
        self.bias = nn.Parameter(torch.empty(width, dtype=f32)) if bias else None
        self.reset_parameters()

    @property
    def output_width(self) -> int:
        return self.heads * self.out_dim if self.concat else self.out_dim

    def reset_parameters(self) -> None:
        nn.init.xavier_uniform_(self.lin.weight)
        # Glorot on the [heads, out_dim] matrix, bound sqrt(6 / (heads +
        # out_dim)), as PyG's glorot on its [1, heads, out_dim] att_src/att_dst
        # (a [heads * out_dim, 1] view gave sqrt(6 / (heads * out_dim + 1))).
        for att in (self.att_src, self.att_dst):
            nn.init.xavier_uniform_(att)
        if self.bias is not None:
            nn.init.zeros_(self.bias)

    @property
    def transforms_sources(self) -> bool:
        """Always: every source row is projected and scored."""
        return True

    @property
    def message_width(self) -> int:
        """Width of :meth:`project`'s rows: all heads.

        The layer always projects first; ``projects_first`` tells a distributed
        engine whether to exchange projected rows, i.e. whether they are
        narrower."""
        return self.heads * self.out_dim

    # propagate() reads no destination input rows (no root term).
    reads_dst_rows = False

    def project(self, h: torch.Tensor) -> torch.Tensor:
        """Row-wise part a row's owner can apply: float [n, in] -> [n, heads * out]."""
        out: torch.Tensor = self.lin(h)
        return out

    def forward(
        self,
        mg: MessageGraph,
        h_src: torch.Tensor,
        *,
        src_ids: torch.Tensor | None = None,
        seed: int | None = None,
    ) -> torch.Tensor:
        """Attend over each destination's in-edges.

        Args:
            mg: message graph.
            h_src: float [num_src, in_dim].
            src_ids: int64 [num_src], the global node ID of every source row
                (destinations' as ``mg.dst_rows`` reads them); needed with
                ``seed``.
            seed: hash the attention dropout mask from this seed and the edges'
                global endpoints instead of drawing it.

        Returns:
            float [num_dst, heads * out_dim] if ``concat`` else [num_dst, out_dim].
        """
        return self.propagate(
            mg, self.project(h_src), mg.dst_rows(h_src), src_ids=src_ids, seed=seed
        )

    def propagate(
        self,
        mg: MessageGraph,
        m_src: torch.Tensor,
        h_dst: torch.Tensor | None,
        *,
        src_ids: torch.Tensor | None = None,
        seed: int | None = None,
    ) -> torch.Tensor:
        """The layer on projected source rows; other arguments as :meth:`forward`.

        ``m_src``: float [num_src, heads * out_dim], :meth:`project` of the
        source rows; ``h_dst`` is unused, GAT has no root term."""
        if seed is not None and src_ids is None:
            raise ValueError(
                "GATConv: seed (hashed attention dropout) needs src_ids, the "
                "global node ID of every source row"
            )
        z = m_src.view(-1, self.heads, self.out_dim)  # [S, H, F]
        # [S, H] and [D, H]
        score_src, score_dst = attention_scores(mg, z, self.att_src, self.att_dst)
        scores = score_src[mg.indices] + score_dst[mg.dst_of_edges]  # [E, H]
        scores = F.leaky_relu(scores, self.negative_slope)
        alpha = edge_softmax(mg, scores)
        if not self.training or self.attn_dropout == 0.0:
            pass
        elif seed is not None:
            assert src_ids is not None
            if src_ids.shape != (mg.num_src,):
                raise ValueError(
                    f"GATConv: src_ids: expected shape ({mg.num_src},) (num_src), "
                    f"found {tuple(src_ids.shape)}"
                )
            src, dst = src_ids[mg.indices], mg.dst_rows(src_ids)[mg.dst_of_edges]
            alpha = hashed_edge_dropout(alpha, self.attn_dropout, src, dst, seed)
        else:
            alpha = F.dropout(alpha, self.attn_dropout, True)
        out = spmm_sum(mg, z, alpha)  # [D, H, F]
        out = out.flatten(1) if self.concat else out.mean(1)
        if self.bias is not None:
            out = out + self.bias
        return out

    def extra_repr(self) -> str:
        return (
            f"{self.in_dim}, {self.out_dim}, heads={self.heads}, "
            f"concat={self.concat}, attn_dropout={self.attn_dropout}"
        )
