"""A distributed job: what every rank runs, however it was started.

``graphwire train --workers N`` starts N local processes
(:func:`~graphwire.comm.launch.launch_local`); ``torchrun ... -m graphwire
train`` starts them itself. Either way each process calls :func:`run_rank`
with its :class:`~graphwire.comm.context.WorkerContext` and the same
:class:`Job`: join the process group, load this rank's part
(memory-mapped), run the job's loop, then gather every rank's report on rank
0, which returns them (the others return ``None``). The loop is the job's
``train`` (a full-graph or a mini-batch one): :func:`run_rank` does not know
which.

While it trains, rank 0 streams its epoch records into
``OUT/metrics.jsonl.partial`` (:class:`EpochStream`), so a long run can be
watched and a run that dies late leaves the epochs it finished; the report
written at the end, with every rank's records, replaces that file with
``metrics.jsonl``. Every rank stamps its records with the seconds since it
started (``EpochRecord.time``; an epoch restored from a checkpoint keeps the
stamp of the process that ran it). The stream opens with the run's first
epoch, so a run that fails before one (a bad part or checkpoint file) leaves
the file an earlier run left as it was; a resumed run's stream starts with
the epochs its checkpoint restored.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from graphwire.comm.base import Transport, name_ranks
from graphwire.comm.context import WorkerContext
from graphwire.comm.dist import TorchTransport
from graphwire.partition.format import load_part
from graphwire.partition.local import LocalPart
from graphwire.run.checkpoint import CheckpointConfig, parts_digest
from graphwire.run.config import TrainConfig
from graphwire.run.records import MetricsLog
from graphwire.run.training import EpochRecord, TrainResult

__all__ = [
    "EpochStream",
    "Job",
    "RankReport",
    "gather_reports",
    "load_agreed_part",
    "rank_report",
    "run_rank",
]


@dataclass(frozen=True, kw_only=True)
class Job:
    """Everything a rank needs (picklable; the same on every rank).

    Attributes:
        folder: the partitioned graph (one part per rank).
        config: model and optimiser settings.
        train: the loop, ``train(part, transport, job, on_epoch)``, which
            returns the run (its ``result``, ``ledger``, ``counters`` and
            ``first_epoch``): a module-level function, or a
            ``functools.partial`` of one.
        strategy: the exchange's or fetcher's name or config, which
            ``train`` hands its loop.
        show: what rank 0 prints after each epoch (None: nothing).
        checkpoint: where and how often to checkpoint, and whether to resume.
        out: the run folder rank 0 streams its records into (None: none).
        header: the fields of the stream's ``config`` record.
        verify: each rank checks its part's files against their SHA-256 in
            ``meta.json`` as it loads them (``--verify``).
    """

    folder: str
    config: TrainConfig
    train: Callable[[LocalPart, Transport, Job, EpochStream], Any]
    strategy: Any = None
    show: Callable[[EpochRecord], None] | None = None
    checkpoint: CheckpointConfig | None = None
    out: str | None = None
    header: dict[str, Any] = field(default_factory=dict)
    verify: bool = False

    def rank_checkpoint(self) -> CheckpointConfig | None:
        """The checkpoint settings, tied to this job's parts (their digest)."""
        return self.checkpoint and self.checkpoint.on_parts(self.folder)


@dataclass(kw_only=True)
class RankReport:
    """One rank's run, sent to rank 0 at the end (``records``: as
    :meth:`EpochRecord.as_dict`, stamped with their ``time``)."""

    rank: int
    records: list[dict[str, Any]]
    ledger: dict[str, Any]
    counters: dict[str, Any]
    num_owned: int
    num_halo: int
    test_acc: float
    val_acc: float
    best_epoch: int
    epochs_run: int
    seconds: float
    first_epoch: int = 0  # resumed: its ledger counts epochs first_epoch.. only


def run_rank(ctx: WorkerContext, job: Job) -> list[RankReport] | None:
    """Run ``job`` as rank ``ctx.rank``: join the process group, load its
    part, run ``job.train`` with rank 0 streaming its records into
    ``job.out`` and printing each with ``job.show``, then gather every
    rank's report on rank 0, which returns them."""
    start = time.perf_counter()
    lead = ctx.rank == 0
    transport = TorchTransport.open(ctx)
    try:
        part = load_agreed_part(
            job.folder, transport, job.verify, spans_machines=ctx.spans_machines
        )
        with MetricsLog(job.out if lead else None, final=False) as stream:
            on_epoch = EpochStream(
                ctx.rank, start, stream, job.show if lead else None, job.header
            )
            run = job.train(part, transport, job, on_epoch)
        return gather_reports(transport, rank_report(ctx.rank, part, run, start))
    finally:
        transport.close()


