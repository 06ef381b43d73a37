"""``graphwire train --workers N`` (or under ``torchrun``): distributed full-graph.

Parses, builds, runs, tears down:

1. the partitioned graph: ``--dataset`` may name one already (its number of
   parts must equal the number of workers); otherwise the dataset is loaded and
   partitioned (``--partition``, default ``metis``) into ``OUT/partitions``
   (kept as it is when the run is resumed);
2. the workers: N local processes (``launch_local``) or, under ``torchrun``,
   this process as one of them (which dies with its agent); each runs
   :func:`graphwire.fullgraph.job.run_rank`;
3. the report (rank 0 / the parent): per-epoch records of every rank in
   ``metrics.jsonl`` (rank 0 streams its own into ``metrics.jsonl.partial``
   while it trains, which the report replaces), tables of the time split, of
   the exact bytes per tag and of each rank's training bytes (sent, received,
   to each rank), and the summary line with ``bytes_sent`` / ``bytes_recv``.
   A resumed run's tables and ``epoch_s_median`` count the epochs it trained,
   from its checkpoint on (``resumed_at``), not those it restored.
"""

from __future__ import annotations

import argparse
import dataclasses
import inspect
import os
import statistics
import sys
from collections import defaultdict
from pathlib import Path
from typing import Any

from graphwire.allocator import keep_freed_memory
from graphwire.commands.common import (
    NODE_ORDER,
    check_not_input,
    check_trainable_dataset,
    console,
    load_with_status,
    print_table,
)
from graphwire.fsutil import check_creatable
from graphwire.fullgraph.distributed import TRAINING_TAGS
from graphwire.fullgraph.job import FullGraphJob, RankReport, RunLog, run_rank
from graphwire.run.checkpoint import CheckpointConfig, check_resume, saved_schedule
from graphwire.run.config import TrainConfig
from graphwire.run.records import MetricsLog, format_bytes, format_summary

__all__ = [
    "ledger_span",
    "print_comm",
    "run_seconds",
    "run_distributed",
    "training_bytes_by_peer",
    "write_epochs",
]


def run_distributed(args: argparse.Namespace, config: TrainConfig, out: Path) -> int:
    from graphwire.comm.context import WorkerContext, default_backend, under_torchrun

    ctx: WorkerContext | None = None
    if under_torchrun():
        from graphwire.comm.launch import die_with_parent

        ctx = WorkerContext.from_env(backend=args.backend, timeout_s=args.timeout)
        # torchrun's agent stops its workers when it is stopped (SIGTERM: the
        # command line ends as on Ctrl-C, cleaning up), but not when it is
        # killed (SIGKILL, the OOM killer): this worker would train on alone,
        # and the other nodes' agents wait for its node at the end.
        die_with_parent(os.getppid())
        keep_freed_memory(int(args.keep_freed_mb))
        world, backend = ctx.world_size, ctx.backend
    else:  # a GPU per worker for nccl, checked before the graph is read
        from graphwire.comm.launch import check_local_backend, start_fork_server

        world = int(args.workers)
        backend = args.backend or default_backend(world)
        check_local_backend(backend, world)
        start_fork_server(backend)  # its imports overlap the graph's loading
    leader = ctx is None or ctx.rank == 0
    _check_not_input(args, out)
    checkpoint = _checkpoint(args, out, config)
    resuming = False
    if checkpoint is not None and checkpoint.resume:
        # Refuse a resume with other settings before any work; say so when
        # there is nothing to resume (a job script may always pass --resume).
        saved = check_resume(checkpoint, world)
        resuming = saved is not None
        if not resuming and leader:
            print(
                f"--resume: no checkpoint in {checkpoint.folder} yet; "
                "starting at epoch 0",
                file=sys.stderr,
            )
        elif saved is not None and saved + 1 >= config.epochs and leader:
            print(
                f"--resume: the checkpoint is of epoch {saved}, so --epochs "
                f"{config.epochs} leaves nothing to train; reporting the run so far",
                file=sys.stderr,
            )
    # The settings' own checks, before the graph is read or split.
    minibatch = args.mode == "minibatch"
    options: Any = _fetch_options(args) if minibatch else _engine_options(args)
    folder = _partitioned_folder(args, world, out, leader, resuming)
    if checkpoint is not None and (leader or resuming):
        # The parts are known now, so a resume on others is refused before any
        # work (a fresh run's other ranks under torchrun wait for rank 0 to
        # write them; every rank learns them once its part is loaded).
        checkpoint = checkpoint.on_parts(folder)
        if resuming:
            check_resume(checkpoint, world)  # the same parts as the run's
    header = _header(args, config, world, backend)
    header |= _settings(args, folder, options, leader)
    log = RunLog(str(out), header)
    job: Any
    if minibatch:
        from graphwire.minibatch.job import MinibatchJob
        from graphwire.minibatch.job import run_rank as run_minibatch_rank

        job = MinibatchJob(
            folder=str(folder),
            config=config,
            options=options,
            checkpoint=checkpoint,
            progress=not args.quiet,
            log=log,
            verify=args.verify,
        )
        target: Any = run_minibatch_rank
    else:
        job = FullGraphJob(
            folder=str(folder),
            config=config,
            exchange=args.exchange,
            options=options,
            checkpoint=checkpoint,
            progress=not args.quiet,
            log=log,
            verify=args.verify,
        )
        target = run_rank
    if ctx is not None:
        reports = target(ctx, job)
        if reports is None:
            return 0  # rank 0 reports
    else:
        from graphwire.comm.launch import launch_local

        results = launch_local(
            target,
            world,
            job,
            threads=int(args.threads or 1),
            keep_freed_mb=int(args.keep_freed_mb),
            timeout_s=args.timeout,
            backend=backend,
        )
        reports = results[0]
        assert reports is not None
    _say_if_stopped_before(reports, config)
    if minibatch:
        from graphwire.commands.report_minibatch import report_minibatch

        report_minibatch(log, reports)
    else:
        _report(log, reports)
    return 0


