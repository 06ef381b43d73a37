"""G3's ablation modes as schedules: when rows are sent, when a bin computes.

G3 hides the halo rows' transfer behind computation in two ways, and each mode
(:data:`~graphwire.fullgraph.g3.config.MODES`, G3's ablation) keeps some:

- **Inter-layer pipelining** (:class:`PipelinedSends`). As soon as a bin of
  layer ``l`` is computed, the rows of it that peers read at layer ``l + 1``
  leave, one message per (bin, peer), while later bins compute; the receives
  for layer ``l + 1`` are posted then. Without it (:class:`LayerSends`), a
  layer sends all its rows when it starts.
- **Intra-layer eager computation** (:class:`EagerBins`). Bins whose inputs
  are all owned compute first, while halo rows are in flight; each bin that
  reads halo rows waits only for the messages carrying its own. Without it
  (:class:`WaitingBins`), a layer waits for all its halo rows before any bin
  computes.

``full`` keeps both, ``inter`` the pipelining, ``intra`` the eager
computation, ``sequential`` neither (send everything, wait, compute): see
:data:`SCHEDULES`. The backward is the same in every mode.

The engine calls, for each layer ``l`` whose halo rows are exchanged, once its
receives are posted: ``sends.start`` then ``bins.start``; for each bin in
order: ``bins.before``, the bin, then (below the last layer)
``sends.after``; at the layer's end, once all its messages are in,
``sends.end``.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from graphwire.fullgraph.g3.bins import Bin
from graphwire.fullgraph.g3.config import MODES
from graphwire.fullgraph.g3.wire import Wire

__all__ = [
    "SCHEDULES",
    "BinPolicy",
    "EagerBins",
    "LayerSends",
    "PipelinedSends",
    "Schedule",
    "SendPolicy",
    "WaitingBins",
]


class SendPolicy:
    """When a layer's rows leave for the peers that read them."""

    def start(self, wire: Wire, index: int, rows: torch.Tensor) -> None:
        """Layer ``index`` starts; ``rows`` are its owned source rows."""

    def after(self, wire: Wire, index: int, b: int, rows: torch.Tensor) -> None:
        """Bin ``b`` of layer ``index`` (not the last) handed on ``rows``,
        layer ``index + 1``'s source rows, in bin order."""

    def end(self, wire: Wire, last: bool) -> None:
        """A layer (the ``last`` one or not) is done and its messages are in."""


class PipelinedSends(SendPolicy):
    """Each bin's rows leave as soon as it is computed, for the layer above;
    the input layer's all at once when it starts. Sends stay in flight while
    the next layer computes; the forward returns once all are complete."""

    def start(self, wire: Wire, index: int, rows: torch.Tensor) -> None:
        if index == 0:  # no layer below computed them
            wire.send_all(index, rows)

    def after(self, wire: Wire, index: int, b: int, rows: torch.Tensor) -> None:
        wire.post(index + 1, rows.shape[1], rows)
        wire.send_bin(index + 1, b, rows)

    def end(self, wire: Wire, last: bool) -> None:
        if last:
            wire.drain()


class LayerSends(SendPolicy):
    """A layer sends all its rows when it starts; they are all complete when
    it ends."""

    def start(self, wire: Wire, index: int, rows: torch.Tensor) -> None:
        wire.send_all(index, rows)

    def end(self, wire: Wire, last: bool) -> None:
        wire.drain()


class BinPolicy:
    """When a bin may compute.

    Attributes:
        eager: whether bins compute before all their layer's halo rows are in
            (a layer summed message by message needs it).
    """

    eager = False

    def start(self, wire: Wire, index: int) -> None:
        """Layer ``index`` starts (its receives are posted)."""

    def before(self, wire: Wire, index: int, bin_: Bin) -> None:
        """Bin ``bin_`` of layer ``index`` is next."""


class EagerBins(BinPolicy):
    """A bin computes once the messages carrying its halo rows are in."""

    eager = True

    def before(self, wire: Wire, index: int, bin_: Bin) -> None:
        if bin_.needs:
            wire.wait(index, bin_.needs)


class WaitingBins(BinPolicy):
    """A layer's bins compute once all its halo rows are in."""

    def start(self, wire: Wire, index: int) -> None:
        wire.wait(index, None)


@dataclass(frozen=True)
class Schedule:
    """One mode: when rows are sent, and when a bin may compute."""

    sends: SendPolicy
    bins: BinPolicy


# The modes by name (G3Config.mode).
SCHEDULES: dict[str, Schedule] = {
    "full": Schedule(PipelinedSends(), EagerBins()),
    "inter": Schedule(PipelinedSends(), WaitingBins()),
    "intra": Schedule(LayerSends(), EagerBins()),
    "sequential": Schedule(LayerSends(), WaitingBins()),
}
assert tuple(SCHEDULES) == MODES