def load_agreed_part(
    folder: str,
    transport: Transport,
    verify: bool = False,
    *,
    spans_machines: bool = False,
) -> LocalPart:
    """This rank's part of ``folder``, once every rank has loaded its own
    part of the same parts (an ``all_gather_object`` of what each found:
    ``meta.json``'s SHA-256, or why it could not load; tag ``meta.parts``).
    With ``verify``, each rank also checks its part's files against their
    SHA-256 (:func:`~graphwire.partition.format.load_part`).

    Raises:
        ValueError: on every rank alike, naming the ranks that could not load
            their part and why, or the ranks whose parts differ, and how to
            mend it. With ``spans_machines``
            (:attr:`~graphwire.comm.context.WorkerContext.spans_machines`)
            ``folder`` is a path on each machine: the parts rank 0 writes
            into its ``--out`` are not on the others unless they share it.
            On one machine the parts are all in one folder, to be written
            again.
    """
    part: LocalPart | None = None
    try:
        part = load_part(folder, transport.rank, verify=verify)
        seen = ("parts", parts_digest(folder))
    except (ValueError, OSError) as error:  # a DatasetError is a ValueError
        seen = ("error", str(error))
    found = transport.all_gather_object(seen, "meta.parts")
    failed = _ranks_by(found, "error")
    if failed:
        why = "; ".join(f"{ranks}: {error}" for error, ranks in failed.items())
        fix = _SAME_PARTS if spans_machines else _write_again(folder, len(found))
        raise ValueError(f"the parts could not be loaded on {why}. {fix}")
    digests = _ranks_by(found, "parts")
    if len(digests) > 1:
        which = ", ".join(
            f"{ranks} (meta.json SHA-256 {digest[:12]}...)"
            for digest, ranks in digests.items()
        )
        fix = _SAME_PARTS if spans_machines else f"{folder} {_CHANGED}"
        raise ValueError(f"the ranks loaded different parts: {which}. {fix}")
    assert part is not None
    return part


_SAME_PARTS = (
    "Every rank loads its part of the same partitioned graph: on several "
    "machines, give them an --out they share, or split the graph first "
    "(graphwire partition) and give each machine a copy as --dataset"
)
_CHANGED = "was written again while the ranks loaded it: run again once it is written"


def _write_again(folder: str, num_parts: int) -> str:
    """How to mend parts that are damaged or missing on this one machine."""
    return (
        f"Write {folder} again: graphwire partition --dataset GRAPH --parts "
        f"{num_parts} --out {folder} --overwrite (a run's own OUT/partitions "
        "is written anew by a run without --resume)"
    )


def _ranks_by(found: list[tuple[str, str]], kind: str) -> dict[str, str]:
    """``{value: "rank 2"}`` or ``"ranks 0, 1"``, of the ranks that found
    ``(kind, value)``, in the order of the first rank of each."""
    groups: dict[str, list[int]] = {}
    for rank, (got, value) in enumerate(found):
        if got == kind:
            groups.setdefault(value, []).append(rank)
    return {value: name_ranks(ranks) for value, ranks in groups.items()}


@dataclass
class EpochStream:
    """A rank's ``on_epoch``: stamps each record with its epoch's end
    (``EpochRecord.time``: seconds since ``start``, a perf_counter), appends
    it to ``log`` (open on rank 0 only) and calls ``show`` with it. The
    first record is preceded by a ``config`` record of ``header``'s fields
    and the records a resume restored."""

    rank: int
    start: float
    log: MetricsLog
    show: Callable[[EpochRecord], None] | None
    header: dict[str, Any] = field(default_factory=dict)
    _before: list[EpochRecord] | None = field(
        default_factory=list, init=False, repr=False
    )

    def __call__(self, record: EpochRecord) -> None:
        record.time = round(time.perf_counter() - self.start, 4)
        if self._before is not None:  # the run's first epoch: open the stream
            self.log.write("config", time=0.0, **self.header)
            for earlier in self._before:
                self.log.write("epoch", rank=self.rank, **earlier.as_dict())
            self._before = None
        self.log.write("epoch", rank=self.rank, **record.as_dict())
        if self.show is not None:
            self.show(record)

    def restored(self, records: list[EpochRecord]) -> None:
        """The records a resume restored, streamed with the stamps they were
        saved with before the first epoch this run trains (not shown: their
        epochs were shown when they ran)."""
        assert self._before is not None, "restored after the first epoch"
        self._before = list(records)


def rank_report(rank: int, part: LocalPart, run: Any, start: float) -> RankReport:
    """This rank's report of a finished ``run`` (its ``result``, ``ledger``,
    ``counters`` and ``first_epoch``, the epoch this process started at;
    ``start``: the rank's perf_counter at its start)."""
    result: TrainResult = run.result
    return RankReport(
        rank=rank,
        records=[r.as_dict() for r in result.records],
        ledger=run.ledger,
        counters=run.counters,
        num_owned=part.num_owned,
        num_halo=part.num_halo,
        test_acc=result.test_acc,
        val_acc=result.val_acc,
        best_epoch=result.best_epoch,
        epochs_run=result.epochs_run,
        seconds=time.perf_counter() - start,
        first_epoch=run.first_epoch,
    )


def gather_reports(transport: Transport, report: RankReport) -> list[RankReport] | None:
    """Every rank's report on rank 0 (the others get None)."""
    reports = transport.all_gather_object(dataclasses.asdict(report), "meta.report")
    return [RankReport(**r) for r in reports] if transport.rank == 0 else None