def _say_if_stopped_before(reports: list[RankReport], config: TrainConfig) -> None:
    """A resumed run that trained nothing though ``--epochs`` left epochs:
    the run it resumed had stopped early (and a resume keeps it stopped)."""
    lead = reports[0]
    first = lead.first_epoch
    if first and first < config.epochs and not own_records(lead):
        print(
            f"--resume: the run stopped early after epoch {first - 1} (no better "
            "validation accuracy, nor an equal one with a lower loss, since epoch "
            f"{lead.best_epoch}, --patience "
            f"{config.patience}); reporting the run so far",
            file=sys.stderr,
        )


def _header(
    args: argparse.Namespace, config: TrainConfig, world: int, backend: str
) -> dict[str, Any]:
    """The fields of the run's ``config`` record."""
    minibatch = args.mode == "minibatch"
    way = {"fetch": args.fetch} if minibatch else {"exchange": args.exchange}
    return {
        "dataset": args.dataset,
        "mode": args.mode,
        "workers": world,
        "backend": backend,
        **way,
        **config.as_dict(),
        "keep_freed_mb": args.keep_freed_mb,
    }


def _settings(
    args: argparse.Namespace, folder: Path, options: Any, leader: bool
) -> dict[str, Any]:
    """What else the ``config`` record holds (written by rank 0, the leader,
    whose parts are written by now): how the graph was split, and every
    setting of the exchange engine (the defaults it takes for those the
    flags leave unset) or of the feature fetching, so that runs of G3's
    ablation, say, can be told apart from their records."""
    from graphwire.partition.format import load_partition_meta

    settings: dict[str, Any] = {"parts": str(folder)}
    if leader:
        meta = load_partition_meta(folder)
        settings["partition"] = meta["method"]
        settings["node_order"] = meta["node_order"]
    if args.mode == "minibatch":
        fields = {} if isinstance(options, str) else dataclasses.asdict(options)
        return settings | {"fetch_options": {"fetch": args.fetch, **fields}}
    from graphwire.fullgraph.base import get_engine

    own = inspect.signature(get_engine(args.exchange).__init__).parameters.values()
    defaults = {
        p.name: p.default
        for p in own
        if p.kind is p.KEYWORD_ONLY and p.default is not p.empty and p.name != "widths"
    }
    return settings | {"exchange_options": defaults | options}


def _fetch_options(args: argparse.Namespace) -> Any:
    from graphwire.feature.rapid import RapidConfig

    where = args.presample_dir
    if where and Path(where).exists() and not Path(where).is_dir():
        raise ValueError(f"--presample-dir {where}: exists and is not a folder")
    if where:
        check_creatable(where, f"--presample-dir {where}")
    if args.fetch != "rapid":
        return args.fetch
    return RapidConfig(
        n_hot=args.n_hot,
        cache_mb=None if args.cache_mb is None else float(args.cache_mb),
        prefetch=int(args.prefetch),
        presample_dir=args.presample_dir,
    )


