"""What commands print: tables, spinners, progress bars, the dataset's figures."""

from __future__ import annotations

import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
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

from graphwire.graph.datasets import load_dataset, parse_spec
from graphwire.graph.graph import Graph
from graphwire.graph.links import check_splittable
from graphwire.run.config import TrainConfig

__all__ = [
    "check_trainable_dataset",
    "console",
    "epoch_progress",
    "graph_rows",
    "load_with_status",
    "print_table",
    "step",
]

console = Console(highlight=False)


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


def check_trainable_dataset(
    graph: Graph, dataset: str, config: TrainConfig | None = None
) -> tuple[int, int] | None:
    """Refuse ``graph`` (from ``--dataset dataset``) before anything is
    written for the run unless it has features, labels and three non-empty
    splits (``config``'s task link: features, and edges to hold out, whose
    ``(val, test)`` counts it returns)."""
    from graphwire.run.training import check_trainable

    if config is not None and config.task == "link":
        if graph.x is None:
            raise ValueError(f"dataset {dataset}: --task link needs node features (x)")
        # a run that cannot hold out edges writes nothing
        return check_splittable(graph, config.val_edges, config.test_edges)

    lacks = [
        what
        for what, value in (
            ("features (x)", graph.x),
            ("labels (y)", graph.y),
            ("train split (train_idx)", graph.train_idx),
        )
        if value is None
    ]
    if lacks:
        why = _UNTRAINABLE.get(parse_spec(dataset)[0], _NEEDS)
        raise ValueError(f"dataset {dataset}: {why.format(lacks=', '.join(lacks))}")
    check_trainable(graph)
    return None


_NEEDS = "training needs features, labels and a split, and it has no {lacks}"
# Why a dataset of this scheme lacks node data, and how to give it.
_UNTRAINABLE = {
    "synthetic": _NEEDS + " (for R-MAT add features=F&classes=C to the spec)",
    "edgelist": (
        "an edge list carries edges only, no features, labels or splits, which "
        "training needs; save the edges with them as an .npz (np.savez(FILE, "
        "src=, dst=, x=, y=, train_idx=, val_idx=, test_idx=); "
        "docs/data-formats.md, 'Bringing your own data') and pass --dataset "
        "npz:FILE"
    ),
}
