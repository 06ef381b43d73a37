"""Console output shared by the subcommands: tables, spinners, progress bars."""

from __future__ import annotations

import os
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TextColumn,
    TimeElapsedColumn,
)
from rich.table import Table

from graphwire.cli import check_out_path
from graphwire.fsutil import check_replaceable
from graphwire.graph.datasets import load_dataset, spec_paths
from graphwire.graph.graph import Graph

console = Console(highlight=False)

# How the commands number rows when --node-order is left out (partition, and
# the graph or parts train writes): reverse Cuthill-McKee.
NODE_ORDER = "rcm"


def print_table(
    title: str,
    columns: Sequence[str],
    rows: Sequence[Sequence[Any]],
    text_columns: int = 1,
) -> None:
    """A rich table: the first ``text_columns`` columns left-aligned, the rest
    (numbers) right-aligned."""
    table = Table(title=title, title_justify="left")
    for index, column in enumerate(columns):
        table.add_column(column, justify="left" if index < text_columns else "right")
    for row in rows:
        table.add_row(*(_cell(value) for value in row))
    console.print(table)


def _cell(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.4g}" if abs(value) < 1e4 else f"{value:,.0f}"
    if isinstance(value, int):
        return f"{value:,}"
    return str(value)


@contextmanager
def step(message: str, quiet: bool = False) -> Iterator[None]:
    """A spinner while a long single step runs, then its duration."""
    start = time.perf_counter()
    if quiet:
        yield
    else:
        with console.status(message):
            yield
        console.print(f"{message} done in {time.perf_counter() - start:.1f}s")


def epoch_progress(total: int, quiet: bool = False) -> Progress:
    return Progress(
        TextColumn("[bold]{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("{task.fields[status]}"),
        TimeElapsedColumn(),
        console=console,
        disable=quiet,
        transient=False,
    )


def check_out(out: str, dataset: str, overwrite: bool) -> None:
    """Refuse an ``--out`` that would destroy the input or something not ours.

    Run before any work, so a refusal costs nothing. ``out`` may not be the
    input ``dataset`` reads, contain it, or lie inside it, nor lie under a
    file (:func:`~graphwire.cli.check_out_path`); an existing ``out`` needs
    ``--overwrite`` and must be a folder graphwire wrote.

    Raises:
        ValueError: ``out`` overlaps the input, lies under a file, or is not
            graphwire's to replace.
        FileExistsError: ``out`` exists and ``overwrite`` is false.
    """
    check_not_input(out, dataset, f"--out {out}")
    check_out_path(out)  # a path under a file, or in a folder not ours to write
    check_replaceable(out, overwrite, flag="--overwrite")


def check_not_input(folder: str | Path, dataset: str, what: str) -> None:
    """Refuse a ``folder`` to be written that is the input ``dataset`` reads,
    contains it, or lies inside it; ``what`` names the folder in the error.

    Raises:
        ValueError: ``folder`` overlaps the input.
    """
    # Paths as given (a link is the input's name here) and as resolved.
    targets = {Path(os.path.abspath(folder)), Path(folder).resolve()}
    for given in spec_paths(dataset):
        for source in {Path(os.path.abspath(given)), given.resolve()}:
            if any(t == source or t in source.parents for t in targets):
                raise ValueError(
                    f"{what}: holds the input of --dataset {dataset}, "
                    "refusing to replace it; write the output somewhere else"
                )
            if any(source in t.parents for t in targets):
                raise ValueError(
                    f"{what}: lies inside the input of --dataset {dataset}; "
                    "write the output somewhere else"
                )


def load_with_status(spec: str, quiet: bool = False, verify: bool = False) -> Graph:
    with step(f"{'verifying' if verify else 'loading'} {spec}", quiet):
        return load_dataset(spec, verify=verify)


def graph_rows(graph: Graph) -> list[tuple[str, Any]]:
    degrees = graph.in_degrees().float()
    rows: list[tuple[str, Any]] = [
        ("name", graph.name),
        ("nodes", graph.num_nodes),
        ("edges (directed)", graph.num_edges),
        ("features", graph.num_features),
        ("classes", graph.num_classes),
        ("mean in-degree", float(degrees.mean()) if graph.num_nodes else 0.0),
        ("max in-degree", int(degrees.max()) if graph.num_nodes else 0),
        ("isolated nodes", int((graph.in_degrees() + graph.out_degrees() == 0).sum())),
    ]
    for split in ("train_idx", "val_idx", "test_idx"):
        index = getattr(graph, split)
        rows.append((split.replace("_idx", ""), 0 if index is None else index.numel()))
    return rows


def check_trainable_dataset(graph: Graph, dataset: str) -> None:
    """Refuse ``graph`` (from ``--dataset dataset``) before anything is
    written for the run unless it has features, labels and three non-empty
    splits."""
    from graphwire.run.training import check_trainable

    if graph.x is None or graph.y is None or graph.train_idx is None:
        raise ValueError(
            f"dataset {dataset}: training needs features, labels and a split "
            "(for R-MAT add features=F&classes=C to the spec)"
        )
    check_trainable(graph)


def check_partition_method(method: str | None, flag: str = "--partition") -> None:
    """``method`` (from ``flag``) must name a registered partitioner; checked
    before any data is read."""
    if method is None:
        return
    from graphwire.partition import PARTITIONERS

    if method not in PARTITIONERS:
        known = ", ".join(sorted(PARTITIONERS))
        raise ValueError(f"{flag} {method}: unknown; expected one of {known}")