def _partitioned_folder(
    args: argparse.Namespace, world: int, out: Path, leader: bool, resuming: bool
) -> Path:
    """The parts the workers load: ``--dataset`` when it is partitioned;
    else ``OUT/partitions``, as they are when the run resumes from a
    checkpoint (whose settings name the same dataset), or written anew by
    the leader (a run that never reached a checkpoint, or another dataset's
    parts left in the folder, is split again)."""
    from graphwire.partition.format import is_partitioned_folder

    given = Path(args.dataset)
    if is_partitioned_folder(given):
        meta = _parts_meta(given, world, "--dataset")
        if args.partition and args.partition != meta["method"]:
            raise ValueError(
                f"--partition {args.partition}: --dataset {given} is split "
                f"already (by {meta['method']}); leave --partition out, or give "
                "the graph it was split from"
            )
        if args.node_order and args.node_order != meta["node_order"]:
            raise ValueError(
                f"--node-order {args.node_order}: --dataset {given} is split "
                f"already (its parts numbered {meta['node_order']}); "
                "leave --node-order out, or give the graph it was split from"
            )
        return given
    folder = out / "partitions"
    if resuming:
        if not (folder / "meta.json").exists():
            raise ValueError(
                f"--resume: {folder} is gone; the checkpoints hold state for "
                "the parts the run trained on, so they cannot be resumed on new ones"
            )
        return _resumed_folder(args, world, folder)
    if not leader:
        return folder  # rank 0 writes it; run_rank waits at the rendezvous
    from graphwire.commands.partition import write_parts

    graph = load_with_status(args.dataset, args.quiet, args.verify)
    check_trainable_dataset(graph, args.dataset)
    if world > graph.num_nodes:
        raise ValueError(
            f"{world} workers (--workers, or torchrun's world): more than the "
            f"{graph.num_nodes} nodes of {args.dataset}; each worker owns a part"
        )
    write_parts(
        graph,
        args.partition or "metis",
        world,
        int(args.seed),
        folder,
        args.quiet,
        node_order=args.node_order or NODE_ORDER,
    )
    return folder


def _check_not_input(args: argparse.Namespace, out: Path) -> None:
    """Refuse an ``--out`` whose parts (written unless ``--dataset`` is
    partitioned) or checkpoints (written and pruned) would replace the input."""
    from graphwire.partition.format import is_partitioned_folder

    written = [out / "checkpoints"] if args.checkpoint_every or args.resume else []
    if not is_partitioned_folder(args.dataset):
        written.append(out / "partitions")
    for folder in written:
        check_not_input(folder, args.dataset, f"--out {out}: {folder}")


def _parts_meta(folder: Path, world: int, flag: str) -> dict[str, Any]:
    """``meta.json`` of the partitioned ``folder``, which ``flag`` brought in;
    its number of parts must be the number of workers."""
    from graphwire.partition.format import load_partition_meta

    meta = load_partition_meta(folder)
    if meta["num_parts"] != world:
        raise ValueError(
            f"{flag} {folder}: has {meta['num_parts']} parts, but {world} "
            f"workers were asked for"
        )
    return meta


def _resumed_folder(args: argparse.Namespace, world: int, folder: Path) -> Path:
    """The parts a run being resumed trained on, kept as they are (not split
    again, perhaps another way)."""
    meta = _parts_meta(folder, world, "--resume")
    if args.partition and args.partition != meta["method"]:
        raise ValueError(
            f"--resume: the run was partitioned with {meta['method']}, not "
            f"--partition {args.partition}"
        )
    if args.node_order and args.node_order != meta["node_order"]:
        raise ValueError(
            f"--resume: the run's parts are numbered {meta['node_order']}, not "
            f"--node-order {args.node_order}"
        )
    return folder


def _engine_options(args: argparse.Namespace) -> dict[str, Any]:
    """The options of G3's engine that the flags give (``train`` has refused
    them with another exchange, and checked their bounds)."""
    options: dict[str, Any] = {}
    if args.g3_mode:
        options["mode"] = args.g3_mode
    if args.g3_sync:
        options["sync"] = args.g3_sync
    if args.g3_order:
        options["order"] = args.g3_order
    if args.g3_last:
        options["last"] = args.g3_last
    if args.bin_rows is not None:
        options["bin_rows"] = int(args.bin_rows)
    if args.bin_mb is not None:
        options["bin_mb"] = float(args.bin_mb)
    return options


