"""Run reports: a run's ``metrics.jsonl`` read into a :class:`RunSummary`, and
the Markdown table that compares runs, one row each.

Only ``RUN/metrics.jsonl`` is read (:mod:`graphwire.run.records` writes it). The
figures come from its records:

- test accuracy, epoch time median, remote rows and cache hit rate: the
  ``summary`` record's (``-`` where it has none: one process has no remote
  rows, full-graph no cache);
- the time split: shares of all ranks' epoch time, summed over the ``epoch``
  records, in the phases the run's mode has: compute (forward and backward,
  less the exchanges the full-graph loop times inside them), comm, sync,
  sample, fetch, wait, eval;
- bytes per epoch: all ranks' bytes sent in the epoch records' windows (set-up
  and teardown are not spread over epochs), over the epochs, by training tag:
  every tag but evaluation's (``eval.*``) and bookkeeping (``meta.*``,
  ``sync.metrics``).
"""

from __future__ import annotations

import json
import math
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from graphwire.units import format_bytes

__all__ = [
    "PHASES",
    "RunSummary",
    "is_training_tag",
    "markdown_table",
    "read_records",
    "read_run",
]

# Phase -> (times keys it adds, keys it takes away), in the table's order.
_PHASE_KEYS: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {
    "compute": (("forward_s", "backward_s"), ("comm_s",)),
    "comm": (("comm_s",), ()),
    "sync": (("sync_s",), ()),
    "sample": (("sample_s",), ()),
    "fetch": (("fetch_s",), ()),
    "wait": (("wait_s",), ()),
    "eval": (("eval_s",), ()),
}
PHASES = tuple(_PHASE_KEYS)
# The phases a mode's loop times; its records may hold more keys (full-graph
# records carry a sample_s that is always 0).
_MODE_PHASES = {
    "fullgraph": ("compute", "comm", "sync", "eval"),
    "minibatch": ("sample", "fetch", "wait", "compute", "sync", "eval"),
}
_NOT_TRAINING = ("eval.", "meta.", "sync.metrics")


def is_training_tag(tag: str) -> bool:
    """Whether ``tag``'s bytes are training traffic (not evaluation's or
    bookkeeping's)."""
    return not tag.startswith(_NOT_TRAINING)


@dataclass(frozen=True, kw_only=True, slots=True)
class RunSummary:
    """One run's figures, as its ``metrics.jsonl`` gives them.

    Attributes:
        name: how tables and plots label the run (its folder's name).
        mode, model, strategy, dataset: the config record's (strategy: the
            exchange of a full-graph run, the fetch of a mini-batch one);
            None where it has none.
        workers: ranks (1: one process).
        test_acc, epoch_s_median, remote_rows, cache_hit_rate: the summary
            record's; None where it has none.
        epochs: the epoch numbers of the epoch records, ascending.
        loss, val_acc: per epoch of ``epochs``, the mean over ranks (NaN
            where not evaluated or diverged).
        seconds: ``[rank][phase]``, the seconds summed over epochs, for the
            phases the run has.
        bytes_by_rank: ``[tag][rank]``, training bytes each rank sent per
            epoch.
        bytes_by_peer: ``[src][dst]``, bytes (all tags) sent per epoch.
    """

    name: str
    mode: str | None
    model: str | None
    strategy: str | None
    dataset: str | None
    workers: int
    test_acc: float | None
    epoch_s_median: float | None
    remote_rows: int | None
    cache_hit_rate: float | None
    epochs: list[int]
    loss: list[float]
    val_acc: list[float]
    seconds: list[dict[str, float]]
    bytes_by_rank: dict[str, list[float]] = field(default_factory=dict)
    bytes_by_peer: list[list[float]] = field(default_factory=list)

    @property
    def phases(self) -> tuple[str, ...]:
        """The phases this run times, in :data:`PHASES` order."""
        return tuple(p for p in PHASES if p in self.seconds[0])

    def time_shares(self) -> dict[str, float]:
        """Phase -> its share of all ranks' epoch time (shares add up to 1)."""
        totals = {p: sum(rank[p] for rank in self.seconds) for p in self.phases}
        whole = sum(totals.values())
        return {p: (t / whole if whole > 0 else 0.0) for p, t in totals.items()}

    def bytes_per_epoch(self) -> dict[str, float]:
        """Training tag -> all ranks' bytes sent per epoch."""
        return {tag: sum(ranks) for tag, ranks in self.bytes_by_rank.items()}


