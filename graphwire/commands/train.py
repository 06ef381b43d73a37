"""``graphwire train``: one training run.

Parses flags into a :class:`~graphwire.run.config.TrainConfig`. With
``--workers N`` (N >= 2) or under ``torchrun`` the run is distributed
(:mod:`graphwire.commands.train_dist`); otherwise this process loads the
dataset, optionally partitions it (to report what distributed training would
face), runs the full-graph or mini-batch loop, and reports accuracy, the time
split and the summary line. A flag only a distributed run reads
(:data:`DISTRIBUTED_FLAGS`) is refused on one process, not ignored.
"""

from __future__ import annotations

import argparse
import math
import statistics
from collections.abc import Callable
from typing import Any

from graphwire.allocator import MAX_KEEP_FREED_MB, keep_freed_memory
from graphwire.cli import run_folder
from graphwire.comm.context import MAX_TIMEOUT_S
from graphwire.commands.common import (
    NODE_ORDER,
    check_partition_method,
    check_trainable_dataset,
    console,
    epoch_progress,
    graph_rows,
    load_with_status,
    print_table,
)
from graphwire.graph.datasets import check_verifiable
from graphwire.run.config import TrainConfig
from graphwire.run.records import MetricsLog, format_summary, peak_rss_mb
from graphwire.run.training import EpochRecord, TrainResult, format_acc

# Flag name -> TrainConfig field, for the flags that override a model default.
_OVERRIDES = {
    "hidden": "hidden",
    "lr": "lr",
    "dropout": "dropout",
    "weight_decay": "weight_decay",
    "heads": "heads",
    "out_heads": "out_heads",
    "attn_dropout": "attn_dropout",
    "patience": "patience",
    "batch_size": "batch_size",
    "eval_every": "eval_every",
}

# Flags only a GAT model reads (attribute -> flag).
GAT_FLAGS = {
    "heads": "--heads",
    "out_heads": "--out-heads",
    "attn_dropout": "--attn-dropout",
}

# Flags only a distributed run reads (attribute -> flag), and the defaults it
# takes for those that have one; they default to None in the parser, so a
# flag given where it would be ignored is seen and refused: on one process,
# or in the other mode (the exchange's flags are full-graph's, the fetch's
# mini-batch's).
EXCHANGE_FLAGS = {
    "exchange": "--exchange",
    "g3_mode": "--g3-mode",
    "g3_sync": "--g3-sync",
    "g3_order": "--g3-order",
    "g3_last": "--g3-last",
    "bin_rows": "--bin-rows",
    "bin_mb": "--bin-mb",
}
FETCH_FLAGS = {
    "fetch": "--fetch",
    "n_hot": "--n-hot",
    "cache_mb": "--cache-mb",
    "prefetch": "--prefetch",
    "presample_dir": "--presample-dir",
}
DISTRIBUTED_FLAGS = {
    **EXCHANGE_FLAGS,
    **FETCH_FLAGS,
    "timeout": "--timeout",
    "backend": "--backend",
    "checkpoint_every": "--checkpoint-every",
    "keep_checkpoints": "--keep-checkpoints",
    "resume": "--resume",
}
DISTRIBUTED_DEFAULTS = {
    "exchange": "g3",
    "fetch": "on-demand",
    "prefetch": 4,
    "timeout": 600.0,
}


def build_config(args: argparse.Namespace) -> TrainConfig:
    fields: dict[str, Any] = {
        "model": args.model,
        "epochs": int(args.epochs),
        "seed": int(args.seed),
        "num_layers": int(args.layers),
    }
    for flag, field in _OVERRIDES.items():
        value = getattr(args, flag, None)
        if value is not None:
            fields[field] = value
    if args.fanouts is not None:
        try:
            fields["fanouts"] = [int(v) for v in str(args.fanouts).split(",")]
        except ValueError as error:
            raise ValueError(
                f"--fanouts: expected comma-separated integers, got {args.fanouts!r}"
            ) from error
    try:
        return TrainConfig(**fields)
    except ValueError as error:  # "field: why"; say the flag instead
        field, colon, why = str(error).partition(": ")
        flag = _FLAG_OF_FIELD.get(field, field)
        why = why.replace("num_layers=", "--layers ")
        why = why.replace("(None: ", "(leave it out: ")  # --patience
        raise ValueError(f"{flag}{colon}{why}") from None


# TrainConfig field -> the flag that sets it, for its errors.
_FLAG_OF_FIELD = {
    "num_layers": "--layers",
    **{field: "--" + flag.replace("_", "-") for flag, field in _OVERRIDES.items()},
    "fanouts": "--fanouts",
    "epochs": "--epochs",
    "seed": "--seed",
    "model": "--model",
}


