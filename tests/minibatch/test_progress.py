"""What rank 0 of a distributed mini-batch run prints after each epoch: the
task graphs' queue, DAGs in flight and CPU (``--schedule fifo|bytegnn``),
and link prediction's AUCs in place of the accuracies."""

from __future__ import annotations

import math

from graphwire.minibatch.progress import print_epoch
from graphwire.run.training import EpochRecord


def _record(**extra: object) -> EpochRecord:
    times = dict.fromkeys(
        ("sample_s", "fetch_s", "wait_s", "forward_s", "backward_s", "sync_s"), 0.5
    )
    resources = {
        "energy_j": None,
        "energy_source": "energy unavailable",
        "cpu_s": 3.0,
        "peak_rss_mb": 100.0,
    }
    base = {
        "cache_hits": 0,
        "missed_rows": 10,
        "resources": resources,
        "seeds_per_s": 1000.0,
        "remote_rows": 10,
        "remote_messages": 2,
        "remote_bytes": 4096,
        "sample_busy_s": 1.25,
        "fetch_busy_s": 0.75,
    }
    return EpochRecord(
        epoch=3,
        loss=0.5,
        train_acc=math.nan,
        val_acc=0.875,
        test_acc=0.8125,
        times=times,
        peak_rss_mb=100.0,
        extra=base | extra,
    )


def test_an_epoch_line_shows_the_schedule_and_link_metrics(capsys) -> None:
    print_epoch(_record())
    plain = capsys.readouterr().out
    assert "val 0.8750  test 0.8125" in plain and "queue" not in plain
    schedule = {
        "queue_mean": 1.5,
        "queue_max": 3,
        "inflight_mean": 2.25,
        "inflight_max": 4,
        "cpu_util": 87.0,
    }
    print_epoch(_record(schedule=schedule, link={"test_mrr": 0.5}))
    line = capsys.readouterr().out
    assert "val auc 0.8750  test auc 0.8125 mrr 0.5000" in line
    assert "pool sample 1.25s fetch 0.75s  queue 1.50 (max 3)" in line
    assert "in flight 2.25 (max 4)  launcher cpu 87%" in line
