"""``graphwire bench NAME``: run one benchmark (or ``list`` them)."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

from graphwire.bench.registry import BENCHMARKS, BenchOptions, run_benchmark
from graphwire.run.console import print_table
from graphwire.run.records import format_summary


def run(args: argparse.Namespace) -> int:
    if args.name == "list":
        rows = [(name, entry[1]) for name, entry in BENCHMARKS.items()]
        print_table("benchmarks", ["name", "what"], rows, text_columns=2)
        return 0
    try:
        options = BenchOptions(nodes=args.nodes, seed=args.seed, repeat=args.repeat)
    except ValueError as error:  # "field: why"; say the flag
        raise ValueError(f"--{error}") from None
    result = run_benchmark(args.name, options)
    scalars = {k: v for k, v in result.items() if isinstance(v, (int, float, str))}
    print(format_summary(scalars), flush=True)
    return 0


def script_main(name: str, argv: Sequence[str] | None = None) -> int:
    """``benchmarks/bench_NAME.py [flags]``: ``graphwire bench NAME [flags]``.

    Its ``--help`` and flag errors give the script's own usage (the command's
    would ask for a NAME the script already passes); then the command runs,
    with its error handling.
    """
    from graphwire.cli import add_bench_flags, main

    argv = list(sys.argv[1:] if argv is None else argv)
    parser = argparse.ArgumentParser(
        prog=Path(sys.argv[0]).name,
        description=f"{BENCHMARKS[name][1]}; the same as `graphwire bench {name}`.",
    )
    add_bench_flags(parser)
    parser.parse_args(argv)
    return main(["bench", name, *argv])


def run_script(main: Callable[[], int | None]) -> int:
    """A benchmark script's ``main()`` as its exit status. Ctrl-C, SIGTERM
    (``timeout``, ``kill PID``) and SIGHUP (its terminal gone) end it as
    Ctrl-C ends the command: one line on stderr and exit 130, no traceback.
    The benchmark's own clean-up (namespaces, workers, work folders) has run
    by then, on the way out of ``main``; under their default it never ran,
    and the network namespace stayed."""
    from graphwire.sigterm import interrupt_on_stop_signals

    interrupt_on_stop_signals()
    try:
        return main() or 0
    except KeyboardInterrupt:
        print(f"{Path(sys.argv[0]).name}: interrupted", file=sys.stderr)
        return 130
