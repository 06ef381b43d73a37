"""``graphwire data generate|info|verify``."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any, NoReturn

import numpy as np

from graphwire.run.console import (
    console,
    graph_rows,
    load_with_status,
    print_table,
    step,
)
from graphwire.run.outputs import check_out


def generate(args: argparse.Namespace) -> int:
    from graphwire.graph.native import save_graph

    check_out(args.out, args.dataset, args.overwrite)
    graph = load_with_status(args.dataset, args.quiet)
    with step(f"writing {args.out}", args.quiet):
        save_graph(graph, args.out, overwrite=args.overwrite)
    print_table("graph", ["field", "value"], graph_rows(graph))
    console.print(f"saved to {args.out}")
    return 0


def info(args: argparse.Namespace) -> int:
    graph = load_with_status(args.dataset, args.quiet)
    print_table("graph", ["field", "value"], graph_rows(graph))
    return 0


def verify(args: argparse.Namespace) -> int:
    """Check a graphwire folder's files against the SHA-256 sums its
    ``meta.json`` records: every part of a partitioned folder, or a graph
    folder's arrays (a loader checks sizes, types and IDs, not every byte:
    this finds a file changed in place)."""
    from graphwire.graph.native import is_graph_folder, load_graph
    from graphwire.partition.format import (
        is_partitioned_folder,
        load_part,
        load_partition_meta,
    )

    folder = args.dataset
    if is_graph_folder(folder):
        with step(f"checking {folder}", args.quiet):
            load_graph(folder, verify=True)
        console.print(f"{folder}: every array matches its checksum", soft_wrap=True)
        return 0
    if not is_partitioned_folder(folder):
        _say_why_not_verifiable(Path(folder))
    meta = load_partition_meta(folder)
    parts, num_nodes = meta["num_parts"], meta["num_nodes"]
    owners = np.zeros(num_nodes, dtype=np.int64)  # parts owning each node
    top = -1  # the largest label
    for part in range(parts):
        with step(f"checking part {part} of {parts}", args.quiet):
            local = load_part(folder, part, verify=True)
        owners += np.bincount(local.orig_nid.numpy(), minlength=num_nodes)
        if local.y is not None and local.y.numel():
            top = max(top, int(local.y.max()))
    _check_whole(Path(folder), meta, owners, top)
    console.print(
        f"{folder}: all {parts} parts match their checksums, and together "
        "they own every node once",
        soft_wrap=True,
    )
    return 0


def _check_whole(folder: Path, meta: dict[str, Any], owners: Any, top: int) -> None:
    """What no part alone shows: every node owned by exactly one part (by
    the parts' ``orig_nid``), and ``num_classes`` the largest label + 1 (as
    a graph folder's must be)."""
    from graphwire.graph.errors import DatasetError

    twice, never = np.flatnonzero(owners > 1), np.flatnonzero(owners == 0)
    if twice.size or never.size:
        said = [
            f"{what} {ids.size} node(s), such as {int(ids[0])}"
            for what, ids in (("own more than once", twice), ("miss", never))
            if ids.size
        ]
        raise DatasetError(
            folder,
            f"the parts' orig_nid {' and '.join(said)}: every node of the graph "
            "belongs to exactly one part",
        )
    if top >= 0 and meta["num_classes"] != top + 1:
        raise DatasetError(
            folder / "meta.json",
            f"num_classes is {meta['num_classes']}, but the labels run to {top} "
            f"(expected {top + 1})",
        )


def _say_why_not_verifiable(folder: Path) -> NoReturn:
    """Raise, naming what makes ``folder`` neither a graph folder nor a
    partitioned one: its absence, its ``meta.json``, or a missing part."""
    from graphwire.graph.native import read_meta
    from graphwire.partition.format import FORMAT, load_partition_meta, part_folder

    if not folder.exists():
        raise ValueError(
            f"--dataset {folder}: no such folder (verify checks a folder from "
            "graphwire data generate or partition: only those record checksums)"
        )
    if (folder / "meta.json").is_file():
        if _format(folder / "meta.json") == FORMAT:
            load_partition_meta(folder)  # raises naming what is wrong with it
            raise ValueError(f"--dataset {folder}: {part_folder(folder, 0)} is missing")
        read_meta(folder)  # as a graph folder's: raises naming what is wrong
    raise ValueError(
        f"--dataset {folder}: not a graphwire folder (from graphwire data "
        "generate or partition); only those record checksums"
    )


def _format(meta: Path) -> Any:
    """The ``format`` that ``meta`` (a ``meta.json``) names; None if none."""
    try:
        return json.loads(meta.read_text(encoding="utf-8")).get("format")
    except (OSError, ValueError, RecursionError, AttributeError):
        return None
