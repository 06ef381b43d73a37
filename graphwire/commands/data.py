"""``graphwire data generate|info|verify``."""

from __future__ import annotations

import argparse

from graphwire.commands.common import (
    check_out,
    console,
    graph_rows,
    load_with_status,
    print_table,
    step,
)


def generate(args: argparse.Namespace) -> int:
    from graphwire.graph.native import save_graph

    check_out(args.out, args.dataset, args.overwrite)
    graph = load_with_status(args.dataset)
    with step(f"writing {args.out}"):
        save_graph(graph, args.out, overwrite=args.overwrite)
    print_table("graph", ["field", "value"], graph_rows(graph))
    console.print(f"saved to {args.out}")
    return 0


def info(args: argparse.Namespace) -> int:
    graph = load_with_status(args.dataset)
    print_table("graph", ["field", "value"], graph_rows(graph))
    return 0


def verify(args: argparse.Namespace) -> int:
    """Check every part of a partitioned folder against the SHA-256 sums its
    ``meta.json`` records (a loader checks sizes, types and IDs, not bytes:
    this finds a file changed in place)."""
    from pathlib import Path

    from graphwire.partition.format import load_part, load_partition_meta

    folder = Path(args.dataset)
    if not (folder / "meta.json").is_file() or not (folder / "part_0").is_dir():
        raise ValueError(
            f"--dataset {args.dataset}: not a partitioned folder (from "
            "graphwire partition); only those record checksums"
        )
    parts = load_partition_meta(folder)["num_parts"]
    for part in range(parts):
        with step(f"checking part {part} of {parts}"):
            load_part(folder, part, verify=True)
    console.print(f"{folder}: all {parts} parts match their checksums", soft_wrap=True)
    return 0
