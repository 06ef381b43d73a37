"""``graphwire partition``: split a graph, report what the split costs, write it."""

from __future__ import annotations

import argparse

from graphwire.graph.seeds import check_seed
from graphwire.partition import write_partitioned
from graphwire.partition.base import check_method
from graphwire.run.console import console, load_with_status, step
from graphwire.run.outputs import check_out
from graphwire.run.partitioning import check_parts_fit, partition_graph
from graphwire.run.spec import DEFAULT_NODE_ORDER


def run(args: argparse.Namespace) -> int:
    # The settings first: a large graph takes long to read or generate.
    check_method(args.method, "--method")
    if args.parts < 1:
        raise ValueError(f"--parts: expected >= 1, got {args.parts}")
    check_seed(args.seed, "--seed")
    if args.out:
        check_out(args.out, args.dataset, args.overwrite)
    elif args.overwrite or args.node_order:
        flag = "--overwrite" if args.overwrite else "--node-order"
        raise ValueError(f"{flag}: only with --out (without it nothing is written)")
    graph = load_with_status(args.dataset, args.quiet)
    check_parts_fit(graph, int(args.parts), args.dataset)
    partition, stats, _ = partition_graph(
        graph, args.method, int(args.parts), int(args.seed), args.quiet
    )
    if args.out:
        with step(f"writing {args.out}", args.quiet):
            write_partitioned(
                graph,
                partition,
                args.out,
                overwrite=args.overwrite,
                stats=stats,
                node_order=args.node_order or DEFAULT_NODE_ORDER,
            )
        console.print(f"partitioned graph: {args.out}")
    return 0
