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
        with step(f"checking {folder}"):
            load_graph(folder, verify=True)
        console.print(f"{folder}: every array matches its checksum", soft_wrap=True)
        return 0
    if not is_partitioned_folder(folder):
        raise ValueError(
            f"--dataset {folder}: not a graphwire folder (from graphwire data "
            "generate or partition); only those record checksums"
        )
    parts = load_partition_meta(folder)["num_parts"]
    for part in range(parts):
        with step(f"checking part {part} of {parts}"):
            load_part(folder, part, verify=True)
    console.print(f"{folder}: all {parts} parts match their checksums", soft_wrap=True)
    return 0
