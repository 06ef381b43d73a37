"""The ``graphwire`` command: data, partition, train, bench, report.

Each subcommand parses its flags (or a YAML config standing in for them), builds
what it needs, runs, prints a table, and writes its outputs atomically.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

if "RANK" in os.environ and "WORLD_SIZE" in os.environ:  # a launcher's worker
    # Before torch is imported, which reads it once: c10d logs a failed join
    # or a lost peer with a page of C++ frames, then raises what the CLI
    # reports in a line (graphwire's own workers start so: comm.launch).
    os.environ.setdefault("TORCH_CPP_LOG_LEVEL", "FATAL")

import yaml  # noqa: E402

from graphwire.bench.registry import BENCHMARKS  # noqa: E402
from graphwire.fsutil import check_creatable  # noqa: E402
from graphwire.graph.datasets import DEFAULT_SPEC  # noqa: E402

__all__ = ["add_bench_flags", "build_parser", "main"]

# The partitioners graphwire.partition registers (not imported here: --help
# stays fast); tests/test_cli.py checks that each registered one is named.
PARTITIONER_NAMES = (
    "random, chunk, metis or locality (G3: multi-constraint METIS, then "
    "halo-balancing refinement)"
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
    generate.set_defaults(handler=_handler("graphwire.commands.data", "generate"))
    info = data_commands.add_parser("info", help="print a dataset's statistics")
    _dataset_flag(info)
    info.set_defaults(handler=_handler("graphwire.commands.data", "info"))
    check = data_commands.add_parser(
        "verify", help="check a graphwire folder's files against their checksums"
    )
    check.add_argument("--dataset", required=True, help="a graph or partitioned folder")
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
    part.set_defaults(handler=_handler("graphwire.commands.partition", "run"))

    train = commands.add_parser("train", help="train a GNN and report accuracy")
    _dataset_flag(train)
    train.add_argument("--config", help="YAML file whose keys stand in for flags")
    train.add_argument(
        "--verify",
        action="store_true",
        help="check the graphwire files a run reads against their SHA-256 in "
        "meta.json as they load (a graph folder --dataset names, and each "
        "worker's part: of --dataset or of OUT/partitions): reads them once more",
    )
    train.add_argument(
        "--model",
        default="sage",
        choices=["gcn", "sage", "gat"],
        help="GCN, GraphSAGE (mean) or GAT (default sage)",
    )
    train.add_argument(
        "--mode",
        default="fullgraph",
        choices=["fullgraph", "minibatch"],
        help="whole-graph epochs, or sampled mini-batches (default fullgraph)",
    )
    train.add_argument(
        "--epochs", type=int, default=200, help="most epochs (default 200)"
    )
    train.add_argument(
        "--seed",
        type=int,
        default=0,
        help="seeds weights, dropout, sampling and partitioning (default 0)",
    )
    train.add_argument("--hidden", type=int, help="hidden width (model default)")
    train.add_argument(
        "--layers", type=int, default=2, help="message-passing layers (default 2)"
    )
    train.add_argument("--lr", type=float, help="learning rate (model default)")
    train.add_argument("--dropout", type=float, help="dropout (model default)")
    train.add_argument("--weight-decay", type=float, help="L2 (model default)")
    train.add_argument(
        "--heads", type=int, help="GAT: attention heads in hidden layers (default 8)"
    )
    train.add_argument(
        "--out-heads",
        type=int,
        help="GAT: attention heads in the output layer, averaged (default 1)",
    )
    train.add_argument(
        "--attn-dropout",
        type=float,
        help="GAT: dropout on attention coefficients (model default)",
    )
    train.add_argument(
        "--patience",
        type=int,
        help="stop after this many evaluations (epochs, by default) in a row "
        "without a better epoch: a higher validation accuracy, or the same "
        "with a lower validation loss",
    )
    train.add_argument(
        "--fanouts", help="mini-batch fan-outs, input layer first: 10,25"
    )
    train.add_argument("--batch-size", type=int, help="mini-batch seeds per step")
    train.add_argument(
        "--partition",
        help=f"{PARTITIONER_NAMES}; with --workers, how the graph is split "
        "(default metis); on one process, also partition and report",
    )
    train.add_argument(
        "--parts",
        type=int,
        help="one process: parts for --partition (default 4); distributed: "
        "one per worker",
    )
    train.add_argument(
        "--node-order",
        choices=["rcm", "id"],
        help="how rows are numbered: rcm puts neighbours close together "
        "(reverse Cuthill-McKee: faster sparse products), id keeps the graph's "
        "order; on one process (full-graph) the graph's rows, with --workers "
        "the parts it writes, either mode (default rcm; not with a "
        "partitioned --dataset, whose parts are numbered already)",
    )
    train.add_argument(
        "--workers",
        type=int,
        default=1,
        help="worker processes for distributed training, one part each "
        "(default 1: one process)",
    )
    train.add_argument(
        "--exchange",
        choices=["halo", "replicate", "g3"],
        help="how workers exchange boundary rows (distributed runs; default g3)",
    )
    train.add_argument(
        "--g3-mode",
        choices=["full", "inter", "intra", "sequential"],
        help="G3 ablation: which overlaps to keep (default full)",
    )
    train.add_argument(
        "--g3-sync",
        choices=["layer", "epoch"],
        help="G3 parameter sync: each layer's gradients as soon as its backward "
        "is done (default layer), or one all-reduce after the backward",
    )
    train.add_argument(
        "--g3-order",
        choices=["bfs", "priority"],
        help="G3 node order: BFS with rows that have remote neighbours first "
        "(default bfs), or most-needed rows first",
    )
    train.add_argument(
        "--g3-last",
        choices=["sums", "bins"],
        help="G3 last layer: summed message by message as its halo rows arrive, "
        "or in bins (default: sums where they apply: the last of two or more "
        "layers, summing its sources (GCN, GraphSAGE) into fewer columns, "
        "under --g3-mode full or intra; sums where they do not is an error)",
    )
    train.add_argument(
        "--bin-rows",
        type=int,
        help="G3: most rows in a bin of a layer whose output is sent (default 32768)",
    )
    train.add_argument(
        "--bin-mb",
        type=float,
        help="G3: memory budget of a bin in MiB, sized per layer (default 256)",
    )
    train.add_argument(
        "--fetch",
        choices=["on-demand", "rapid"],
        help="distributed mini-batch: pull remote features per batch (DistDGL, "
        "the default) or from a presampled hot cache and prefetcher (RapidGNN)",
    )
    train.add_argument(
        "--n-hot",
        type=int,
        help="rapid: hot-cache rows, at most the distinct remote nodes of the "
        "run's schedule (more is cut to that; the default: that many, within "
        "--cache-mb; memory 2 x n_hot x F x 4 bytes)",
    )
    train.add_argument(
        "--cache-mb",
        type=float,
        help="rapid: memory for the two cache buffers when --n-hot is not given "
        "(default 512)",
    )
    train.add_argument(
        "--prefetch",
        type=int,
        help="rapid: the most batches assembled at once, the one in training "
        "included (Q, default 4; 1: none ahead)",
    )
    train.add_argument("--presample-dir", help="rapid: where the schedule goes")
    train.add_argument(
        "--eval-every",
        type=int,
        default=1,
        help="evaluate every K epochs and after the last (--patience counts "
        "evaluations)",
    )
    train.add_argument(
        "--threads",
        type=int,
        help="torch threads per process (workers default to 1)",
    )
    train.add_argument(
        "--keep-freed-mb",
        type=int,
        default=1024,
        help="freed memory each process's malloc keeps for reuse, MiB (glibc's "
        "mmap and trim thresholds; 0: glibc's defaults; left alone where "
        "MALLOC_*_THRESHOLD_, GLIBC_TUNABLES or a preloaded allocator are set; "
        "default 1024)",
    )
    train.add_argument(
        "--timeout",
        type=float,
        help="distributed: seconds any wait may last (joining the ranks, each "
        "collective; default 600)",
    )
    train.add_argument(
        "--backend",
        choices=("gloo", "nccl"),
        help="distributed: the torch.distributed backend (default: nccl where "
        "this machine has a GPU for each of its workers, else gloo; name it "
        "when machines of one run differ, as every rank must use the same); "
        "under nccl the all-to-all exchanges are staged through each worker's "
        "GPU, while point-to-point messages (g3's rows and layer-wise gradient "
        "sums) take a gloo group: NCCL would deadlock on receives posted early",
    )
    train.add_argument(
        "--checkpoint-every", type=int, help="checkpoint every K epochs (distributed)"
    )
    train.add_argument(
        "--keep-checkpoints",
        type=int,
        help="checkpoints kept, the newest (distributed; default 1, or as the "
        "run being resumed; 0 keeps all)",
    )
    train.add_argument(
        "--resume",
        action="store_true",
        help="continue from OUT/checkpoints (distributed)",
    )
    train.add_argument("--out", help="run folder for metrics.jsonl (default runs/...)")
    train.add_argument("--quiet", action="store_true", help="no progress bars")
    train.set_defaults(handler=_handler("graphwire.commands.train", "run"))

    bench = commands.add_parser("bench", help="run a benchmark that prints ratios")
    bench.add_argument(
        "name",
        help=f"benchmark: {', '.join(BENCHMARKS)}, or 'list' to describe them",
    )
    add_bench_flags(bench)
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


def apply_config(
    parser: argparse.ArgumentParser, args: argparse.Namespace, argv: Sequence[str]
) -> argparse.Namespace:
    """Fill flags not given on the command line from ``--config FILE`` (YAML).

    Raises:
        ValueError: the file cannot be read, is not a YAML mapping, or holds
            an unknown key or a value its flag would refuse.
    """
    path = getattr(args, "config", None)
    if not path:
        return args
    try:
        with open(path) as handle:
            config = yaml.load(handle, Loader=_ConfigLoader)
    except OSError as error:
        raise ValueError(f"--config {path}: {error.strerror}") from None
    except UnicodeDecodeError:
        raise ValueError(f"--config {path}: not a text file (UTF-8)") from None
    except yaml.YAMLError as error:
        raise ValueError(f"--config {path}: not valid YAML: {error}") from None
    except RecursionError:  # the parser recurses once per level of nesting
        raise ValueError(
            f"--config {path}: not valid YAML: nested too deeply (a config "
            "is a mapping of flag: value)"
        ) from None
    if config is None:  # empty, or comments only
        config = {}
    if not isinstance(config, dict):
        raise ValueError(f"--config {path}: expected a mapping of flag: value")
    actions = _command_actions(parser, args.command)
    given = _given(parser, list(actions.values()), argv)
    args.from_config = set()
    keys: dict[str, Any] = {}
    for key, value in config.items():
        name = str(key).replace("-", "_")
        if name not in actions or name in ("command", "handler", "config", "help"):
            raise ValueError(f"--config {path}: unknown key {key!r}")
        if name in keys:
            raise ValueError(
                f"--config {path}: keys {keys[name]!r} and {key!r} set the same flag"
            )
        keys[name] = key
        if name in given or value is None:
            continue  # the command line wins; null leaves the default
        if name == "fanouts" and isinstance(value, list):
            value = ",".join(str(v) for v in value)
        try:
            value = _flag_value(actions[name], value)
        except ValueError as error:
            raise ValueError(f"--config {path}: {key}: {error}") from None
        setattr(args, name, value)
        args.from_config.add(name)
    return args


class _ConfigLoader(yaml.SafeLoader):
    """YAML's safe loader, refusing a key given twice in one mapping (plain
    YAML keeps the last silently, so an edit lower in a file would win unseen)."""

    def construct_mapping(self, node: Any, deep: bool = False) -> Any:
        seen: set[Any] = set()
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=deep)
            try:
                repeated = key in seen
            except TypeError:  # unhashable: the safe loader's own error follows
                break
            if repeated:
                raise yaml.constructor.ConstructorError(
                    "while reading a mapping",
                    node.start_mark,
                    f"found the key {key!r} twice",
                    key_node.start_mark,
                )
            seen.add(key)
        return super().construct_mapping(node, deep=deep)


def _given(
    parser: argparse.ArgumentParser,
    actions: list[argparse.Action],
    argv: Sequence[str],
) -> set[str]:
    """The attribute names of the flags ``argv`` gives, ``actions`` among
    them: ``argv`` parsed again with no defaults (so ``--epoch``, which
    argparse takes for ``--epochs``, counts too)."""
    defaults = [action.default for action in actions]
    try:
        for action in actions:
            action.default = argparse.SUPPRESS
        return set(vars(parser.parse_args(argv)))
    finally:
        for action, default in zip(actions, defaults, strict=True):
            action.default = default


def _command_actions(
    parser: argparse.ArgumentParser, command: str
) -> dict[str, argparse.Action]:
    """The flags of ``command``'s subparser, by attribute name."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            sub: argparse.ArgumentParser = action.choices[command]
            return {a.dest: a for a in sub._actions}
    return {}


