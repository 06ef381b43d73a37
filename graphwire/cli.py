"""The ``graphwire`` command: data, partition, train, switch, simulate, bench, report.

Each subcommand parses its flags (or a YAML config standing in for them), builds
what it needs, runs, prints a table, and writes its outputs atomically.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable, Sequence
from typing import Any

if "RANK" in os.environ and "WORLD_SIZE" in os.environ:  # a launcher's worker
    # Before torch is imported, which reads it once: c10d logs a failed join
    # or a lost peer with a page of C++ frames, then raises what the CLI
    # reports in a line (graphwire's own workers start so: comm.launch).
    os.environ.setdefault("TORCH_CPP_LOG_LEVEL", "FATAL")
elif "TORCH_CPP_LOG_LEVEL" not in os.environ and "torch" not in sys.modules:
    # The launcher's own C++ log at ERROR: the rendezvous store it hosts
    # warns of every worker's connection that "the hostname of the client
    # socket cannot be retrieved" where no name resolves (a network
    # namespace). Read once, as torch is imported; its children start with
    # the environment as the user left it (comm.launch quiets them).
    os.environ["TORCH_CPP_LOG_LEVEL"] = "ERROR"
    import torch  # noqa: F401, E402

    del os.environ["TORCH_CPP_LOG_LEVEL"]


from graphwire.bench.registry import BENCHMARKS  # noqa: E402
from graphwire.graph.datasets import DEFAULT_SPEC  # noqa: E402

__all__ = ["add_bench_flags", "build_parser", "main"]

# The partitioners graphwire.partition registers (not imported here: --help
# stays fast); tests/test_cli.py checks that each registered one is named.
PARTITIONER_NAMES = (
    "random, chunk, metis, locality (G3: multi-constraint METIS, then "
    "halo-balancing refinement) or blocks (ByteGNN: 2-hop blocks of the "
    "labelled nodes, balanced by split)"
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="graphwire",
        description="Distributed GNN training with small, visible, fast communication.",
    )
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    data = commands.add_parser("data", help="generate, describe or verify a graph")
    data_commands = data.add_subparsers(
        dest="data_command", required=True, metavar="SUBCOMMAND"
    )
    generate = data_commands.add_parser(
        "generate", help="make or load a dataset and save it in graphwire's format"
    )
    _dataset_flag(generate)
    generate.add_argument("--out", required=True, help="folder to write")
    generate.add_argument(
        "--overwrite", action="store_true", help="replace --out if it exists"
    )
    _quiet_flag(generate)
    generate.set_defaults(handler=_handler("graphwire.commands.data", "generate"))
    info = data_commands.add_parser("info", help="print a dataset's statistics")
    _dataset_flag(info)
    _quiet_flag(info)
    info.set_defaults(handler=_handler("graphwire.commands.data", "info"))
    check = data_commands.add_parser(
        "verify", help="check a graphwire folder's files against their checksums"
    )
    check.add_argument("--dataset", required=True, help="a graph or partitioned folder")
    _quiet_flag(check)
    check.set_defaults(handler=_handler("graphwire.commands.data", "verify"))

    part = commands.add_parser(
        "partition", help="partition a graph and write its parts"
    )
    _dataset_flag(part)
    part.add_argument(
        "--method", default="metis", help=f"{PARTITIONER_NAMES} (default metis)"
    )
    part.add_argument(
        "--parts", type=int, default=4, help="parts: one per worker (default 4)"
    )
    part.add_argument(
        "--seed",
        type=int,
        default=0,
        help="seeds random, metis and locality (default 0)",
    )
    part.add_argument(
        "--node-order",
        choices=["rcm", "id"],
        help="how each part numbers its nodes: rcm puts neighbours close together "
        "(reverse Cuthill-McKee over the part's edges: faster sparse products), "
        "id keeps the graph's order (default rcm; only with --out)",
    )
    part.add_argument("--out", help="folder for the partitioned graph")
    part.add_argument(
        "--overwrite", action="store_true", help="replace --out if it exists"
    )
    _quiet_flag(part)
    part.set_defaults(handler=_handler("graphwire.commands.partition", "run"))

    train = commands.add_parser("train", help="train a GNN and report accuracy")
    from graphwire.commands.train import add_flags

    add_flags(train)
    train.set_defaults(handler=_handler("graphwire.commands.train", "run"))

    switch = commands.add_parser(
        "switch", help="run the emulated switch of --exchange switch (one run)"
    )
    switch.add_argument(
        "--listen",
        default="127.0.0.1:0",
        metavar="HOST:PORT",
        help="address to listen on (default 127.0.0.1:0: loopback, any port; "
        "the address is printed)",
    )
    switch.add_argument("--parent-pid", type=int, help=argparse.SUPPRESS)
    _quiet_flag(switch)  # (it prints only its address and errors anyway)
    switch.set_defaults(handler=_handler("graphwire.commands.switch", "run"))

    simulate = commands.add_parser(
        "simulate",
        help="simulate strategies on a cluster bigger than this machine (ns-3)",
    )
    _dataset_flag(simulate)
    from graphwire.commands.simulate import add_flags as simulate_flags

    simulate_flags(simulate)
    _quiet_flag(simulate)
    simulate.set_defaults(handler=_handler("graphwire.commands.simulate", "run"))

    bench = commands.add_parser(
        "bench", help="run a benchmark: its figures beside their targets or references"
    )
    bench.add_argument(
        "name",
        help=f"benchmark: {', '.join(BENCHMARKS)}, or 'list' to describe them",
    )
    add_bench_flags(bench)
    _quiet_flag(bench)
    bench.set_defaults(handler=_handler("graphwire.commands.bench", "run"))

    report = commands.add_parser(
        "report", help="compare runs in a markdown table and PNG plots"
    )
    report.add_argument(
        "runs",
        nargs="+",
        metavar="RUN",
        help="a run folder (graphwire train --out): its metrics.jsonl is read",
    )
    report.add_argument(
        "--out",
        help="folder for report.md, loss_acc.png, time_split.png and "
        "bytes_heatmap.png (default: the run's folder; with several runs, the "
        "first run's, replacing its own report)",
    )
    _quiet_flag(report)
    report.set_defaults(handler=_handler("graphwire.commands.report", "run"))
    return parser


def add_bench_flags(parser: argparse.ArgumentParser) -> None:
    """The flags every benchmark takes (``graphwire bench`` and the thin
    ``benchmarks/bench_*.py`` scripts), as :class:`BenchOptions` reads them."""
    parser.add_argument(
        "--nodes",
        type=int,
        default=1_000_000,
        help="nodes of the synthetic products-like graph (degree 20, F=100) "
        "every benchmark builds; at least 100 (default 1000000, the size the "
        "targets are set for)",
    )
    parser.add_argument(
        "--seed",
        type=int,
        default=0,
        help="seed of the graph, the initial weights and the batch order (default 0)",
    )
    parser.add_argument(
        "--repeat",
        type=int,
        default=5,
        help="gcn-epoch: timed epochs of each model; sampler: 10 x REPEAT "
        "timed batches; generator: not used (default 5)",
    )


def _quiet_flag(parser: argparse.ArgumentParser) -> None:
    """``--quiet``, which every command takes (``train``'s is its spec's)."""
    parser.add_argument(
        "--quiet",
        action="store_true",
        help="no spinners or step timings; the tables, the result and errors "
        "stay (as with train --quiet)",
    )


def _dataset_flag(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--dataset",
        default=DEFAULT_SPEC,
        help="dataset spec, e.g. synthetic:products?nodes=200000, "
        "planetoid:PATH/cora, ogb:PATH, npz:FILE, edgelist:FILE, or a graph "
        f"folder from graphwire data generate (default: {DEFAULT_SPEC})",
    )


def _handler(module: str, function: str) -> Callable[[argparse.Namespace], int]:
    """Import a command's module only when it runs (keeps ``--help`` fast)."""

    def run(args: argparse.Namespace) -> int:
        import importlib

        result: int = getattr(importlib.import_module(module), function)(args)
        return result

    return run


