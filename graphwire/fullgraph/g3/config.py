"""`G3Config`: the settings of G3's engine (``--exchange g3``).

Each field carries its command-line flag, help, choices and bounds
(:func:`~graphwire.options.option`); an invalid value raises
:class:`~graphwire.options.OptionError` naming the field.
"""

from __future__ import annotations

from dataclasses import dataclass

from graphwire.fullgraph.staleness import (
    StalenessSpec,
    check_staleness,
    staleness_norm_option,
    staleness_option,
)
from graphwire.options import check_options, option

__all__ = ["LASTS", "MODES", "ORDERS", "SYNCS", "G3Config"]

# G3's ablation: which overlaps to keep (:mod:`graphwire.fullgraph.g3.schedule`).
MODES = ("full", "inter", "intra", "sequential")
# Parameter synchronisation (:mod:`graphwire.fullgraph.g3.sync`).
SYNCS = ("layer", "epoch")
# Node order (:mod:`graphwire.fullgraph.g3.bins`).
ORDERS = ("bfs", "priority")
# How the last layer computes (:mod:`graphwire.fullgraph.g3.sums`).
LASTS = ("sums", "bins")


@dataclass(frozen=True, kw_only=True, slots=True)
class G3Config:
    """G3's settings (see :mod:`graphwire.fullgraph.g3.engine`).

    Attributes:
        mode: which of G3's overlaps to keep: ``full`` (both), ``inter``
            (pipelined sends; a layer waits for all its halo rows), ``intra``
            (sends start with their layer; eager computation) or
            ``sequential`` (send everything, wait, compute).
        sync: ``layer`` (each layer's gradients start their all-reduce as
            soon as its backward is done) or ``epoch`` (one flat all-reduce
            after the backward).
        order: node order: ``bfs`` (G3's Step 1) or ``priority`` (most-needed
            rows first).
        last: how the last layer computes: ``sums`` (message by message as
            its halo rows arrive), ``bins``, or None (sums where they apply,
            else bins); sums where they do not apply is a ValueError naming
            why, when the engine meets the model.
        bin_rows: the most rows in a bin of a layer whose output is sent
            (G3's initial bin size; the bins of rows peers need ramp up to
            it from ``bin_rows / RAMP``).
        bin_mb: the memory budget of a bin in MiB, per layer from its widths
            (G3 uses half a GPU's memory; on CPU it bounds a bin's working
            set).
        staleness: the embedding staleness bound (``none``, ``epoch:K``,
            ``adaptive:K``, ``gap:X``) on the messages
            (:mod:`graphwire.fullgraph.g3.stale`).
        staleness_norm: how ``gap`` measures a message's move.
    """

    mode: str = option(
        "full",
        flag="--g3-mode",
        choices=MODES,
        help="G3 ablation: which overlaps to keep",
    )
    sync: str = option(
        "layer",
        flag="--g3-sync",
        choices=SYNCS,
        help="G3 parameter sync: each layer's gradients once its backward is "
        "done, or one all-reduce after the backward",
    )
    order: str = option(
        "bfs",
        flag="--g3-order",
        choices=ORDERS,
        help="G3 node order: BFS with rows that have remote neighbours first, "
        "or most-needed rows first",
    )
    last: str | None = option(
        None,
        flag="--g3-last",
        choices=LASTS,
        help="G3 last layer: summed message by message as its halo rows arrive, "
        "or in bins (unset: sums where they apply)",
    )
    bin_rows: int = option(
        32768,
        flag="--bin-rows",
        least=1,
        help="G3: most rows in a bin of a layer whose output is sent",
    )
    bin_mb: float = option(
        256.0,
        flag="--bin-mb",
        least=0,
        strict=True,
        help="G3: memory budget of a bin in MiB, sized per layer",
    )

    staleness: str = staleness_option()
    staleness_norm: str = staleness_norm_option()

    def __post_init__(self) -> None:
        check_options(self)
        check_staleness(self.staleness)

    @property
    def spec(self) -> StalenessSpec:
        return StalenessSpec.parse(self.staleness)