def run(args: argparse.Namespace) -> int:
    _check_run_flags(args)
    config = build_config(args)
    from graphwire.comm.context import WorkerContext, under_torchrun
    from graphwire.commands.train_dist import run_distributed

    if int(args.workers) > 1 or under_torchrun():
        if under_torchrun() and not args.out:
            raise ValueError("under torchrun, --out is required (one folder per run)")
        world = args.workers
        if under_torchrun():  # every variable checked, naming any that is wrong
            world = WorkerContext.from_env().world_size
        if int(args.workers) > 1 and int(args.workers) != world:
            raise ValueError(
                f"--workers {args.workers}: torchrun started {world} workers "
                "(--nnodes x --nproc-per-node); leave --workers out under torchrun"
            )
        _check_distributed_flags(args, int(world))
        for name, value in DISTRIBUTED_DEFAULTS.items():
            if getattr(args, name) is None:
                setattr(args, name, value)
        how = "minibatch" if args.mode == "minibatch" else args.exchange
        out = run_folder(args.out, f"train-{args.model}-{how}")
        return run_distributed(args, config, out)
    if int(args.workers) < 1:
        raise ValueError(f"--workers: expected >= 1, got {args.workers}")
    _refuse(
        args,
        DISTRIBUTED_FLAGS,
        "only for distributed runs (--workers N with N >= 2, or torchrun); "
        "--workers 1 trains in this process",
    )
    if args.parts is not None and not args.partition:
        raise ValueError(
            f"--parts {args.parts}: only with --partition (a distributed run "
            "has one part per worker)"
        )
    if args.mode == "minibatch":
        _refuse(
            args,
            {"node_order": "--node-order"},
            "on one process, only with --mode fullgraph",
        )
    _refuse_partitioned(args.dataset)
    out = run_folder(args.out, f"train-{args.model}")
    node_order = args.node_order or NODE_ORDER
    keep_freed_memory(int(args.keep_freed_mb))
    if args.threads:
        import torch

        torch.set_num_threads(int(args.threads))
    graph = load_with_status(args.dataset, args.quiet, args.verify)
    check_trainable_dataset(graph, args.dataset)
    parts = args.parts or 4  # with --partition: the split it reports
    if args.partition:
        from graphwire.commands.partition import check_parts_fit

        check_parts_fit(graph, parts, args.dataset)
    print_table("dataset", ["field", "value"], graph_rows(graph))

    with MetricsLog(out) as log:
        log.write(
            "config",
            dataset=args.dataset,
            mode=args.mode,
            **config.as_dict(),
            keep_freed_mb=args.keep_freed_mb,
            **({} if args.mode == "minibatch" else {"node_order": node_order}),
        )
        partition_fields: dict[str, Any] = {}
        if args.partition:
            from graphwire.commands.partition import partition_and_report

            stats = partition_and_report(
                graph, args.partition, parts, int(args.seed), args.quiet
            )
            partition_fields = stats
            log.write("partition", **stats)

        result = _train(graph, config, args.mode, log, args.quiet, node_order)
        _print_time_split(result)
        summary = _summary(result, partition_fields)
        log.write("summary", **summary)
    console.print(f"metrics: {out / 'metrics.jsonl'}")
    print(format_summary(summary), flush=True)
    return 0


def _refuse(args: argparse.Namespace, flags: dict[str, str], why: str) -> None:
    """Raise, saying ``why``, if any of ``flags`` (attribute -> flag) was
    given; each is named, with the file it came from if ``--config``."""
    from_config: set[str] = getattr(args, "from_config", set())
    given = [
        f"{flag} (in {args.config})" if name in from_config else flag
        for name, flag in flags.items()
        if getattr(args, name) is not None and getattr(args, name) is not False
    ]
    if given:
        raise ValueError(f"{' / '.join(given)}: {why}")


def _refuse_partitioned(dataset: str) -> None:
    """A partitioned folder is trained by one worker per part, not here."""
    from graphwire.partition.format import is_partitioned_folder, load_partition_meta

    if is_partitioned_folder(dataset):
        parts = load_partition_meta(dataset)["num_parts"]
        raise ValueError(
            f"--dataset {dataset}: a partitioned graph ({parts} parts); train it "
            f"with --workers {parts} (or under torchrun), or give the graph "
            "it was split from"
        )


def _check_distributed_flags(args: argparse.Namespace, world: int) -> None:
    """Flags of the other mode (or of the other fetch), ``--keep-checkpoints``
    with nothing to keep and ``--parts`` other than one per worker are
    refused rather than ignored."""
    if args.mode == "minibatch":
        _refuse(args, EXCHANGE_FLAGS, "only with --mode fullgraph")
        if args.fetch != "rapid":
            rapid = {k: v for k, v in FETCH_FLAGS.items() if k != "fetch"}
            _refuse(args, rapid, "only with --fetch rapid")
        if args.n_hot is not None:  # it would not bound the rows asked for
            _refuse(args, {"cache_mb": "--cache-mb"}, "only without --n-hot")
    else:
        _refuse(args, FETCH_FLAGS, "only with --mode minibatch")
        if args.exchange not in (None, "g3"):  # (None: the default, g3)
            g3 = {k: v for k, v in EXCHANGE_FLAGS.items() if k != "exchange"}
            _refuse(args, g3, "only with --exchange g3")
    if args.parts is not None and args.parts != world:
        raise ValueError(
            f"--parts {args.parts}: a distributed run has one part per worker "
            f"({world}); leave --parts out"
        )
    if not (args.checkpoint_every or args.resume):
        _refuse(
            args,
            {"keep_checkpoints": "--keep-checkpoints"},
            "only with --checkpoint-every or --resume",
        )