def _flag_value(action: argparse.Action, value: Any) -> Any:
    """A YAML ``value`` for ``action``'s flag, as the command line would give
    it: converted by the flag's type and within its choices."""
    if action.nargs == 0:  # --resume, --quiet: on or off
        if not isinstance(value, bool):
            raise ValueError(f"expected true or false, got {value!r}")
        return value
    if isinstance(value, list | dict):
        raise ValueError(f"expected a single value, got {value!r}")
    kind = getattr(action.type, "__name__", "str")
    try:
        if isinstance(value, bool):  # YAML's true/false: not a number or name
            raise ValueError
        value = action.type(str(value)) if callable(action.type) else str(value)
    except (TypeError, ValueError):
        raise ValueError(f"expected {kind}, got {value!r}") from None
    if action.choices is not None and value not in action.choices:
        choices = ", ".join(map(str, action.choices))
        raise ValueError(f"expected one of {choices}, got {value!r}")
    return value


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
        args = apply_config(parser, args, argv)
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


def run_folder(out: str | None, prefix: str) -> Path:
    """``out`` (checked by :func:`check_out_path` before any work) or a
    fresh ``runs/<prefix>-<timestamp>`` folder."""
    if not out:
        import time

        return Path("runs") / f"{prefix}-{time.strftime('%Y%m%d-%H%M%S')}"
    check_out_path(out)
    return Path(out)


def check_out_path(out: str) -> None:
    """``--out`` must be a folder or a path where one can be made.

    Raises:
        ValueError: ``out`` (or a folder above it) is a file, or the folder
            that would hold it cannot be written.
    """
    check_creatable(out, f"--out {out}")


if __name__ == "__main__":
    raise SystemExit(main())
