"""The tables a run prints at its end, and its summary line.

A distributed full-graph run prints the time split per rank (compute,
communication, gradient sync, evaluation), the bytes per tag and each rank's
training bytes to each peer; a mini-batch run the time split per rank
(sample, fetch, wait, compute, sync: disjoint parts of its training time,
then evaluation) and each rank's remote traffic by purpose (on-demand pulls,
prefetches, cache fills, sampling). A one-process run prints its time split
over all epochs. Each ends with the summary line (:mod:`graphwire.run.summary`).
"""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path
from typing import Any

from graphwire.feature.traffic import FETCH_KINDS
from graphwire.run.console import console, print_table
from graphwire.run.job import RankReport
from graphwire.run.records import MetricsLog, format_summary
from graphwire.run.summary import (
    TRAINING_TAGS,
    fullgraph_summary,
    ledger_span,
    minibatch_summary,
    own_records,
    run_seconds,
    write_records,
)
from graphwire.run.training import TrainResult
from graphwire.units import format_bytes

__all__ = [
    "fullgraph_report",
    "minibatch_report",
    "print_comm",
    "print_time_split",
    "training_bytes_by_peer",
    "write_report",
]

_PEER_COLUMNS = 8  # a column per destination up to this many ranks


def fullgraph_report(reports: list[RankReport]) -> dict[str, Any]:
    """Print a distributed full-graph run's tables; its summary fields."""
    _fullgraph_time_split(reports)
    totals = print_comm(reports)
    return fullgraph_summary(reports, totals)


def minibatch_report(reports: list[RankReport]) -> dict[str, Any]:
    """Print a distributed mini-batch run's tables; its summary fields."""
    _minibatch_time_split(reports)
    _traffic_table(reports)
    return minibatch_summary(reports)


def write_report(
    out: str, header: dict[str, Any], reports: list[RankReport], report: Any
) -> None:
    """Write ``out/metrics.jsonl`` from every rank's report, print the tables
    (``report``: :func:`fullgraph_report` or :func:`minibatch_report`) and
    the summary line."""
    with MetricsLog(out) as log:
        write_records(log, header, reports)
        summary = report(reports)
        log.write("summary", time=run_seconds(reports), **summary)
    console.print(f"metrics: {Path(out) / 'metrics.jsonl'}")
    print(format_summary(summary), flush=True)


def print_time_split(result: TrainResult) -> None:
    """A one-process run's seconds per phase over all epochs."""
    totals: dict[str, float] = {}
    for record in result.records:
        for key, value in record.times.items():
            totals[key] = totals.get(key, 0.0) + value
    grand = sum(totals.values()) or 1.0
    rows = [
        (k.removesuffix("_s"), v, f"{100 * v / grand:.1f}%") for k, v in totals.items()
    ]
    print_table("time split (all epochs)", ["phase", "seconds", "share"], rows)


def _fullgraph_time_split(reports: list[RankReport]) -> None:
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


def training_bytes_by_peer(reports: list[RankReport]) -> list[list[int]]:
    """``[src][dst]``: the training bytes (:data:`TRAINING_TAGS`) each rank
    sent each other rank over the whole run, from the senders' ledgers; a
    column past the last rank is a peer that is not one (the switch of
    ``--exchange switch``)."""
    world = len(reports)
    # Columns past the last rank: peers that are not ranks (the switch).
    peers = max([world] + [r[1] + 1 for rep in reports for r in rep.ledger["sent"]])
    matrix = [[0] * peers for _ in range(world)]
    for report in reports:
        for src, dst, tag, num_bytes, _ in report.ledger["sent"]:
            if tag.startswith(TRAINING_TAGS):
                matrix[src][dst] += num_bytes
    return matrix


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
    # What ranks received from peers that are not ranks (they keep no ledger).
    outside = [
        sum(
            r[3]
            for r in report.ledger["recv"]
            if r[0] >= world and r[2].startswith(TRAINING_TAGS)
        )
        for report in reports
    ]
    width = len(matrix[0]) if matrix else 0
    peers = range(width) if width <= _PEER_COLUMNS else range(0)
    print_table(
        f"training bytes by rank ({', '.join(t + '*' for t in TRAINING_TAGS)}; {span})",
        [
            "rank",
            "sent",
            "received",
            *(f"to {dst}" if dst < world else "to switch" for dst in peers),
        ],
        [
            (
                src,
                format_bytes(sum(matrix[src])),
                format_bytes(sum(row[src] for row in matrix) + outside[src]),
                *(
                    "-" if dst == src else format_bytes(matrix[src][dst])
                    for dst in peers
                ),
            )
            for src in range(world)
        ],
    )
    return {"bytes_sent": sent, "bytes_recv": recv}


def _minibatch_time_split(reports: list[RankReport]) -> None:
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
        for tag, drawn in report.counters.get("pairs", {}).items():  # --task link
            rows.append(
                (
                    report.rank,
                    f"pair.{tag}",
                    drawn["remote_rows"],
                    drawn["requests"],
                    recv[f"pair.{tag}"] / 2**20,
                )
            )
    print_table(
        "remote traffic per rank (rows and requests this rank asked for; "
        f"{ledger_span(reports[0])[1]})",
        ["rank", "purpose", "rows", "requests", "MiB received"],
        rows,
    )
