"""``graphwire report RUN [RUN ...]``: runs compared in a Markdown table and
PNG plots, from their ``metrics.jsonl`` alone.

Every run is read (and refused, naming its file, if it cannot be) before
anything is written; ``report.md`` (the table, with the plots linked) and the
PNGs of :data:`~graphwire.run.plots.PLOTS` then go to ``--out``: by default
the run's folder, or with several runs the first run's, whose own report
they replace. The table is printed too.
"""

from __future__ import annotations

import argparse
from collections import Counter
from pathlib import Path

from graphwire.fsutil import atomic_file, check_creatable
from graphwire.run.plots import write_plots
from graphwire.run.report import RunSummary, markdown_table, read_run

__all__ = ["run"]


def run(args: argparse.Namespace) -> int:
    folders = [Path(given) for given in args.runs]
    out = Path(args.out) if args.out else folders[0]
    check_creatable(out, f"--out {args.out}" if args.out else str(out))
    runs = [read_run(folder, name) for folder, name in _names(folders)]
    table = markdown_table(runs)
    with atomic_file(out / "report.md") as handle:
        handle.write(_document(runs, table))
    written = write_plots(runs, out)
    print(table, end="")
    print(f"report: {out / 'report.md'}; plots: {', '.join(p.name for p in written)}")
    return 0


def _names(folders: list[Path]) -> list[tuple[Path, str]]:
    """Each run folder with its label: the folder's name, or the path as
    given where two runs' folders share a name."""
    names = [folder.resolve().name for folder in folders]
    shared = {name for name, count in Counter(names).items() if count > 1}
    return [
        (folder, str(folder) if name in shared else name)
        for folder, name in zip(folders, names, strict=True)
    ]


def _document(runs: list[RunSummary], table: str) -> str:
    """``report.md``: the table, what its columns count, and the plots."""
    plural = "s" if len(runs) > 1 else ""
    return (
        f"# graphwire report: {len(runs)} run{plural}\n\n{table}\n"
        "Time shares are of all ranks' epoch time; bytes are all ranks' bytes "
        "sent per epoch, by training tag (not `eval.*`, `meta.*` or "
        "`sync.metrics`); remote rows, test accuracy and the epoch time are "
        "the run's summary; `-`: the run has no such figure.\n\n"
        "![loss and accuracy per epoch](loss_acc.png)\n\n"
        "![time split per rank](time_split.png)\n\n"
        "![bytes by tag and by peer](bytes_heatmap.png)\n"
    )
