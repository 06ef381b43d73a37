"""``graphwire bench NAME``: run one benchmark (or ``list`` them)."""

from __future__ import annotations

import argparse

from graphwire.bench.registry import BENCHMARKS, BenchOptions, run_benchmark
from graphwire.commands.common import print_table
from graphwire.runlog import format_summary


def run(args: argparse.Namespace) -> int:
    if args.name == "list":
        print_table(
            "benchmarks", ["name", "what"], [(k, v[1]) for k, v in BENCHMARKS.items()]
        )
        return 0
    options = BenchOptions(nodes=args.nodes, seed=args.seed, repeat=args.repeat)
    result = run_benchmark(args.name, options)
    scalars = {k: v for k, v in result.items() if isinstance(v, (int, float, str))}
    print(format_summary(scalars), flush=True)
    return 0