def _checkpoint(
    args: argparse.Namespace, out: Path, config: TrainConfig
) -> CheckpointConfig | None:
    """Where the run checkpoints, how often and how many it keeps (a resume
    keeps the run's unless ``--checkpoint-every`` / ``--keep-checkpoints``
    say otherwise), with the settings that decide its results, which a
    resume must keep: the dataset, the mode, the exchange or the fetch, and
    the training settings but the epoch count, patience and evaluation
    interval (speed and memory settings, such as G3's bins, may change)."""
    if not (args.checkpoint_every or args.resume):
        return None
    folder = out / "checkpoints"
    dataset = Path(args.dataset)
    run = {
        "dataset": str(dataset.resolve()) if dataset.exists() else args.dataset,
        "mode": args.mode,
    }
    settings = config.as_dict()
    for free in ("epochs", "patience", "eval_every"):
        del settings[free]
    if args.mode == "minibatch":
        run["fetch"] = args.fetch
    else:
        run["exchange"] = args.exchange
        for unused in ("fanouts", "batch_size"):  # mini-batch settings
            del settings[unused]
    saved = saved_schedule(folder) if args.resume else {}
    every = args.checkpoint_every or saved.get("every") or 10**9
    keep = args.keep_checkpoints
    return CheckpointConfig(
        folder=str(folder),
        every=int(every),
        resume=bool(args.resume),
        run=run | settings,
        keep=saved.get("keep", 1) if keep is None else int(keep),
    )


def _report(run: RunLog, reports: list[RankReport]) -> None:
    with MetricsLog(run.out) as log:
        write_epochs(log, run, reports)
        _print_time_split(reports)
        totals = print_comm(reports)
        summary = _summary(reports, totals)
        log.write("summary", time=run_seconds(reports), **summary)
    console.print(f"metrics: {Path(run.out) / 'metrics.jsonl'}")
    print(format_summary(summary), flush=True)


def write_epochs(log: MetricsLog, run: RunLog, reports: list[RankReport]) -> None:
    """The ``config`` record, every rank's ``setup`` record, every rank's
    epoch records (:func:`write_epoch_records`) and every rank's ``teardown``
    record. The set-up and teardown hold the traffic before the rank's first
    epoch and after its last (``comm``, as an epoch record holds its own, and
    ``extra`` where the loop counts more) and ``seconds``, their length; the
    set-up's ``time`` is 0.0, the teardown's the rank's end. With the epochs
    from the rank's first on, they add up to the summary's bytes."""
    log.write("config", time=0.0, **run.header)
    for report in reports:
        setup = report.counters["phases"]["setup"]
        log.write("setup", time=0.0, rank=report.rank, **setup)
    write_epoch_records(log, reports)
    for report in reports:
        end = round(report.seconds, 4)
        teardown = report.counters["phases"]["teardown"]
        log.write("teardown", time=end, rank=report.rank, **teardown)


def write_epoch_records(log: MetricsLog, reports: list[RankReport]) -> None:
    """Every rank's epoch records, epoch by epoch, each at the time its rank
    stamped it."""
    for epoch in range(max(len(r.records) for r in reports)):
        for report in reports:
            if epoch < len(report.records):
                log.write("epoch", rank=report.rank, **report.records[epoch])


def run_seconds(reports: list[RankReport]) -> float:
    """The run's length: its slowest rank's, start to report."""
    return round(max(r.seconds for r in reports), 4)


def own_records(report: RankReport) -> list[dict[str, Any]]:
    """The epoch records of the epochs this run trained: a resumed run's
    records restored from the checkpoint were timed by the run it resumed."""
    return [r for r in report.records if r["epoch"] >= report.first_epoch]


def _print_time_split(reports: list[RankReport]) -> None:
    rows = []
    for report in reports:
        totals: dict[str, float] = defaultdict(float)
        for record in own_records(report):
            for key, value in record["times"].items():
                totals[key] += value
        work = totals["forward_s"] + totals["backward_s"]
        rows.append(
            (
                report.rank,
                report.num_owned,
                report.num_halo,
                work - totals["comm_s"],
                totals["comm_s"],
                totals["sync_s"],
                totals["eval_s"],
            )
        )
    print_table(
        f"time split per rank ({ledger_span(reports[0])[1]}, seconds)",
        ["rank", "owned", "halo", "compute", "comm", "grad sync", "eval"],
        rows,
    )


# The replicate engine's cost in rows: the L-hop nodes held beyond the owned
# ones, and the rows computed per forward beyond the owned ones.
_REPLICA_COUNTERS = ("replicated_rows", "redundant_rows")
_PEER_COLUMNS = 8  # a column per destination up to this many ranks


