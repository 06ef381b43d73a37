"""`start_run`: run a `RunSpec`, on one process or as a distributed job.

One process: load the dataset, optionally partition it (to report what a
distributed run would face), run the mode's loop, report. Distributed
(``--workers N`` or ``torchrun``), in this order:

0. the run folder: one holding an earlier run is refused unless the run
   resumes it or ``--overwrite`` replaces it (under torchrun, rank 0 checks);
1. the partitioned graph: ``--dataset`` may name one already (its number of
   parts must equal the number of workers); otherwise the dataset is loaded and
   partitioned (``--partition``, default ``metis``) into ``OUT/partitions``
   (kept as it is when the run is resumed);
2. the workers: N local processes (``launch_local``) or, under ``torchrun``,
   this process as one of them (which dies with its agent); each runs
   :func:`~graphwire.run.job.run_rank` with the mode's loop;
3. the report (rank 0 / the parent): every rank's records in
   ``metrics.jsonl`` (rank 0 streams its own into ``metrics.jsonl.partial``
   while it trains, which the report replaces), the mode's tables and the
   summary line (:mod:`graphwire.run.tables`).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

from graphwire.allocator import keep_freed_memory
from graphwire.comm.context import (
    WorkerContext,
    default_backend,
    restart_attempt,
    usable_cores,
)
from graphwire.fsutil import check_creatable
from graphwire.run.checkpoint import check_resume
from graphwire.run.flags import FlagTable
from graphwire.run.job import Job, run_rank
from graphwire.run.mode import Mode
from graphwire.run.outputs import claim_run_folder, run_folder
from graphwire.run.parts import (
    check_outputs,
    checkpoint_config,
    partitioned_folder,
    strategy_settings,
)
from graphwire.run.single import run_one_process
from graphwire.run.spec import RunSpec
from graphwire.run.summary import say_if_stopped_before
from graphwire.run.tables import write_report

__all__ = ["oversubscribed", "start_run"]


def start_run(spec: RunSpec, mode: Mode, table: FlagTable) -> int:
    """Run ``spec`` with ``mode``'s loops; the command's exit status."""
    _check_folders(spec, table)
    if not spec.distributed:
        out = run_folder(spec.output.out, f"train-{spec.train.model}")
        return run_one_process(spec, mode, out)
    strategy = spec.strategy
    assert strategy is not None
    how = "minibatch" if spec.mode == "minibatch" else strategy.name
    out = run_folder(spec.output.out, f"train-{spec.train.model}-{how}")
    return _run_distributed(spec, mode, out)


def _check_folders(spec: RunSpec, table: FlagTable) -> None:
    """The strategy's folder options (``--presample-dir``) must be folders,
    or paths where one can be made: refused before any work."""
    choice = spec.strategy
    if choice is None:
        return
    for flag in table.section(spec.strategy_kind):
        where = getattr(choice.config, flag.name, None) if flag.strategies else None
        if not (flag.metadata.get("folder") and where):
            continue
        if Path(where).exists() and not Path(where).is_dir():
            raise ValueError(f"{flag.flag} {where}: exists and is not a folder")
        check_creatable(where, f"{flag.flag} {where}")


def _run_distributed(spec: RunSpec, mode: Mode, out: Path) -> int:
    launch = spec.launch
    ctx: WorkerContext | None = None
    if spec.torchrun:
        from graphwire.comm.launch import die_with_parent

        ctx = WorkerContext.from_env(
            backend=launch.backend,
            timeout_s=launch.timeout,
            stall_notice_s=launch.stall_notice,
        )
        # torchrun's agent stops its workers when it is stopped (SIGTERM: the
        # command line ends as on Ctrl-C, cleaning up), but not when it is
        # killed (SIGKILL, the OOM killer): this worker would train on alone,
        # and the other nodes' agents wait for its node at the end.
        die_with_parent(os.getppid())
        keep_freed_memory(launch.keep_freed_mb)
        backend = ctx.backend
    else:  # a GPU per worker for nccl, checked before the graph is read
        from graphwire.comm.launch import check_local_backend

        backend = launch.backend or default_backend(spec.world)
        check_local_backend(backend, spec.world)
    leader = ctx is None or ctx.rank == 0
    check_outputs(spec, out)
    # Under torchrun rank 0 alone (the others would race it); a restarted
    # attempt (--max-restarts) goes on with its own run.
    if leader and not restart_attempt():
        claim_run_folder(
            out,
            spec.data.dataset,
            overwrite=spec.output.overwrite,
            resume=spec.checkpoint.resume,
        )
    crowded = oversubscribed(ctx, spec.world)
    if crowded:
        sys.stderr.write(crowded + "\n")  # one write: ranks share the stream
        sys.stderr.flush()
    if ctx is None:
        from graphwire.comm.launch import start_fork_server

        start_fork_server(backend)  # its imports overlap the graph's loading
    checkpoint = checkpoint_config(spec, out)
    resuming = False
    if checkpoint is not None and checkpoint.resume:
        # Refuse a resume with other settings before any work; say so when
        # there is nothing to resume (a job script may always pass --resume).
        saved = check_resume(checkpoint, spec.world)
        resuming = saved is not None
        if leader:
            _say_resumed(checkpoint.folder, saved, spec.train.epochs)
    folder = partitioned_folder(spec, out, leader, resuming)
    if checkpoint is not None and (leader or resuming):
        # The parts are known now, so a resume on others is refused before any
        # work (a fresh run's other ranks under torchrun wait for rank 0 to
        # write them; every rank learns them once its part is loaded).
        checkpoint = checkpoint.on_parts(folder)
        if resuming:
            check_resume(checkpoint, spec.world)  # the same parts as the run's
    strategy = spec.strategy
    assert strategy is not None
    job = Job(
        folder=str(folder),
        config=spec.train,
        train=mode.train_rank,
        strategy=strategy.config,
        show=None if spec.output.quiet else mode.print_epoch,
        checkpoint=checkpoint,
        out=str(out),
        header=_header(spec, backend, folder, leader),
        verify=spec.data.verify,
    )
    if ctx is not None:
        reports = run_rank(ctx, job)
        if reports is None:
            return 0  # rank 0 reports
    else:
        from graphwire.comm.launch import launch_local

        reports = launch_local(
            run_rank,
            spec.world,
            job,
            threads=launch.threads or 1,
            keep_freed_mb=launch.keep_freed_mb,
            timeout_s=launch.timeout,
            stall_notice_s=launch.stall_notice,
            backend=backend,
        )[0]
        assert reports is not None
    say_if_stopped_before(reports, spec.train)
    write_report(str(out), job.header, reports, mode.report)
    return 0


def oversubscribed(ctx: WorkerContext | None, world: int) -> str | None:
    """The warning that this machine runs more workers than it has cores,
    for the process that says it: the launcher of ``world`` local workers
    (``ctx`` None), or under torchrun this machine's first worker (of
    ``ctx.local_world_size``). None: nothing to say here."""
    if ctx is not None and ctx.local_rank != 0:
        return None
    # (a launcher that does not say how many are here: this one, at least)
    workers = world if ctx is None else ctx.local_world_size or 1
    cores = usable_cores()
    if workers <= cores:
        return None
    return (
        f"graphwire: warning: {workers} workers on this machine's {cores} "
        f"core{'s' if cores != 1 else ''}: they take turns on the CPUs, so the "
        "run's times measure CPU sharing, not communication"
    )


def _say_resumed(folder: str, saved: int | None, epochs: int) -> None:
    if saved is None:
        print(
            f"--resume: no checkpoint in {folder} yet; starting at epoch 0",
            file=sys.stderr,
        )
    elif saved + 1 >= epochs:
        print(
            f"--resume: the checkpoint is of epoch {saved}, so --epochs "
            f"{epochs} leaves nothing to train; reporting the run so far",
            file=sys.stderr,
        )


def _header(spec: RunSpec, backend: str, folder: Path, leader: bool) -> dict[str, Any]:
    """The fields of the run's ``config`` record: the run's settings, how the
    graph was split (written by rank 0, the leader, whose parts are written
    by now), and every setting of the exchange or fetcher, so that runs of
    G3's ablation, say, can be told apart from their records."""
    from graphwire.partition.format import load_partition_meta

    strategy = spec.strategy
    assert strategy is not None
    header: dict[str, Any] = {
        "dataset": spec.data.dataset,
        "mode": spec.mode,
        "workers": spec.world,
        "backend": backend,
        spec.strategy_kind: strategy.name,
        **spec.train_settings(),
        "keep_freed_mb": spec.launch.keep_freed_mb,
        "parts": str(folder),
    }
    if leader:
        meta = load_partition_meta(folder)
        header["partition"] = meta["method"]
        header["node_order"] = meta["node_order"]
    return header | strategy_settings(spec)
