"""Partition a graph, print what the split costs, write its parts.

``graphwire partition`` does it; ``graphwire train --workers N`` writes the
parts it trains on this way, and one process with ``--partition`` reports
the split a distributed run of the graph would face.
"""

from __future__ import annotations

from typing import Any

from graphwire.graph.graph import Graph
from graphwire.graph.links import HeldOut
from graphwire.partition import PartitionStats, get_partitioner, write_partitioned
from graphwire.partition.base import Partition
from graphwire.partition.locality import RefineResult
from graphwire.partition.stats import PER_PART
from graphwire.run.console import console, print_table, step
from graphwire.run.spec import DEFAULT_NODE_ORDER

__all__ = [
    "check_parts_fit",
    "partition_and_report",
    "partition_graph",
    "refinement_line",
    "write_parts",
]


def check_parts_fit(graph: Graph, parts: int, dataset: str) -> None:
    """Refuse, naming ``--parts``, more parts than ``graph`` has nodes (the
    partitioner would say ``num_parts``, which the user did not type)."""
    if parts > graph.num_nodes:
        raise ValueError(
            f"--parts {parts}: more than the {graph.num_nodes} nodes of {dataset} "
            "(a graph splits into at most as many parts as it has nodes)"
        )


def write_parts(
    graph: Graph,
    method: str,
    parts: int,
    seed: int,
    folder: Any,
    quiet: bool = False,
    *,
    node_order: str = DEFAULT_NODE_ORDER,
    params: dict[str, Any] | None = None,
    held_out: tuple[HeldOut, HeldOut] | None = None,
) -> None:
    """Partition ``graph``, print the statistics, write the parts to ``folder``
    (replacing an earlier partitioning there), numbered as ``node_order``
    says; ``params``: the partitioner's (none: its defaults); ``held_out``:
    link prediction's pairs, written beside the parts."""
    partition, stats, _ = partition_graph(graph, method, parts, seed, quiet, params)
    with step(f"writing {folder}", quiet):
        write_partitioned(
            graph,
            partition,
            folder,
            overwrite=True,
            stats=stats,
            node_order=node_order,
            held_out=held_out,
        )


def partition_and_report(
    graph: Graph, method: str, parts: int, seed: int, quiet: bool = False
) -> dict[str, Any]:
    """Partition ``graph``, print its statistics table, return the headline
    numbers (with ``refine_*``, what the locality refinement did, for
    ``locality``)."""
    _, stats, refinement = partition_graph(graph, method, parts, seed, quiet)
    if refinement is None:
        return stats.summary()
    done = {f"refine_{key}": value for key, value in refinement.summary().items()}
    return {**stats.summary(), **done}


def partition_graph(
    graph: Graph,
    method: str,
    parts: int,
    seed: int,
    quiet: bool = False,
    params: dict[str, Any] | None = None,
) -> tuple[Partition, PartitionStats, RefineResult | None]:
    """Partition ``graph`` with the partitioner ``method`` names (with
    ``params``) and print the statistics; also what the locality refinement
    did (None for others)."""
    partitioner = get_partitioner(method, **(params or {}))
    with step(f"partitioning into {parts} parts with {method}", quiet):
        partition = partitioner.partition(graph, parts, seed=seed)
        stats = PartitionStats.compute(graph, partition)
    print_table(
        f"partition: {method}, {stats.num_parts} parts, edge cut "
        f"{stats.edge_cut:,} of {stats.num_edges:,} ({100 * stats.cut_fraction:.1f}%)",
        ["part", *(name.removeprefix("num_") for name in PER_PART)],
        stats.table_rows(),
    )
    refinement = getattr(partitioner, "last_refinement", None)
    if refinement is not None:
        console.print(refinement_line(refinement), soft_wrap=True)
    blocks = getattr(partitioner, "last_report", None)
    if blocks is not None:
        console.print(blocks.line(), soft_wrap=True)
    return partition, stats, refinement


def refinement_line(result: RefineResult) -> str:
    """What G3's refinement did, in one line: halo balance and edge cut
    before and after, swaps, why it stopped.

    A halo max/min with a part that has no halo is "n/a" (not inf), and the
    cut's change in percent is left out when the cut was 0 before.
    """
    halo = [_halo_balance(h) for h in (result.halo_before, result.halo_after)]
    why = " (n/a: a part with no halo)" if "n/a" in halo else ""
    growth = f" ({100 * result.cut_growth:+.1f}%)" if result.edge_cut_before else ""
    return (
        f"locality refinement: halo max/min {halo[0]} -> {halo[1]}{why}, edge cut "
        f"{result.edge_cut_before:,} -> {result.edge_cut_after:,}{growth}, "
        f"{result.num_swaps:,} swaps ({result.num_rejected:,} rejected), "
        f"stopped: {result.stop_reason}, {result.seconds:.1f}s"
    )


def _halo_balance(halo: tuple[int, ...]) -> str:
    ratio = RefineResult.max_min(halo)
    return "n/a" if ratio == float("inf") else f"{ratio:.3f}"