# Numeric flags of how a run goes: attribute -> (flag, least value, whether
# the least value itself is refused, most value). Every value is finite.
_BOUNDS = {
    "checkpoint_every": ("--checkpoint-every", 1, False, math.inf),
    "keep_checkpoints": ("--keep-checkpoints", 0, False, math.inf),
    "timeout": ("--timeout", 0, True, MAX_TIMEOUT_S),
    "threads": ("--threads", 1, False, math.inf),
    "keep_freed_mb": ("--keep-freed-mb", 0, False, MAX_KEEP_FREED_MB),
    "parts": ("--parts", 1, False, math.inf),
    "bin_rows": ("--bin-rows", 1, False, math.inf),
    "bin_mb": ("--bin-mb", 0, True, math.inf),
    "n_hot": ("--n-hot", 0, False, math.inf),
    "cache_mb": ("--cache-mb", 0, True, math.inf),
    "prefetch": ("--prefetch", 1, False, math.inf),
}


def _check_run_flags(args: argparse.Namespace) -> None:
    """Flags of how the run goes, checked before any data is read or split:
    each within its bounds (:data:`_BOUNDS`), and the mini-batch settings
    only in mini-batch mode, GAT's only with --model gat."""
    for name, (flag, least, strict, most) in _BOUNDS.items():
        value = getattr(args, name)
        if value is None:
            continue
        above = value > least or (value == least and not strict)
        if not (above and value <= most and math.isfinite(value)):
            bound = f"> {least}" if strict else f">= {least}"
            if most < math.inf:
                bound += f" and <= {most:g}"
            elif value == math.inf:
                bound = f"a finite value {bound}"
            raise ValueError(f"{flag}: expected {bound}, got {value}")
    if args.mode != "minibatch":
        _refuse(
            args,
            {"fanouts": "--fanouts", "batch_size": "--batch-size"},
            "only with --mode minibatch",
        )
    if args.model != "gat":
        _refuse(args, GAT_FLAGS, "only with --model gat")
    check_partition_method(args.partition)
    if args.verify:
        check_verifiable(args.dataset)


def _train(
    graph: Any,
    config: TrainConfig,
    mode: str,
    log: MetricsLog,
    quiet: bool,
    node_order: str,
) -> TrainResult:
    train: Callable[..., TrainResult]
    options: dict[str, Any] = {}
    if mode == "minibatch":
        from graphwire.minibatch.trainer import train_minibatch as train
    else:
        from graphwire.fullgraph.trainer import train_fullgraph as train

        options["node_order"] = node_order

    with epoch_progress(config.epochs, quiet) as progress:
        task = progress.add_task(
            f"{mode} {config.model}", total=config.epochs, status=""
        )

        def on_epoch(record: EpochRecord) -> None:
            log.write("epoch", **record.as_dict())
            progress.update(
                task,
                completed=record.epoch + 1,
                status=f"loss {record.loss:.3f} val {format_acc(record.val_acc)}",
            )

        result = train(graph, config, on_epoch=on_epoch, **options)
        progress.update(task, total=result.epochs_run, completed=result.epochs_run)
    return result


def _epoch_seconds(record: EpochRecord) -> float:
    return sum(v for k, v in record.times.items() if k != "eval_s")


def _print_time_split(result: TrainResult) -> None:
    totals: dict[str, float] = {}
    for record in result.records:
        for key, value in record.times.items():
            totals[key] = totals.get(key, 0.0) + value
    grand = sum(totals.values()) or 1.0
    rows = [
        (k.removesuffix("_s"), v, f"{100 * v / grand:.1f}%") for k, v in totals.items()
    ]
    print_table("time split (all epochs)", ["phase", "seconds", "share"], rows)


def _summary(result: TrainResult, partition_fields: dict[str, Any]) -> dict[str, Any]:
    epoch_s = [_epoch_seconds(r) for r in result.records] or [0.0]
    summary: dict[str, Any] = {
        "test_acc": result.test_acc,
        "val_acc": result.val_acc,
        "epochs": result.epochs_run,
        "best_epoch": result.best_epoch,
        "epoch_s_median": statistics.median(epoch_s),
        "peak_rss_mb": round(peak_rss_mb(), 1),
    }
    for key in ("edge_cut", "halo_max", "imbalance_nodes"):
        if key in partition_fields:
            summary[key] = partition_fields[key]
    return summary
