"""The record and summary of a distributed run, from every rank's report.

:func:`write_records` writes ``metrics.jsonl``: the ``config`` record, every
rank's ``setup`` record, every rank's epoch records, every rank's
``teardown`` record. The set-up and teardown hold the traffic before the
rank's first epoch and after its last (``comm``, and ``extra`` where the loop
counts more) and ``seconds``, their length; with the epochs they add up to
the summary's bytes (and, mini-batch, its remote rows and bytes). A resumed
run's records of the epochs from ``resumed_at`` on do, with its own set-up
and teardown: its tables and summary count the epochs it trained, not those
its checkpoint restored.

:func:`fullgraph_summary` and :func:`minibatch_summary` give the summary
line's fields. ``epoch_s_median`` (and mini-batch ``seeds_per_s``) is the
median over the run's epochs after its first, which carries the start-up
(first touches of memory, caches filling, the threads' first work) and is
given alone as ``first_epoch_s`` (:func:`first_and_rest`). Mini-batch:
global seeds/s of an epoch is all ranks' seeds over the slowest rank's
training time (the ranks step in lockstep); ``presample_s``, ``n_hot`` and
``cache_mib`` (rapid) are the largest over ranks; remote rows are the rows
pulled from other ranks (every on-demand, prefetch and cache-fill row) and
remote bytes the ledger's bytes of those requests and answers (labels count in
``bytes_sent`` and ``bytes_recv`` only).
"""

from __future__ import annotations

import statistics
import sys
from typing import Any

from graphwire.feature.traffic import fetch_traffic, fetched_rows
from graphwire.run.config import TrainConfig
from graphwire.run.job import RankReport
from graphwire.run.records import MetricsLog

__all__ = [
    "TRAINING_TAGS",
    "first_and_rest",
    "fullgraph_summary",
    "ledger_span",
    "minibatch_summary",
    "own_records",
    "run_seconds",
    "say_if_stopped_before",
    "write_records",
]

# The tags of an epoch's training traffic: each layer's exchanges and the
# parameter gradients' sums (set-up, evaluation and metrics are not).
TRAINING_TAGS = ("fwd.", "bwd.", "sync.grad")


def write_records(
    log: MetricsLog, header: dict[str, Any], reports: list[RankReport]
) -> None:
    """The ``config`` record, every rank's ``setup`` record, every rank's
    epoch records (:func:`write_epoch_records`) and every rank's ``teardown``
    record. The set-up and teardown hold the traffic before the rank's first
    epoch and after its last (``comm``, as an epoch record holds its own, and
    ``extra`` where the loop counts more) and ``seconds``, their length; the
    set-up's ``time`` is 0.0, the teardown's the rank's end. With the epochs
    from the rank's first on, they add up to the summary's bytes."""
    log.write("config", time=0.0, **header)
    for report in reports:
        setup = report.counters["phases"]["setup"]
        log.write("setup", time=0.0, rank=report.rank, **setup)
    _write_epoch_records(log, reports)
    for report in reports:
        end = round(report.seconds, 4)
        teardown = report.counters["phases"]["teardown"]
        log.write("teardown", time=end, rank=report.rank, **teardown)


def _write_epoch_records(log: MetricsLog, reports: list[RankReport]) -> None:
    """Every rank's epoch records, epoch by epoch, each at the time its rank
    stamped it."""
    for epoch in range(max(len(r.records) for r in reports)):
        for report in reports:
            if epoch < len(report.records):
                log.write("epoch", rank=report.rank, **report.records[epoch])


def first_and_rest(values: list[float]) -> tuple[float, float]:
    """A run's first epoch's figure, and the median over its later epochs
    (of one epoch, that epoch's; of none, 0.0 both). The first epoch of a
    run, or of a resumed one, pays the start-up, so a median over every
    epoch of a short run (a benchmark's 4-6) would be skewed by it."""
    if not values:
        return 0.0, 0.0
    return values[0], statistics.median(values[1:] or values)


def run_seconds(reports: list[RankReport]) -> float:
    """The run's length: its slowest rank's, start to report."""
    return round(max(r.seconds for r in reports), 4)


