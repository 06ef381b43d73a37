"""The report of a distributed mini-batch run (rank 0 / the parent process).

``metrics.jsonl`` gets the ``config`` record, every rank's ``setup`` record,
every rank's per-epoch records, every rank's ``teardown`` record and the
``summary``. The set-up is everything before the rank's first epoch (the
set-up collectives, rapid's presampling and first hot-cache fill), the
teardown what followed its last (closing the services); each holds its
traffic as an epoch record does (``comm``, and ``extra``'s ``remote_rows``,
``remote_bytes``, ``remote_messages``) and ``seconds``, its length (the
set-up's ``time`` is 0.0, the teardown's the rank's end). Every byte and row
falls in one of them (:mod:`~graphwire.minibatch.traffic`), so over ranks
they add up to the summary's ``bytes_sent``, ``bytes_recv``,
``remote_rows`` and ``remote_bytes``; of a resumed run, the records of the
epochs from ``resumed_at`` on do, with its own set-up and teardown.

Stdout gets the time
split per rank (sample, fetch, wait, compute, sync: disjoint parts of the
training time, compute being ``forward_s + backward_s``, the optimizer step
included; then eval), the feature traffic per rank (rows and bytes by
purpose: on-demand pulls, prefetches, cache fills), and the summary line with
``remote_rows=``, ``remote_bytes=``, ``cache_hit_rate=`` and ``seeds_per_s=``.

Global seeds/s of an epoch is all ranks' seeds over the slowest rank's
training time (the ranks step in lockstep); the summary gives the median over
epochs. ``presample_s``, ``n_hot`` and ``cache_mib`` (rapid) are the largest
over ranks. Remote rows are the rows pulled from other ranks (the stores' counters:
every on-demand, prefetch and cache-fill row); remote bytes are the ledger's
bytes of those requests and answers (``kv.pull``, ``kv.prefetch`` and
``kv.cache`` tags; labels, ``kv.labels``, count in ``bytes_sent`` and
``bytes_recv`` only). A resumed run's rows, bytes, times and rates count the
epochs from its checkpoint on, which ``resumed_at`` names (the restored
epochs were timed by the run it resumed).
"""

from __future__ import annotations

import statistics
from collections import defaultdict
from pathlib import Path
from typing import Any

from graphwire.commands.common import console, print_table
from graphwire.commands.train_dist import (
    ledger_span,
    own_records,
    run_seconds,
    write_epochs,
)
from graphwire.fullgraph.job import RankReport, RunLog
from graphwire.minibatch.traffic import FETCH_KINDS, fetch_traffic, fetched_rows
from graphwire.run.records import MetricsLog, format_summary

__all__ = ["report_minibatch", "summarise"]


def summarise(reports: list[RankReport]) -> dict[str, Any]:
    """The summary fields of a run (see the module docstring)."""
    lead = reports[0]
    # The epochs this run trained, not those restored from a checkpoint.
    ran = [own_records(r) for r in reports]
    epochs = min(len(records) for records in ran)
    # Per epoch: the slowest rank's training time, and all ranks' seeds over it.
    train_s = [
        max(records[e]["extra"]["train_s"] for records in ran) for e in range(epochs)
    ]
    per_epoch = []
    for e, slowest in enumerate(train_s):
        seeds = sum(records[e]["extra"]["seeds"] for records in ran)
        per_epoch.append(seeds / slowest if slowest > 0 else 0.0)
    own = [rec for records in ran for rec in records]
    hits = sum(rec["extra"]["cache_hits"] for rec in own)
    missed = sum(rec["extra"]["missed_rows"] for rec in own)
    remote_rows = sum(fetched_rows(r.counters["store"]) for r in reports)
    sent = sum(row[3] for r in reports for row in r.ledger["sent"])
    recv = sum(row[3] for r in reports for row in r.ledger["recv"])
    feature_bytes = sum(fetch_traffic(r.ledger)[0] for r in reports)
    return {
        "test_acc": lead.test_acc,
        "val_acc": lead.val_acc,
        "epochs": lead.epochs_run,
        "best_epoch": lead.best_epoch,
        "workers": len(reports),
        "epoch_s_median": statistics.median(train_s) if train_s else 0.0,
        "seeds_per_s": statistics.median(per_epoch) if per_epoch else 0.0,
        "remote_rows": remote_rows,
        "remote_bytes": feature_bytes,
        "cache_hit_rate": hits / (hits + missed) if hits + missed else 0.0,
        "presample_s": max(r.counters.get("presample_s", 0.0) for r in reports),
        "n_hot": max(r.counters.get("n_hot", 0) for r in reports),
        "cache_mib": max(r.counters.get("cache_bytes", 0) for r in reports) / 2**20,
        "bytes_sent": sent,
        "bytes_recv": recv,
        **({"resumed_at": lead.first_epoch} if lead.first_epoch else {}),
    }


def report_minibatch(run: RunLog, reports: list[RankReport]) -> None:
    with MetricsLog(run.out) as log:
        write_epochs(log, run, reports)
        _time_table(reports)
        _traffic_table(reports)
        summary = summarise(reports)
        log.write("summary", time=run_seconds(reports), **summary)
    console.print(f"metrics: {Path(run.out) / 'metrics.jsonl'}")
    print(format_summary(summary), flush=True)


def _time_table(reports: list[RankReport]) -> None:
    rows = []
    for report in reports:
        t: dict[str, float] = defaultdict(float)
        seeds = 0
        for record in own_records(report):
            for key, value in record["times"].items():
                t[key] += value
            seeds += record["extra"]["seeds"]
        rows.append(
            (
                report.rank,
                seeds,
                t["sample_s"],
                t["fetch_s"],
                t["wait_s"],
                t["forward_s"] + t["backward_s"],
                t["sync_s"],
                t["eval_s"],
            )
        )
    _, span = ledger_span(reports[0])
    print_table(
        f"time split per rank ({span}, seconds; compute: forward, backward and "
        "the optimizer step)",
        ["rank", "seeds", "sample", "fetch", "wait", "compute", "sync", "eval"],
        rows,
    )


def _traffic_table(reports: list[RankReport]) -> None:
    rows = []
    for report in reports:
        store = report.counters["store"]
        recv: dict[str, int] = defaultdict(int)
        for _, _, tag, num_bytes, _ in report.ledger["recv"]:
            recv[tag] += num_bytes
        for kind in FETCH_KINDS:
            if kind not in store:
                continue
            rows.append(
                (
                    report.rank,
                    kind,
                    store[kind]["remote_rows"],
                    store[kind]["remote_requests"],
                    recv[f"kv.{kind}"] / 2**20,
                )
            )
        sampler = report.counters.get("sampler", {})
        rows.append(
            (
                report.rank,
                "sample.hop",
                sampler.get("remote_rows", 0),
                sampler.get("requests", 0),
                recv["sample.hop"] / 2**20,
            )
        )
    print_table(
        "remote traffic per rank (rows and requests this rank asked for; "
        f"{ledger_span(reports[0])[1]})",
        ["rank", "purpose", "rows", "requests", "MiB received"],
        rows,
    )
