"""G3's parameter synchronisation: when the gradients are summed over ranks.

- ``epoch`` (:class:`EpochSync`): one flat all-reduce of every gradient after
  the backward (tag ``sync.grad``).
- ``layer`` (:class:`LayerSync`, G3 §6.2): as soon as a layer's gradients are
  complete they start their all-reduce (tag ``sync.grad.L{l}``,
  non-blocking), which completes once every rank has finished that layer,
  while the layers below run their backward. The sums are bitwise those of
  one flat all-reduce.

Either way the engine's ``sync_gradients`` collects them before the one
optimizer step of the epoch (:meth:`EpochSync.collect`).
"""

from __future__ import annotations

import torch
from torch import nn

from graphwire.comm.base import PendingSum, Transport
from graphwire.run.collective import assign_gradients, flat_gradients, sum_gradients

__all__ = ["GRADIENT_SYNCS", "EpochSync", "LayerSync"]


class EpochSync:
    """Every gradient summed in one flat all-reduce after the backward.

    Args:
        transport: this rank's transport.
    """

    def __init__(self, transport: Transport) -> None:
        self.transport = transport

    @property
    def pending(self) -> bool:
        """Whether sums started in a backward are still to be collected."""
        return False

    def layer_done(self, index: int, layer: nn.Module, phase: str) -> None:
        """Layer ``index``'s gradients are complete (the backward's tag
        ``phase``: "" while training)."""

    def collect(self, model: nn.Module) -> None:
        """After the backward: every gradient of ``model`` summed over ranks."""
        params = list(model.parameters())
        if params:
            sum_gradients(params, self.transport, "sync.grad")


class LayerSync(EpochSync):
    """Each layer's gradients summed as soon as they are complete."""

    def __init__(self, transport: Transport) -> None:
        super().__init__(transport)
        # The sums in flight: (parameters, pending sum).
        self._sums: list[tuple[list[torch.Tensor], PendingSum]] = []

    @property
    def pending(self) -> bool:
        return bool(self._sums)

    def layer_done(self, index: int, layer: nn.Module, phase: str) -> None:
        """Start the sum of ``layer``'s gradients (training only); the sums
        started before it move on to their second phase."""
        params: list[torch.Tensor] = [p for p in layer.parameters() if p.requires_grad]
        if phase or not params:
            return
        for _, pending in self._sums:
            pending.advance()
        flat = flat_gradients(params)
        tag = f"sync.grad.L{index}"
        self._sums.append((params, self.transport.start_all_reduce_sum(flat, tag)))

    def collect(self, model: nn.Module) -> None:
        """Collect the layer-wise sums, then sum any gradient no layer covered
        (one flat all-reduce)."""
        synced: set[int] = set()
        for params, pending in self._sums:
            total = pending.wait()
            assign_gradients(params, total)
            synced.update(id(p) for p in params)
        self._sums.clear()
        rest = [p for p in model.parameters() if id(p) not in synced]
        if rest:
            sum_gradients(rest, self.transport, "sync.grad")


# The synchronisations by name (G3Config.sync).
GRADIENT_SYNCS: dict[str, type[EpochSync]] = {"layer": LayerSync, "epoch": EpochSync}