def read_records(path: Path) -> list[dict[str, Any]]:
    """The records of a ``metrics.jsonl``, in file order.

    Raises:
        FileNotFoundError: ``path`` does not exist.
        ValueError: a line is not a JSON object with a ``kind`` (naming the
            line), or an epoch record lacks what a report reads.
    """
    if not path.is_file():
        unfinished = path.with_name(path.name + ".partial").is_file()
        why = "the run did not finish" if unfinished else "is RUN a run folder?"
        raise FileNotFoundError(f"{path}: not found ({why})")
    try:
        lines = path.read_text(encoding="utf-8").splitlines(keepends=True)
    except UnicodeDecodeError:
        raise ValueError(f"{path}: not a text file (UTF-8)") from None
    records = []
    for number, line in enumerate(lines, start=1):
        where = f"{path}: line {number}"
        try:
            record = json.loads(line, parse_constant=_refuse_constant)
        except ValueError as error:
            cut = "truncated, " if not line.endswith("\n") else ""
            why = getattr(error, "msg", str(error))
            raise ValueError(f"{where}: {cut}not valid JSON ({why})") from None
        if not isinstance(record, dict) or not isinstance(record.get("kind"), str):
            raise ValueError(f"{where}: expected a JSON object with a 'kind'")
        if record["kind"] == "epoch" and (problem := _epoch_problem(record)):
            raise ValueError(f"{where}: epoch record: {problem}")
        records.append(record)
    return records


def _refuse_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def _epoch_problem(record: dict[str, Any]) -> str | None:
    """What an epoch record lacks that a report reads, or None."""
    for key in ("epoch", "rank"):
        value = record.get(key, 0)
        if not isinstance(value, int) or isinstance(value, bool) or value < 0:
            return f"expected a whole number '{key}', found {value!r}"
    times = record.get("times")
    if not isinstance(times, dict) or not all(
        isinstance(v, int | float) for v in times.values()
    ):
        return "expected 'times', seconds by phase"
    comm = record.get("comm", {})
    by_tag, by_peer = (
        comm.get(k, {}) if isinstance(comm, dict) else None
        for k in ("by_tag", "by_peer")
    )
    if not (
        isinstance(by_tag, dict)
        and isinstance(by_peer, dict)
        and all(isinstance(v, int) for v in [*by_tag.values(), *by_peer.values()])
        and all(peer.isdigit() for peer in by_peer)
    ):
        return "expected 'comm' with bytes by tag ('by_tag') and by rank ('by_peer')"
    return None


def read_run(folder: Path, name: str | None = None) -> RunSummary:
    """The :class:`RunSummary` of the run in ``folder`` (its ``metrics.jsonl``).

    Raises:
        FileNotFoundError: no ``metrics.jsonl`` there.
        ValueError: the file is not valid, or holds no epoch records.
    """
    path = folder / "metrics.jsonl"
    records = read_records(path)
    epochs = [r for r in records if r["kind"] == "epoch"]
    if not epochs:
        raise ValueError(f"{path}: no epoch records (the run trained no epochs)")
    config = _first(records, "config")
    summary = _first(records, "summary")
    workers = config.get("workers")
    workers = workers if isinstance(workers, int) and workers > 0 else 1
    numbers = sorted({r["epoch"] for r in epochs})
    ranks = max(workers, 1 + max(int(r.get("rank", 0)) for r in epochs))
    text = {k: str(v) for k, v in config.items() if isinstance(v, str | int)}
    return RunSummary(
        name=name or folder.resolve().name,
        mode=text.get("mode"),
        model=text.get("model"),
        strategy=text.get("exchange") or text.get("fetch"),
        dataset=text.get("dataset"),
        workers=workers,
        test_acc=summary.get("test_acc"),
        epoch_s_median=summary.get("epoch_s_median"),
        remote_rows=summary.get("remote_rows"),
        cache_hit_rate=summary.get("cache_hit_rate"),
        epochs=numbers,
        loss=_per_epoch(epochs, numbers, "loss"),
        val_acc=_per_epoch(epochs, numbers, "val_acc"),
        seconds=_seconds(epochs, ranks, text.get("mode")),
        bytes_by_rank=_bytes_by_rank(epochs, ranks, len(numbers)),
        bytes_by_peer=_bytes_by_peer(epochs, ranks, len(numbers)),
    )


