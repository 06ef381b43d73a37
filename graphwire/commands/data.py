"""``graphwire data generate|info``."""

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
