"""A distributed mini-batch job: what every rank runs, however it was started.

As :mod:`graphwire.fullgraph.job`: ``graphwire train --workers N --mode
minibatch`` spawns N local processes, ``torchrun`` starts them itself; each
joins the process group, loads its part (memory-mapped), trains, and rank 0
gathers every rank's report; rank 0 streams its epoch records into
``OUT/metrics.jsonl.partial`` as it goes. The rank's part is
:func:`~graphwire.fullgraph.job.serve_rank`'s, with this loop.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from graphwire.comm.base import Transport
from graphwire.comm.context import WorkerContext
from graphwire.fullgraph.job import EpochStream, RankReport, RunLog, serve_rank
from graphwire.minibatch.dist import train_minibatch_distributed
from graphwire.partition.local import LocalPart
from graphwire.run.checkpoint import CheckpointConfig
from graphwire.run.config import TrainConfig
from graphwire.run.training import EpochRecord, format_acc

__all__ = ["MinibatchJob", "run_rank"]


@dataclass(frozen=True, kw_only=True)
class MinibatchJob:
    """Everything a rank needs (picklable; the same on every rank); the
    fields as :class:`~graphwire.fullgraph.job.FullGraphJob`'s."""

    folder: str
    config: TrainConfig
    options: Any
    checkpoint: CheckpointConfig | None = None
    progress: bool = True
    log: RunLog | None = None
    verify: bool = False


def run_rank(ctx: WorkerContext, job: MinibatchJob) -> list[RankReport] | None:
    """Run ``job`` as rank ``ctx.rank``; rank 0 returns every rank's report."""

    def train(part: LocalPart, transport: Transport, on_epoch: EpochStream) -> Any:
        return train_minibatch_distributed(
            part,
            transport,
            job.config,
            job.options,
            on_epoch=on_epoch,
            on_restore=on_epoch.restored,
            checkpoint=job.checkpoint and job.checkpoint.on_parts(job.folder),
        )

    return serve_rank(ctx, job, train, _show)


def _show(record: EpochRecord) -> None:
    t, extra = record.times, record.extra
    hits, missed = extra["cache_hits"], extra["missed_rows"]
    rate = hits / (hits + missed) if hits + missed else 0.0
    res = extra["resources"]
    joules = res["energy_j"]
    energy = f"{joules:.1f} J" if joules is not None else res["energy_source"]
    print(
        f"epoch {record.epoch:4d}  loss {record.loss:.4f}  "
        f"val {format_acc(record.val_acc)}  test {format_acc(record.test_acc)}  "
        f"rank0 seeds/s {extra['seeds_per_s']:.0f}  "
        f"sample {t['sample_s']:.2f}s fetch {t['fetch_s']:.2f}s "
        f"wait {t['wait_s']:.2f}s compute {t['forward_s'] + t['backward_s']:.2f}s "
        f"sync {t['sync_s']:.2f}s  remote rows {extra['remote_rows']} "
        f"({extra['remote_messages']} messages, "
        f"{extra['remote_bytes'] / 2**20:.2f} MiB)  hit rate {rate:.3f}  "
        f"cpu {res['cpu_s']:.2f}s  peak rss {res['peak_rss_mb']:.0f} MiB  "
        f"energy {energy}",
        flush=True,
    )
