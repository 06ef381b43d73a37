"""The PNG plots of ``graphwire simulate``: epoch time against workers, traffic
against switch memory, and the busiest switch queue over time.

Drawn on matplotlib's Agg canvas (no screen, no pyplot state) and written
atomically; a plot with nothing to show (one worker count, no switch, no
packet-level run) is not written.
"""

from __future__ import annotations

import re
from collections import defaultdict
from pathlib import Path

from matplotlib.figure import Figure

from graphwire.fsutil import atomic_file
from graphwire.simulate.study import Outcome

__all__ = ["write_plots"]

_DPI = 100
_MEMORY = re.compile(r"^(\S+) ([0-9.]+)MiB$")


def write_plots(outcomes: list[Outcome], folder: Path) -> list[Path]:
    """Write the plots ``outcomes`` have data for into ``folder``; their paths."""
    written = []
    for name, draw in (
        ("epoch_vs_workers.png", _epoch_vs_workers),
        ("traffic_vs_memory.png", _traffic_vs_memory),
        ("queue.png", _queue),
    ):
        figure = Figure(figsize=(6.4, 4.0))
        if draw(figure, outcomes):
            path = folder / name
            with atomic_file(path, "wb") as out:
                figure.savefig(out, format="png", dpi=_DPI, bbox_inches="tight")
            written.append(path)
    return written


def _epoch_vs_workers(figure: Figure, outcomes: list[Outcome]) -> bool:
    lines: dict[str, list[tuple[int, float]]] = defaultdict(list)
    for o in outcomes:
        lines[f"{o.label} ({o.simulator})"].append((o.workers, o.epoch_s * 1e3))
    if len({o.workers for o in outcomes}) < 2:
        return False
    axes = figure.subplots()
    for label, points in lines.items():
        points.sort()
        axes.plot(*zip(*points, strict=True), marker="o", label=label)
    axes.set(title="simulated epoch", xlabel="workers", ylabel="epoch time (ms)")
    axes.grid(alpha=0.3)
    axes.legend(fontsize="small")
    return True


def _traffic_vs_memory(figure: Figure, outcomes: list[Outcome]) -> bool:
    workers = max(o.workers for o in outcomes)
    lines: dict[str, list[tuple[float, float]]] = defaultdict(list)
    flat: dict[str, float] = {}
    for o in outcomes:
        if o.workers != workers:
            continue
        m = _MEMORY.match(o.label)
        if m:
            lines[m.group(1)].append((float(m.group(2)), o.bytes / 2**20))
        else:
            flat[o.label] = o.bytes / 2**20
    if not lines:
        return False
    axes = figure.subplots()
    for label, points in lines.items():
        points = sorted(set(points))
        axes.plot(*zip(*points, strict=True), marker="o", label=label)
    for k, (label, mib) in enumerate(sorted(flat.items())):
        axes.axhline(mib, linestyle="--", color=f"C{k + len(lines)}", label=label)
    axes.set(
        title=f"epoch traffic, {workers} workers",
        xlabel="switch aggregator memory (MiB)",
        ylabel="bytes sent (MiB)",
    )
    axes.grid(alpha=0.3)
    axes.legend(fontsize="small")
    return True


def _queue(figure: Figure, outcomes: list[Outcome]) -> bool:
    traced = [o for o in outcomes if o.queue_trace.shape[0] > 1]
    if not traced:
        return False
    workers = max(o.workers for o in traced)
    axes = figure.subplots()
    for o in traced:
        if o.workers == workers:
            trace = o.queue_trace
            axes.plot(trace[:, 0] * 1e3, trace[:, 1] / 2**10, label=o.label)
    axes.set(
        title=f"busiest switch queue (ns-3), {workers} workers",
        xlabel="time (ms)",
        ylabel="queue (KiB)",
    )
    axes.grid(alpha=0.3)
    axes.legend(fontsize="small")
    return True
