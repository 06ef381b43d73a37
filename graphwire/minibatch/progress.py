"""What rank 0 of a distributed mini-batch run prints after each epoch."""

from __future__ import annotations

from graphwire.run.training import EpochRecord, format_acc

__all__ = ["print_epoch"]


def print_epoch(record: EpochRecord) -> None:
    """Rank 0's line after an epoch: loss, accuracies, throughput, time split,
    remote rows, cache hit rate and resources."""
    t, extra = record.times, record.extra
    hits, missed = extra["cache_hits"], extra["missed_rows"]
    rate = hits / (hits + missed) if hits + missed else 0.0
    res = extra["resources"]
    joules = res["energy_j"]
    energy = f"{joules:.1f} J" if joules is not None else res["energy_source"]
    print(
        f"epoch {record.epoch:4d}  loss {record.loss:.4f}  "
        f"{_metrics(record)}  "
        f"rank0 seeds/s {extra['seeds_per_s']:.0f}  "
        f"sample {t['sample_s']:.2f}s fetch {t['fetch_s']:.2f}s "
        f"wait {t['wait_s']:.2f}s compute {t['forward_s'] + t['backward_s']:.2f}s "
        f"sync {t['sync_s']:.2f}s  remote rows {extra['remote_rows']} "
        f"({extra['remote_messages']} messages, "
        f"{extra['remote_bytes'] / 2**20:.2f} MiB)  hit rate {rate:.3f}  "
        f"cpu {res['cpu_s']:.2f}s  peak rss {res['peak_rss_mb']:.0f} MiB  "
        f"energy {energy}{_schedule(extra)}{_dgs(extra)}",
        flush=True,
    )


def _metrics(record: EpochRecord) -> str:
    """The accuracies, or link prediction's AUCs and test MRR."""
    link = record.extra.get("link")
    if link is None:
        return f"val {format_acc(record.val_acc)}  test {format_acc(record.test_acc)}"
    return (
        f"val auc {format_acc(record.val_acc)}  test auc "
        f"{format_acc(record.test_acc)} mrr {format_acc(link['test_mrr'])}"
    )


def _schedule(extra: dict) -> str:
    """The task graphs' figures (``--schedule fifo|bytegnn``): sampling and
    fetching on the pool's threads, the queue of batches waiting for the
    trainer and the DAGs in flight (mean and largest), the CPU utilisation
    the launcher saw."""
    sched = extra.get("schedule")
    if sched is None:
        return ""
    return (
        f"  pool sample {extra['sample_busy_s']:.2f}s fetch "
        f"{extra['fetch_busy_s']:.2f}s  queue {sched['queue_mean']:.2f} "
        f"(max {sched['queue_max']})  in flight {sched['inflight_mean']:.2f} "
        f"(max {sched['inflight_max']})  launcher cpu {sched['cpu_util']:.0f}%"
    )


def _dgs(extra: dict) -> str:
    """DGS's figures (``--fetch dgs``): the share of dimensions pulled per
    remote row, the explainer's CPU and last loss this epoch."""
    dgs = extra.get("dgs")
    if dgs is None:
        return ""
    loss = dgs["explain_loss"]
    shown = "-" if loss is None else f"{loss:.3f}"
    return (
        f"  dims {dgs['dims_share']:.2f}  explain {dgs['explain_rounds']} rounds "
        f"{dgs['explain_cpu_s']:.2f}s cpu loss {shown}"
    )
