"""Link prediction's model and scores: an encoder and an edge decoder.

The encoder is any :class:`~graphwire.nn.models.GNN` whose output is a node
embedding; the decoder scores a pair of embeddings with a logit (PyG's
``GAE`` and DGL's link-prediction examples do the same):

- ``dot``: ``<h_u, h_v>``, no parameters;
- ``mlp``: ``MLP(h_u * h_v)``, two linear layers with a ReLU between.

Training minimises binary cross-entropy with logits: positives labelled 1,
negatives 0. :func:`link_metrics` scores held-out pairs, each positive
against its own negatives.

Shapes (P pairs, D embedding width, R negatives per positive):
    decoder(h_src [P, D], h_dst [P, D]) -> float [P] logits
    link_metrics(pos [M], neg [M, R])   -> auc, mrr, hits@K
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from graphwire.nn.models import GNN

__all__ = ["DECODERS", "HITS_AT", "LinkModel", "link_loss", "link_metrics"]

DECODERS = ("dot", "mlp")
HITS_AT = (1, 10)


class DotDecoder(nn.Module):
    def forward(self, h_src: torch.Tensor, h_dst: torch.Tensor) -> torch.Tensor:
        return (h_src * h_dst).sum(-1)


class MLPDecoder(nn.Module):
    def __init__(self, dim: int) -> None:
        super().__init__()
        self.hidden = nn.Linear(dim, dim)
        self.out = nn.Linear(dim, 1)

    def forward(self, h_src: torch.Tensor, h_dst: torch.Tensor) -> torch.Tensor:
        return self.out(F.relu(self.hidden(h_src * h_dst))).squeeze(-1)


class LinkModel(nn.Module):
    """An encoder's embeddings scored pairwise by a decoder.

    Args:
        encoder: the GNN (its output width is the embedding's, ``dim``).
        decoder: ``"dot"`` or ``"mlp"``.
        dim: the embedding width.
    """

    def __init__(self, encoder: GNN, decoder: str, dim: int) -> None:
        super().__init__()
        if decoder not in DECODERS:
            raise ValueError(f"decoder: expected one of {DECODERS}, got {decoder!r}")
        self.encoder = encoder
        self.decoder: nn.Module = DotDecoder() if decoder == "dot" else MLPDecoder(dim)

    def forward(self, *args: object, **kwargs: object) -> torch.Tensor:
        """The encoder's embeddings (its arguments)."""
        return self.encoder(*args, **kwargs)

    def score(self, h: torch.Tensor, pairs: torch.Tensor) -> torch.Tensor:
        """float [P] logits of ``pairs`` int64 [2, P], rows of ``h``."""
        return self.decoder(h.index_select(0, pairs[0]), h.index_select(0, pairs[1]))


def link_loss(logits: torch.Tensor, num_pos: int) -> torch.Tensor:
    """Mean binary cross-entropy: the first ``num_pos`` logits are positives."""
    labels = torch.zeros_like(logits)
    labels[:num_pos] = 1.0
    return F.binary_cross_entropy_with_logits(logits, labels)


def link_metrics(pos: torch.Tensor, neg: torch.Tensor) -> dict[str, float]:
    """Ranking metrics of held-out positives, each against its own negatives.

    Args:
        pos: float [M] positive logits.
        neg: float [M, R] logits of each positive's negatives.

    Returns:
        ``auc``: the chance a positive outscores a negative (all positives
        against all negatives; ties count half); ``mrr``: the mean of
        ``1 / rank`` of each positive among its negatives (ties: the
        pessimistic middle, as OGB); ``hits@K``: the share ranked within
        the top ``K``; and ``loss``, the binary cross-entropy over all.
    """
    pos, neg = pos.double(), neg.double()
    flat = neg.reshape(-1)
    ranked = flat.sort().values
    below = torch.searchsorted(ranked, pos, right=False).double()
    ties = torch.searchsorted(ranked, pos, right=True).double() - below
    auc = float((below + ties / 2).sum() / max(1, pos.numel() * flat.numel()))
    higher = (neg > pos.unsqueeze(1)).sum(1).double()
    tied = (neg == pos.unsqueeze(1)).sum(1).double()
    rank = 1 + higher + tied / 2
    logits = torch.cat([pos, flat])
    out = {
        "auc": auc,
        "mrr": float((1 / rank).mean()) if rank.numel() else 0.0,
        "loss": float(link_loss(logits, pos.numel())),
    }
    for k in HITS_AT:
        out[f"hits@{k}"] = float((rank <= k).double().mean()) if rank.numel() else 0.0
    return out