def own_records(report: RankReport) -> list[dict[str, Any]]:
    """The epoch records of the epochs this run trained: a resumed run's
    records restored from the checkpoint were timed by the run it resumed."""
    return [r for r in report.records if r["epoch"] >= report.first_epoch]


def ledger_span(report: RankReport) -> tuple[int, str]:
    """How many epochs the ledgers count, and which, in words: all of them,
    or those since the checkpoint a resumed run started from."""
    first, count = report.first_epoch, report.epochs_run - report.first_epoch
    if count <= 0:
        return 0, "no epochs left to run, resumed"
    if first == 0:
        return count, f"{count} epoch{'s' if count > 1 else ''}"
    return count, f"epochs {first}-{report.epochs_run - 1}, resumed"


def say_if_stopped_before(reports: list[RankReport], config: TrainConfig) -> None:
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


# The replicate engine's cost in rows: the L-hop nodes held beyond the owned
# ones, and the rows computed per forward beyond the owned ones.
_REPLICA_COUNTERS = ("replicated_rows", "redundant_rows")


def fullgraph_summary(
    reports: list[RankReport], totals: dict[str, int]
) -> dict[str, Any]:
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
    ]
    first_s, median_s = first_and_rest(epoch_s)
    resumed = {"resumed_at": lead.first_epoch} if lead.first_epoch else {}
    return {
        "test_acc": lead.test_acc,
        "val_acc": lead.val_acc,
        "epochs": lead.epochs_run,
        "best_epoch": lead.best_epoch,
        "epoch_s_median": median_s,
        "first_epoch_s": first_s,
        "workers": len(reports),
        "bytes_sent": totals["bytes_sent"],
        "bytes_recv": totals["bytes_recv"],
        "remote_rows": sum(r.num_halo for r in reports),
        **replicas,
        **resumed,
    }


def minibatch_summary(reports: list[RankReport]) -> dict[str, Any]:
    """The summary fields of a mini-batch run (module docstring)."""
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
    task = "link" if any("link" in r["extra"] for r in lead.records) else "node"
    link = link_summary(lead.records, lead.best_epoch)
    return with_task(
        link=link,
        task=task,
        summary={
            "test_acc": lead.test_acc,
            "val_acc": lead.val_acc,
            "epochs": lead.epochs_run,
            "best_epoch": lead.best_epoch,
            "workers": len(reports),
            "epoch_s_median": first_and_rest(train_s)[1],
            "first_epoch_s": first_and_rest(train_s)[0],
            "seeds_per_s": first_and_rest(per_epoch)[1],
            "remote_rows": remote_rows,
            "remote_bytes": feature_bytes,
            "cache_hit_rate": hits / (hits + missed) if hits + missed else 0.0,
            "presample_s": max(r.counters.get("presample_s", 0.0) for r in reports),
            "n_hot": max(r.counters.get("n_hot", 0) for r in reports),
            "cache_mib": max(r.counters.get("cache_bytes", 0) for r in reports) / 2**20,
            "bytes_sent": sent,
            "bytes_recv": recv,
            **({"resumed_at": lead.first_epoch} if lead.first_epoch else {}),
        },
    )


LINK_SUMMARY = ("auc", "mrr", "hits@1", "hits@10")


def link_summary(records: list[dict[str, Any]], best_epoch: int) -> dict[str, Any]:
    """A link-prediction run's headline: the held-out metrics of its best
    epoch (``records``: as :meth:`EpochRecord.as_dict`, ``extra["link"]``
    holding them), test ones first, then the validation AUC."""
    best = next((r for r in records if r["epoch"] == best_epoch), None)
    link = {} if best is None else best["extra"].get("link", {})
    out = {f"test_{m}": link.get(f"test_{m}") for m in LINK_SUMMARY}
    return out | {"val_auc": link.get("val_auc")}


def with_task(
    summary: dict[str, Any], task: str, link: dict[str, Any]
) -> dict[str, Any]:
    """``summary`` as ``task`` reports it: link prediction's ``link``
    metrics in place of the accuracies."""
    if task != "link":
        return summary
    rest = {k: v for k, v in summary.items() if k not in ("test_acc", "val_acc")}
    return link | rest