def training_bytes_by_peer(reports: list[RankReport]) -> list[list[int]]:
    """``[src][dst]``: the training bytes (:data:`TRAINING_TAGS`) each rank
    sent each other rank over the whole run, from the senders' ledgers."""
    world = len(reports)
    matrix = [[0] * world for _ in range(world)]
    for report in reports:
        for src, dst, tag, num_bytes, _ in report.ledger["sent"]:
            if tag.startswith(TRAINING_TAGS):
                matrix[src][dst] += num_bytes
    return matrix


def ledger_span(report: RankReport) -> tuple[int, str]:
    """How many epochs the ledgers count, and which, in words: all of them,
    or those since the checkpoint a resumed run started from."""
    first, count = report.first_epoch, report.epochs_run - report.first_epoch
    if count <= 0:
        return 0, "no epochs left to run, resumed"
    if first == 0:
        return count, f"{count} epoch{'s' if count > 1 else ''}"
    return count, f"epochs {first}-{report.epochs_run - 1}, resumed"


def _epoch_bytes_by_tag(reports: list[RankReport]) -> dict[str, int]:
    """Bytes sent per tag in the epochs the ledgers count (their records'
    windows, so set-up and teardown traffic of a tag, such as the set-up's
    ``sync.metrics``, is not spread over the epochs), over ranks."""
    sums: dict[str, int] = defaultdict(int)
    for report in reports:
        for record in own_records(report):
            for tag, num_bytes in record["comm"]["by_tag"].items():
                sums[tag] += num_bytes
    return sums


def print_comm(reports: list[RankReport]) -> dict[str, int]:
    """Tables of the bytes per tag and of each rank's training bytes, sent
    and received, to and from whom; the totals over ranks."""
    by_tag: dict[str, int] = defaultdict(int)
    messages: dict[str, int] = defaultdict(int)
    sent = recv = 0
    for report in reports:
        for _, _, tag, num_bytes, count in report.ledger["sent"]:
            sent += num_bytes
            by_tag[tag] += num_bytes
            messages[tag] += count
        recv += sum(row[3] for row in report.ledger["recv"])
    epochs, span = ledger_span(reports[0])
    per_epoch = _epoch_bytes_by_tag(reports)
    print_table(
        f"bytes by tag (all ranks, {span})",
        ["tag", "bytes", "per epoch", "messages"],
        [
            (
                tag,
                by_tag[tag],
                format_bytes(per_epoch[tag] / epochs)
                if tag in per_epoch and epochs
                else "-",
                messages[tag],
            )
            for tag in sorted(by_tag)
        ],
    )
    matrix = training_bytes_by_peer(reports)
    world = len(matrix)
    peers = range(world) if world <= _PEER_COLUMNS else range(0)
    print_table(
        f"training bytes by rank ({', '.join(t + '*' for t in TRAINING_TAGS)}; {span})",
        ["rank", "sent", "received", *(f"to {dst}" for dst in peers)],
        [
            (
                src,
                format_bytes(sum(matrix[src])),
                format_bytes(sum(row[src] for row in matrix)),
                *(
                    "-" if dst == src else format_bytes(matrix[src][dst])
                    for dst in peers
                ),
            )
            for src in range(world)
        ],
    )
    return {"bytes_sent": sent, "bytes_recv": recv}


def _summary(reports: list[RankReport], totals: dict[str, int]) -> dict[str, Any]:
    """The run's summary; ``resumed_at`` (a resumed run's first epoch) tells
    that the byte totals count the epochs from there. ``remote_rows`` counts
    the 1-hop halo (each rank's remote in-neighbours); the replicate engine
    adds what it holds and recomputes instead (:data:`_REPLICA_COUNTERS`)."""
    lead = reports[0]
    replicas = {
        name: sum(int(r.counters[name]) for r in reports)
        for name in _REPLICA_COUNTERS
        if name in lead.counters
    }
    epoch_s = [
        r["times"]["forward_s"] + r["times"]["backward_s"] + r["times"]["sync_s"]
        for r in own_records(lead)
    ] or [0.0]
    resumed = {"resumed_at": lead.first_epoch} if lead.first_epoch else {}
    return {
        "test_acc": lead.test_acc,
        "val_acc": lead.val_acc,
        "epochs": lead.epochs_run,
        "best_epoch": lead.best_epoch,
        "epoch_s_median": statistics.median(epoch_s),
        "workers": len(reports),
        "bytes_sent": totals["bytes_sent"],
        "bytes_recv": totals["bytes_recv"],
        "remote_rows": sum(r.num_halo for r in reports),
        **replicas,
        **resumed,
    }