def _first(records: list[dict[str, Any]], kind: str) -> dict[str, Any]:
    return next((r for r in records if r["kind"] == kind), {})


def _per_epoch(
    epochs: list[dict[str, Any]], numbers: list[int], key: str
) -> list[float]:
    values: dict[int, list[float]] = defaultdict(list)
    for record in epochs:
        value = record.get(key)
        if isinstance(value, int | float):
            values[record["epoch"]].append(float(value))
    return [sum(v) / len(v) if (v := values[e]) else math.nan for e in numbers]


def _seconds(
    epochs: list[dict[str, Any]], ranks: int, mode: str | None
) -> list[dict[str, float]]:
    keys = {key for record in epochs for key in record["times"]}
    phases = [
        phase
        for phase in _MODE_PHASES.get(mode or "", PHASES)
        if set(_PHASE_KEYS[phase][0]) <= keys
    ]
    seconds = [
        dict.fromkeys(sorted(phases, key=PHASES.index), 0.0) for _ in range(ranks)
    ]
    for record in epochs:
        times = record["times"]
        for phase in phases:
            added, taken = _PHASE_KEYS[phase]
            value = sum(times.get(k, 0.0) for k in added)
            seconds[int(record.get("rank", 0))][phase] += value - sum(
                times.get(k, 0.0) for k in taken
            )
    return seconds


def _bytes_by_rank(
    epochs: list[dict[str, Any]], ranks: int, num_epochs: int
) -> dict[str, list[float]]:
    totals: dict[str, list[int]] = defaultdict(lambda: [0] * ranks)
    for record in epochs:
        for tag, num_bytes in record.get("comm", {}).get("by_tag", {}).items():
            if is_training_tag(tag):
                totals[tag][int(record.get("rank", 0))] += num_bytes
    return {
        tag: [num_bytes / num_epochs for num_bytes in totals[tag]]
        for tag in sorted(totals)
    }


def _bytes_by_peer(
    epochs: list[dict[str, Any]], ranks: int, num_epochs: int
) -> list[list[float]]:
    totals = [[0] * ranks for _ in range(ranks)]
    for record in epochs:
        for peer, num_bytes in record.get("comm", {}).get("by_peer", {}).items():
            if int(peer) < ranks:
                totals[int(record.get("rank", 0))][int(peer)] += num_bytes
    return [[num_bytes / num_epochs for num_bytes in row] for row in totals]


def markdown_table(runs: list[RunSummary]) -> str:
    """One Markdown row per run, columns padded to line up as text; the time
    split has a column per phase any of the runs has."""
    phases = [p for p in PHASES if any(p in run.phases for run in runs)]
    header = ["run", "mode", "model", "exchange/fetch", "workers", "dataset"]
    header += ["test acc", "epoch s (median)", *(f"{p} %" for p in phases)]
    header += ["train bytes/epoch", "by tag", "remote rows", "cache hit rate"]
    rows = [header] + [_row(run, phases) for run in runs]
    widths = [max(len(row[i]) for row in rows) for i in range(len(header))]
    lines = [
        "| " + " | ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)) + " |"
        for row in rows
    ]
    lines.insert(1, "|" + "|".join("-" * (w + 2) for w in widths) + "|")
    return "\n".join(lines) + "\n"


def _row(run: RunSummary, phases: list[str]) -> list[str]:
    shares = run.time_shares()
    tags = run.bytes_per_epoch()
    cells = [run.name, run.mode, run.model, run.strategy, str(run.workers)]
    cells += [run.dataset, _number(run.test_acc, ".4f")]
    cells += [_number(run.epoch_s_median, ".4g")]
    cells += [_number(shares.get(p), ".1%") for p in phases]
    cells += [format_bytes(sum(tags.values())) if tags else None]
    cells += ["; ".join(f"{tag} {format_bytes(b)}" for tag, b in tags.items())]
    cells += [_number(run.remote_rows, ","), _number(run.cache_hit_rate, ".1%")]
    return [(c or "-").replace("|", "\\|") for c in cells]


def _number(value: float | None, spec: str) -> str:
    """``value`` formatted, or ``-`` when missing (or not a number)."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return "-"
    return format(value, spec)