def _fanouts_joined(argv: list[str]) -> list[str]:
    """``--fanouts -1,5`` as ``--fanouts=-1,5``: argparse takes a value that
    starts with ``-`` (and is not one number) for a flag; -1 is "all"."""
    joined: list[str] = []
    for arg in argv:
        if (
            joined
            and joined[-1] == "--fanouts"
            and arg[:1] == "-"
            and arg[1:2].isdigit()
        ):
            joined[-1] = f"--fanouts={arg}"
        else:
            joined.append(arg)
    return joined


def main(argv: Sequence[str] | None = None) -> int:
    """The ``graphwire`` command on ``argv`` (None: this process's command
    line, which then also ends on SIGTERM or SIGHUP as on Ctrl-C while it
    runs: clean-ups run, one line, exit 130); its exit status."""
    if argv is None:
        from graphwire.sigterm import interrupt_on_stop_signals, restore_stop_signals

        interrupt_on_stop_signals()
        try:
            return _main(sys.argv[1:])
        finally:
            restore_stop_signals()
    return _main(argv)


def _main(argv: Sequence[str]) -> int:
    argv = _fanouts_joined(list(argv))
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        code: Any = args.handler(args)
    except (ValueError, FileNotFoundError, FileExistsError) as error:
        _say(f"graphwire: error: {error}")
        return 2
    except KeyboardInterrupt:
        _say("graphwire: interrupted")
        return 130
    except OSError as error:  # the machine's: a full disk, a permission
        _say(f"graphwire: error: {error}")
        return 1
    except MemoryError as error:  # numpy's says what it tried to allocate
        _say(f"graphwire: error: out of memory: {error}")
        return 1
    except RuntimeError as error:
        if _CPU_ALLOC_FAILED in str(error):  # torch's: a page of C++ context
            tried = str(error).split(_CPU_ALLOC_FAILED, 1)[1].split(".", 1)[0]
            _say(f"graphwire: error: out of memory: {tried.strip()}")
            return 1
        if not type(error).__module__.startswith("graphwire"):
            raise
        if getattr(error, "usage", False):
            # A worker's bad input or setting (WorkerFailed): its line says it.
            first = str(error).split("\n", 1)[0]
            _say(f"graphwire: error: {first}")
            return 2
        # A worker died, a peer timed out: say so, no traceback.
        _say(f"graphwire: error: {error}")
        return 1
    return int(code or 0)


# How torch's CPU allocator says it failed: "... DefaultCPUAllocator: can't
# allocate memory: you tried to allocate N bytes. Error code 12 (...)".
_CPU_ALLOC_FAILED = "can't allocate memory:"


def _say(line: str) -> None:
    """``line`` on stderr in one write: ``print`` writes the newline apart,
    and the ranks torchrun starts on a node share its stderr, so their lines
    would run into each other."""
    sys.stderr.write(line + "\n")
    sys.stderr.flush()


if __name__ == "__main__":
    raise SystemExit(main())
