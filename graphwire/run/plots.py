"""The PNG plots of a run report: loss and accuracy per epoch, time split per
rank, and bytes per layer and per peer, drawn from :class:`RunSummary`.

Each file holds every run of the report: the loss and accuracy plot a line per
run, the others a panel per run (the time split three panels a row, the heat
maps a row per run). Figures are drawn on matplotlib's Agg canvas (no screen,
no pyplot state) at :data:`DPI`, so a file's pixel size is
:func:`figure_inches` times :data:`DPI`, and written atomically.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from pathlib import Path

from matplotlib.axes import Axes
from matplotlib.figure import Figure
from matplotlib.patches import Patch
from matplotlib.ticker import FuncFormatter

from graphwire.fsutil import atomic_file
from graphwire.run.report import PHASES, RunSummary
from graphwire.units import format_bytes

__all__ = ["DPI", "PLOTS", "figure_inches", "write_plots"]

DPI = 100
_PER_ROW = 3  # time-split panels in a row
_PANEL = (4.5, 3.6)  # inches of one run's panel
_ANNOTATED = 8  # heat maps up to this many rows and columns print their cells
# A colour per phase, the same in every panel.
_COLOURS = dict(zip(PHASES, [f"C{i}" for i in range(len(PHASES))], strict=True))


def figure_inches(name: str, num_runs: int) -> tuple[float, float]:
    """Width and height, in inches, of plot ``name`` for ``num_runs`` runs."""
    width, height = _PANEL
    if name == "loss_acc.png":
        return 2 * width, height
    if name == "time_split.png":
        columns = min(num_runs, _PER_ROW)
        return width * columns, height * math.ceil(num_runs / _PER_ROW)
    if name == "bytes_heatmap.png":
        return 2 * width, height * num_runs
    raise KeyError(name)


def _loss_acc(figure: Figure, runs: list[RunSummary]) -> None:
    loss, acc = figure.subplots(1, 2)
    for run in runs:
        # Markers: with --eval-every K, accuracy is a point every K epochs.
        loss.plot(run.epochs, run.loss, marker=".", label=run.name)
        acc.plot(run.epochs, run.val_acc, marker=".", label=run.name)
    loss.set(title="training loss", xlabel="epoch", ylabel="loss (mean over ranks)")
    acc.set(title="validation accuracy", xlabel="epoch", ylabel="accuracy")
    for axes in (loss, acc):
        axes.xaxis.get_major_locator().set_params(integer=True)
        axes.grid(alpha=0.3)
    acc.legend(fontsize="small")


def _time_split(figure: Figure, runs: list[RunSummary]) -> None:
    rows = math.ceil(len(runs) / _PER_ROW)
    panels = list(figure.subplots(rows, min(len(runs), _PER_ROW), squeeze=False).flat)
    for axes, run in zip(panels, runs, strict=False):
        ranks = range(len(run.seconds))
        bottom = [0.0] * len(run.seconds)
        for phase in run.phases:
            per_epoch = [r[phase] / len(run.epochs) for r in run.seconds]
            axes.bar(
                ranks, per_epoch, bottom=bottom, label=phase, color=_COLOURS[phase]
            )
            bottom = [b + s for b, s in zip(bottom, per_epoch, strict=True)]
        axes.set(title=run.name, xlabel="rank", ylabel="seconds per epoch")
        axes.set_xticks(list(ranks))
    for axes in panels[len(runs) :]:  # a last row's unused panels
        axes.set_axis_off()
    phases = [p for p in PHASES if any(p in run.phases for run in runs)]
    handles = [Patch(color=_COLOURS[p], label=p) for p in phases]
    figure.legend(handles=handles, loc="outside upper center", ncols=len(phases))


def _bytes_heatmap(figure: Figure, runs: list[RunSummary]) -> None:
    panels = figure.subplots(len(runs), 2, squeeze=False)
    for (by_layer, by_peer), run in zip(panels, runs, strict=True):
        tags = list(run.bytes_by_rank)
        _heatmap(
            by_layer,
            [run.bytes_by_rank[tag] for tag in tags],
            rows=tags,
            columns=[str(r) for r in range(run.workers)],
        )
        by_layer.set(
            title=f"{run.name}: training bytes/epoch by tag",
            xlabel="sending rank",
        )
        ranks = [str(r) for r in range(len(run.bytes_by_peer))]
        _heatmap(by_peer, run.bytes_by_peer, rows=ranks, columns=ranks)
        by_peer.set(
            title=f"{run.name}: bytes/epoch by peer",
            xlabel="to rank",
            ylabel="from rank",
        )


def _heatmap(
    axes: Axes, values: list[list[float]], rows: list[str], columns: list[str]
) -> None:
    """``values[row][column]`` as colours, with a colour bar; a run without
    traffic (one process) says so instead."""
    if not any(any(row) for row in values):
        axes.text(0.5, 0.5, "no traffic", ha="center", va="center")
        axes.set_xticks([])
        axes.set_yticks([])
        return
    image = axes.imshow(values, cmap="viridis", aspect="auto", vmin=0)
    bar = axes.figure.colorbar(image, ax=axes)
    bar.formatter = FuncFormatter(lambda value, _: format_bytes(value))
    bar.update_ticks()
    axes.set_xticks(range(len(columns)), columns)
    axes.set_yticks(range(len(rows)), rows)
    if len(rows) <= _ANNOTATED and len(columns) <= _ANNOTATED:
        top = max(max(row) for row in values)
        for i, row in enumerate(values):
            for j, value in enumerate(row):
                colour = "black" if value > top / 2 else "white"
                axes.text(
                    j,
                    i,
                    format_bytes(value),
                    ha="center",
                    va="center",
                    color=colour,
                    fontsize="x-small",
                )


PLOTS: dict[str, Callable[[Figure, list[RunSummary]], None]] = {
    "loss_acc.png": _loss_acc,
    "time_split.png": _time_split,
    "bytes_heatmap.png": _bytes_heatmap,
}


def write_plots(runs: list[RunSummary], folder: Path) -> list[Path]:
    """Draw every plot of :data:`PLOTS` for ``runs`` into ``folder``; the
    files written, in :data:`PLOTS` order."""
    written = []
    for name, draw in PLOTS.items():
        figure = Figure(
            figsize=figure_inches(name, len(runs)), dpi=DPI, layout="constrained"
        )
        draw(figure, runs)
        path = folder / name
        with atomic_file(path, "wb") as handle:
            figure.savefig(handle, format="png", dpi=DPI)
        written.append(path)
    return written
