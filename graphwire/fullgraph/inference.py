"""`ExactInference`: full-graph logits of a rank's owned nodes, for loops that
train another way (mini-batch).

The model runs on the whole graph, layer by layer, through the ``halo``
engine with dropout off, as the single-process loops evaluate: exact and
deterministic, with the halo's rows exchanged under ``eval.*`` tags. The
engine, and the plans its set-up exchanges, are made at the first
evaluation, so a run that evaluates only at its end sends nothing for it
before then.
"""

from __future__ import annotations

import torch

from graphwire.comm.base import Transport
from graphwire.fullgraph.base import Engine
from graphwire.fullgraph.distributed import build_engine, forward_loss
from graphwire.nn.models import GNN
from graphwire.partition.local import LocalPart
from graphwire.run.config import TrainConfig

__all__ = ["ExactInference"]


class ExactInference:
    """Owned logits [num_owned, C] of ``model`` on the whole graph (collective).

    Args:
        part: this rank's part.
        transport: connects the ranks.
        config: the model's settings (which graph its layers aggregate over).
    """

    def __init__(self, part: LocalPart, transport: Transport, config: TrainConfig):
        self.part, self.transport, self.config = part, transport, config
        self.engine: Engine | None = None  # made by the first call

    def __call__(self, model: GNN) -> torch.Tensor:
        """Collective: every rank evaluates after the same epochs."""
        if self.engine is None:
            # No backward, so no loss rows to plan gradient returns for.
            self.engine = build_engine(
                self.part, self.transport, self.config, "halo", {"loss_rows": None}
            )
            self.engine.phase = "eval."
        model.eval()
        with torch.no_grad():
            logits, _ = forward_loss(self.engine, model, 1, None)
        return logits
