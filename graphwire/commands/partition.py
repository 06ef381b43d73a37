"""``graphwire partition``: split a graph, report what the split costs, write it.

Also used by ``graphwire train --partition METHOD`` to report the partition a
distributed run of the same graph would face.
"""

from __future__ import annotations

import argparse
from typing import Any

from graphwire.commands.common import console, load_with_status, print_table, step
from graphwire.graph.graph import Graph
from graphwire.partition import PartitionStats, get_partitioner, write_partitioned
from graphwire.partition.base import Partition
from graphwire.partition.stats import PER_PART


def run(args: argparse.Namespace) -> int:
    graph = load_with_status(args.dataset)
    partition, stats = _partition(graph, args.method, int(args.parts), int(args.seed))
    _print_stats(stats, args.method)
    if args.out:
        with step(f"writing {args.out}"):
            write_partitioned(
                graph, partition, args.out, overwrite=args.overwrite, stats=stats
            )
        console.print(f"partitioned graph: {args.out}")
    return 0


def write_parts(
    graph: Graph, method: str, parts: int, seed: int, folder: Any, quiet: bool = False
) -> None:
    """Partition ``graph``, print the statistics, write the parts to ``folder``
    (replacing an earlier partitioning there)."""
    partition, stats = _partition(graph, method, parts, seed, quiet)
    _print_stats(stats, method)
    with step(f"writing {folder}", quiet):
        write_partitioned(graph, partition, folder, overwrite=True, stats=stats)


def partition_and_report(
    graph: Graph, method: str, parts: int, seed: int, quiet: bool = False
) -> dict[str, Any]:
    """Partition ``graph``, print its statistics table, return the headline numbers."""
    _, stats = _partition(graph, method, parts, seed, quiet)
    _print_stats(stats, method)
    return stats.summary()


def _partition(
    graph: Graph, method: str, parts: int, seed: int, quiet: bool = False
) -> tuple[Partition, PartitionStats]:
    partitioner = get_partitioner(method)
    with step(f"partitioning into {parts} parts with {method}", quiet):
        partition = partitioner.partition(graph, parts, seed=seed)
        stats = PartitionStats.compute(graph, partition)
    return partition, stats


def _print_stats(stats: PartitionStats, method: str) -> None:
    print_table(
        f"partition: {method}, {stats.num_parts} parts, edge cut "
        f"{stats.edge_cut:,} of {stats.num_edges:,} ({100 * stats.cut_fraction:.1f}%)",
        ["part", *(name.removeprefix("num_") for name in PER_PART)],
        stats.table_rows(),
    )
