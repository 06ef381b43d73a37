"""SANCUS's bounded staleness against CAGNET, SkipG and G3: bytes, accuracy, time.

python benchmarks/bench_staleness.py [--nodes 200000] [--epochs 25]
                                     [--cora-epochs 100] [--workers 2,4]
                                     [--graphs synthetic,cora] [--seeds 0]
                                     [--rounds 2] [--rate-mbit 1000] [--quick]
                                     [--only NAME [NAME ...]] [--json PATH]

On the synthetic products-like graph (F=100) and on Cora, with 2 and 4
workers of one thread each on METIS parts (partitioned once per worker
count, before any run), it trains a 2-layer GCN (graphwire's defaults:
hidden 16, lr 0.01) once per variant and seed, every variant with the same
seed:

- ``CAGNET``: ``--exchange broadcast --staleness none``;
- ``SCS-E1/E2/E3``: ``--staleness epoch:1|2|3``; ``SCS-A1/A2``:
  ``adaptive:1|2``; ``SCS-H1/H2/H3``: ``gap:0.01|0.02|0.03`` (relative norm);
- ``SkipG-1``: ``--staleness none --grad-staleness 1``. K=1 halves the
  gradient bytes (``bwd.*`` and ``sync.grad``), which on the synthetic graph
  are as large as the broadcasts, so its byte cut is SCS-E1's; ``SkipG-2``
  runs with ``--only``;
- ``g3``: ``--exchange g3``; ``g3+E1``: ``--exchange g3 --staleness
  epoch:1`` (``g3+A1``, adaptive:1, with ``--only``).

The 4-worker runs are unshaped (four workers share two cores, so their epoch
is CPU-bound); the 2-worker runs (one core each) share one loopback shaped to
``--rate-mbit`` by ``tbf`` and give the epoch times. ``--rounds`` R > 1 adds
R - 1 timing-only rounds of 13 epochs at 2 workers on the synthetic graph,
the variants in reverse order, then forward, alternating (Cora's bytes take
microseconds on the link: its time ratio comes from the accuracy runs alone).

Per variant it prints, from every rank's per-epoch records in
``metrics.jsonl``, the mean over epochs of the training bytes (tags
``fwd.*``, ``bwd.*``, ``flags.*``, ``sync.grad*``, summed over ranks; the
evaluation's ``eval.*`` broadcasts always send everything and are left out)
and of the broadcast bytes alone (``fwd.*``: what Skip-Broadcast cuts), each
with its cut against CAGNET's; the test accuracy of the last epoch (a fixed
epoch count) and the summary's (at the best validation epoch, taken as
convergence, with that epoch); the epochs until the test accuracy first
reaches CAGNET's summary accuracy minus 1 point; the cache (the largest
rank's ``extra.staleness.cache_bytes``); and at 2 workers rank 0's epoch
(forward, backward, gradient sync) averaged over epochs 1.. with its ratio to
CAGNET's (the mean, because skip and send epochs alternate: a median picks
one of them) beside the summary's median. With several seeds, accuracies and
epochs are means over seeds. Then the issue's checks as lines with their
figures: an SCS variant cuts the broadcast bytes >= 35% with test accuracy no
more than 0.5 point below CAGNET's; SkipG loses more accuracy than the best
SCS variant at a similar or larger cut of the training bytes; g3+staleness
moves fewer bytes than g3 at accuracy no more than 0.5 point below, and its
fwd and bwd bytes exceed g3's in no epoch. A failing variant is printed with
its command and error; the others still run.
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from graphwire.commands.bench import run_script
from graphwire.testing.netns import ShapedNetwork, netns_available

sys.path.insert(0, str(Path(__file__).resolve().parent))
from shaped_bench import (  # noqa: E402
    TIMEOUTS,
    RunFailed,
    add_graph_flags,
    add_run_flags,
    check_flags,
    cli,
    comma_list,
    epoch_records,
    in_work_folder,
    prepare_graph,
    shaper_check,
    train_runs,
    worker_counts,
    write_figures,
)

BROADCAST = ("--exchange", "broadcast")
VARIANTS: dict[str, tuple[str, ...]] = {
    "CAGNET": (*BROADCAST, "--staleness", "none"),
    **{f"SCS-E{k}": (*BROADCAST, "--staleness", f"epoch:{k}") for k in (1, 2, 3)},
    **{f"SCS-A{k}": (*BROADCAST, "--staleness", f"adaptive:{k}") for k in (1, 2)},
    **{f"SCS-H{k}": (*BROADCAST, "--staleness", f"gap:0.0{k}") for k in (1, 2, 3)},
    **{
        f"SkipG-{k}": (*BROADCAST, "--staleness", "none", "--grad-staleness", str(k))
        for k in (1, 2)
    },
    "g3": ("--exchange", "g3"),
    "g3+E1": ("--exchange", "g3", "--staleness", "epoch:1"),
    "g3+A1": ("--exchange", "g3", "--staleness", "adaptive:1"),
}
DEFAULT = tuple(v for v in VARIANTS if v not in ("SkipG-2", "g3+A1"))
QUICK_VARIANTS = ("CAGNET", "SCS-E1", "SkipG-1", "g3", "g3+E1")
GRAPHS = ("synthetic", "cora")
TRAINING = ("fwd.", "bwd.", "flags.", "sync.grad")
TIMED_WORKERS = 2  # one core each: more workers than cores time the CPU
TIMED_EPOCHS = 13  # epochs 1..12 hold whole periods of every schedule here
CUT_TARGET, ACC_SLACK, TARGET_BELOW = 0.35, 0.005, 0.01
SIMILAR_CUT = 0.10  # SkipG against SCS variants cutting at least this near
CORA = Path(__file__).resolve().parents[2] / "shared" / "data" / "planetoid" / "cora"
MIB = 2**20

FULL = {"nodes": 200_000, "epochs": 25, "cora_epochs": 100, "rounds": 2}
QUICK = {"nodes": 20_000, "epochs": 5, "cora_epochs": 5, "rounds": 1}
MINIMUMS = {"nodes": 100, "features": 1, "epochs": 2, "cora_epochs": 2, "rounds": 1}


@dataclass(slots=True)
class Result:
    """One run's figures; bytes are per epoch and summed over ranks."""

    train_bytes: float = 0.0  # training tags, mean over epochs
    fwd_bytes: float = 0.0  # fwd.* (the broadcasts), mean over epochs
    test_acc: float = 0.0  # summary: at the best validation epoch
    best_epoch: int = 0
    last_acc: float = 0.0  # the last epoch's
    curve: list[float] = field(default_factory=list)  # test acc per epoch
    fwd_epochs: list[int] = field(default_factory=list)  # fwd.* per epoch
    bwd_epochs: list[int] = field(default_factory=list)  # bwd.* per epoch
    cache_mib: float | None = None  # largest rank's, None: no staleness record
    epoch_s: float = 0.0  # rank 0's fwd+bwd+sync, mean over epochs 1..
    median_s: float = 0.0  # the summary's epoch_s_median
    wall_s: float = 0.0
    seed: int = 0
    round_index: int = 0  # 0: the accuracy run; 1..: timing only
    timed: bool = False  # shaped, at TIMED_WORKERS, the first seed


def _result(summary: dict[str, str], wall: float, out: Path) -> Result:
    """The figures of one ended run, from its summary and ``metrics.jsonl``."""
    ranks = epoch_records(out)
    epochs = len(ranks[0])
    train, fwd, bwd = [0] * epochs, [0] * epochs, [0] * epochs
    cache: float | None = None
    for records in ranks.values():
        for index, record in enumerate(records[:epochs]):
            for tag, sent in record.get("comm", {}).get("by_tag", {}).items():
                train[index] += sent if tag.startswith(TRAINING) else 0
                fwd[index] += sent if tag.startswith("fwd.") else 0
                bwd[index] += sent if tag.startswith("bwd.") else 0
            stale = record.get("extra", {}).get("staleness", {})
            if "cache_bytes" in stale:
                most = max(stale["cache_bytes"], default=0) / MIB
                cache = most if cache is None else max(cache, most)
    lead = ranks[0]
    parts = ("forward_s", "backward_s", "sync_s")  # the summary's epoch time
    times = [sum(r["times"][k] for k in parts) for r in lead]
    return Result(
        train_bytes=statistics.fmean(train),
        fwd_bytes=statistics.fmean(fwd),
        test_acc=float(summary["test_acc"]),
        best_epoch=int(summary["best_epoch"]),
        last_acc=float(lead[-1]["test_acc"]),
        curve=[float(r["test_acc"]) for r in lead],
        fwd_epochs=fwd,
        bwd_epochs=bwd,
        cache_mib=cache,
        epoch_s=statistics.fmean(times[1:] or times),
        median_s=float(summary["epoch_s_median"]),
        wall_s=wall,
    )


@dataclass(slots=True)
class Row:
    """One variant's line: accuracy and bytes from the accuracy runs (means
    over seeds), times from the timed runs (medians over rounds)."""

    train_bytes: float
    fwd_bytes: float
    train_cut: float | None  # 1 - this / CAGNET's; None without CAGNET
    fwd_cut: float | None
    last_acc: float
    test_acc: float
    best_epoch: float
    to_target: float | None  # epochs; None: a seed never reached the target
    cache_mib: float | None
    epoch_s: float | None  # None: not timed (4 workers)
    median_s: float | None
    time_ratio: float | None  # median over rounds of the round's ratio
    round_ratios: list[float] = field(default_factory=list)


def _epochs_to(curve: list[float], target: float) -> int | None:
    """Epochs run when the test accuracy first reached ``target``."""
    return next((i + 1 for i, acc in enumerate(curve) if acc >= target), None)


def _cut(value: float, base: float | None) -> float | None:
    return 1 - value / base if base else None


def _rows(runs: dict[str, list[Result]]) -> tuple[dict[str, Row], float | None]:
    """Each variant's Row, and the target of ``to_target`` (CAGNET's test
    accuracy minus 1 point; None without CAGNET)."""
    accuracy = {v: [r for r in rs if r.round_index == 0] for v, rs in runs.items()}
    accuracy = {v: rs for v, rs in accuracy.items() if rs}
    base = accuracy.get("CAGNET")
    target = statistics.fmean(r.test_acc for r in base) - TARGET_BELOW if base else None
    timed = {v: {r.round_index: r for r in rs if r.timed} for v, rs in runs.items()}
    rows = {}
    for variant, done in accuracy.items():

        def mean(name: str, done: list[Result] = done) -> float:
            return statistics.fmean(float(getattr(r, name)) for r in done)

        reached = [_epochs_to(r.curve, target) for r in done] if target else [None]
        caches = [r.cache_mib for r in done if r.cache_mib is not None]
        mine, theirs = timed.get(variant, {}), timed.get("CAGNET", {})
        ratios = [
            mine[i].epoch_s / theirs[i].epoch_s
            for i in sorted(mine.keys() & theirs.keys())
            if theirs[i].epoch_s
        ]
        rows[variant] = Row(
            train_bytes=mean("train_bytes"),
            fwd_bytes=mean("fwd_bytes"),
            train_cut=_cut(mean("train_bytes"), _mean(base, "train_bytes")),
            fwd_cut=_cut(mean("fwd_bytes"), _mean(base, "fwd_bytes")),
            last_acc=mean("last_acc"),
            test_acc=mean("test_acc"),
            best_epoch=mean("best_epoch"),
            to_target=(
                None
                if None in reached
                else statistics.fmean(e for e in reached if e is not None)
            ),
            cache_mib=max(caches) if caches else None,
            epoch_s=_median([r.epoch_s for r in mine.values()]),
            median_s=_median([r.median_s for r in mine.values()]),
            time_ratio=_median(ratios),
            round_ratios=ratios,
        )
    return rows, target


def _mean(runs: list[Result] | None, name: str) -> float | None:
    return statistics.fmean(getattr(r, name) for r in runs) if runs else None


def _median(values: list[float]) -> float | None:
    return statistics.median(values) if values else None


def _fmt(value: float | None, spec: str, width: int) -> str:
    return f"{value:{width}{spec}}" if value is not None else f"{'-':>{width}s}"


# ------------------------------------------------------------------ report
def _table(
    label: str, runs: dict[str, list[Result]], failures: dict[str, str]
) -> dict[str, Row]:
    """Print one line per variant of one graph and worker count; return them."""
    rows, target = _rows(runs)
    aim = f"{target:.4f} (CAGNET's test acc - 1 pt)" if target else "- (no CAGNET)"
    print(f"\n{label}; target of `to tgt`: test acc {aim}")
    print(
        f"{'variant':8s} {'trainMiB/ep':>11s} {'cut':>6s} {'fwdMiB/ep':>10s} "
        f"{'fwd cut':>7s} {'acc@last':>8s} {'acc@best':>8s} {'best ep':>7s} "
        f"{'to tgt':>6s} {'cacheMiB':>8s} {'ep s':>7s} {'x CAGNET':>8s} "
        f"{'med s':>7s}"
    )
    for variant in runs:
        row = rows.get(variant)
        if row is None:
            error = failures.get(variant, "no run").strip().splitlines()
            print(f"{variant:8s} FAILED: {error[-1] if error else '?'}")
            continue
        print(
            f"{variant:8s} {row.train_bytes / MIB:11.3f} "
            f"{_fmt(row.train_cut, '.1%', 6)} {row.fwd_bytes / MIB:10.3f} "
            f"{_fmt(row.fwd_cut, '.1%', 7)} {row.last_acc:8.4f} {row.test_acc:8.4f} "
            f"{row.best_epoch:7.1f} {_fmt(row.to_target, '.1f', 6)} "
            f"{_fmt(row.cache_mib, '.3f', 8)} {_fmt(row.epoch_s, '.3f', 7)} "
            f"{_fmt(row.time_ratio, '.3f', 7)}{'x' if row.time_ratio else ' '} "
            f"{_fmt(row.median_s, '.3f', 7)}"
        )
    for variant, row in rows.items():
        if len(row.round_ratios) > 1 and variant != "CAGNET":
            each = " ".join(f"{x:.2f}" for x in row.round_ratios)
            print(f"{'':8s} {variant} x CAGNET per round: {each}")
    return rows


LEGEND = (
    "trainMiB/ep: training bytes (fwd, bwd, flags, sync.grad; eval.* left out) "
    "summed over ranks, mean over epochs; fwdMiB/ep: the broadcasts (fwd.*) "
    "alone; cut: fewer than CAGNET's;\nacc@last: test acc at the last epoch; "
    "acc@best: at the best validation epoch (best ep, 0-based), taken as "
    "convergence; to tgt: epochs until the test acc first reached the "
    "target;\ncacheMiB: the largest rank's staleness cache; ep s: rank 0's "
    "fwd+bwd+grad sync, mean over epochs 1.. (skip and send epochs "
    "alternate), median over rounds;\nx CAGNET: the ratio to CAGNET's in the "
    "same round, median over rounds; med s: the summary's epoch_s_median. "
    "With several seeds, accuracies and epochs are means."
)


# ------------------------------------------------------------------ checks
def _verdict(ok: bool) -> str:
    return "MET" if ok else "NOT MET"


def _points(row: Row, base: Row) -> float:
    """Test accuracy over CAGNET's, in points (negative: lower)."""
    return 100 * (row.test_acc - base.test_acc)


def _close(row: Row, base: Row) -> bool:
    """At most ACC_SLACK below (rounded: Cora's 0.5 point is 5 of 1000 nodes)."""
    return round(_points(row, base), 6) >= -100 * ACC_SLACK


def _check_broadcast_cut(label: str, rows: dict[str, Row]) -> None:
    """An SCS variant cuts fwd.* >= 35% with test acc <= 0.5 point below CAGNET's."""
    head = f"check [{label}] SCS cuts broadcast bytes >= {CUT_TARGET:.0%} within "
    head += f"{100 * ACC_SLACK:.1f} pt of CAGNET:"
    base = rows.get("CAGNET")
    scs = {v: r for v, r in rows.items() if v.startswith("SCS-")}
    if not scs:
        return  # not selected (--only)
    if base is None:
        print(f"{head} n/a (needs CAGNET)")
        return
    cutting = {v: r for v, r in scs.items() if (r.fwd_cut or 0) >= CUT_TARGET}
    good = {v: r for v, r in cutting.items() if _close(r, base)}
    # The best that meets both; else the closest miss.
    if good:
        name = max(good, key=lambda v: (good[v].fwd_cut or 0, good[v].test_acc))
    elif cutting:
        name = max(cutting, key=lambda v: cutting[v].test_acc)
    else:
        name = max(scs, key=lambda v: scs[v].fwd_cut or 0)
    row = scs[name]
    print(
        f"{head} {name} fwd {-(row.fwd_cut or 0):+.1%}, test {row.test_acc:.4f} "
        f"vs {base.test_acc:.4f} ({_points(row, base):+.2f} pt; at the last epoch "
        f"{row.last_acc:.4f} vs {base.last_acc:.4f}); {len(good)} of {len(scs)} "
        f"SCS variants meet both  {_verdict(bool(good))}"
    )


def _check_skipg(label: str, rows: dict[str, Row]) -> None:
    """Each SkipG loses more accuracy than the best SCS variant whose training
    byte cut is at least SkipG's minus 10 points (else the nearest cut)."""
    base = rows.get("CAGNET")
    scs = {v: r for v, r in rows.items() if v.startswith("SCS-")}
    for skipg in (v for v in rows if v.startswith("SkipG")):
        head = f"check [{label}] {skipg} loses more accuracy than SCS at a similar cut:"
        row = rows[skipg]
        if base is None or not scs or row.train_cut is None:
            print(f"{head} n/a (needs CAGNET and an SCS variant)")
            continue
        cut = row.train_cut
        near = {v: r for v, r in scs.items() if (r.train_cut or 0) >= cut - SIMILAR_CUT}
        if near:
            what = f"best SCS cutting >= {cut - SIMILAR_CUT:.1%}"
        else:
            nearest = min(scs, key=lambda v: abs((scs[v].train_cut or 0) - cut))
            near = {nearest: scs[nearest]}
            what = f"no SCS cuts within {SIMILAR_CUT:.0%} of it; the nearest"
        name = max(near, key=lambda v: near[v].test_acc)
        best = near[name]
        lost, theirs = -_points(row, base), -_points(best, base)
        print(
            f"{head} {skipg} train bytes {-cut:+.1%}, loses {lost:.2f} pt "
            f"({row.test_acc:.4f}); {what}: {name} {-(best.train_cut or 0):+.1%}, "
            f"loses {theirs:.2f} pt ({best.test_acc:.4f})  {_verdict(lost > theirs)}"
        )


def _check_g3(
    label: str,
    rows: dict[str, Row],
    runs: dict[str, list[Result]],
    failures: dict[str, str],
) -> None:
    """g3+staleness: fewer training bytes than g3, test acc <= 0.5 point
    below, and fwd.* and bwd.* above g3's in no epoch."""
    for variant in (v for v in runs if v.startswith("g3+")):
        head = f"check [{label}] {variant} moves fewer bytes than g3 at its accuracy:"
        if variant in failures or "g3" in failures:
            which = variant if variant in failures else "g3"
            error = failures[which].strip().splitlines()
            print(f"{head} n/a ({which} failed: {error[-1] if error else '?'})")
            continue
        if variant not in rows or "g3" not in rows:
            print(f"{head} n/a (needs g3 and {variant})")
            continue
        row, base = rows[variant], rows["g3"]
        mine = [r for r in runs[variant] if r.round_index == 0]
        theirs = [r for r in runs["g3"] if r.round_index == 0]
        over = 0  # the most any epoch's fwd.* or bwd.* is above g3's, bytes
        for a, b in zip(mine, theirs, strict=False):  # seed by seed
            for x, y in ((a.fwd_epochs, b.fwd_epochs), (a.bwd_epochs, b.bwd_epochs)):
                over = max([over, *(m - n for m, n in zip(x, y, strict=True))])
        fewer = row.train_bytes < base.train_bytes
        close = _close(row, base)
        print(
            f"{head} train {row.train_bytes / MIB:.3f} vs "
            f"{base.train_bytes / MIB:.3f} MiB/ep "
            f"({row.train_bytes / base.train_bytes - 1:+.1%}), test "
            f"{row.test_acc:.4f} vs {base.test_acc:.4f} "
            f"({_points(row, base):+.2f} pt), "
            f"fwd/bwd above g3's in any epoch by at most {over:,} B  "
            f"{_verdict(fewer and close and over <= 0)}"
        )


# ------------------------------------------------------------------ runs
@dataclass(frozen=True, slots=True)
class Job:
    """One ``graphwire train`` run of a variant."""

    graph: str
    workers: int
    variant: str
    seed: int
    round_index: int
    epochs: int

    @property
    def slug(self) -> str:
        name = re.sub(r"[^a-z0-9]+", "-", self.variant.lower()).strip("-")
        return f"{self.graph}-{self.workers}w-{name}-s{self.seed}-r{self.round_index}"


def _jobs(args: argparse.Namespace) -> tuple[list[Job], list[Job]]:
    """The shaped runs (at TIMED_WORKERS: accuracy runs, then the timing
    rounds, alternating the order) and the unshaped ones (the other counts)."""
    epochs = {"synthetic": args.epochs, "cora": args.cora_epochs}
    shaped: list[Job] = []
    plain: list[Job] = []
    for workers in args.workers:
        into = shaped if workers == TIMED_WORKERS else plain
        for graph in args.graphs:
            for seed in args.seeds:
                into += [
                    Job(graph, workers, v, seed, 0, epochs[graph]) for v in args.only
                ]
    if TIMED_WORKERS in args.workers and "synthetic" in args.graphs:
        for index in range(1, args.rounds):
            order = args.only[::-1] if index % 2 else args.only
            shaped += [
                Job("synthetic", TIMED_WORKERS, v, args.seeds[0], index, TIMED_EPOCHS)
                for v in order
            ]
    return shaped, plain


def _argv(args: argparse.Namespace, work: Path, job: Job) -> list[str]:
    argv = ["--model", "gcn", "--epochs", str(job.epochs), "--seed", str(job.seed)]
    argv += ["--quiet", "--threads", "1", "--timeout", str(args.collective_timeout)]
    argv += ["--dataset", str(work / f"{job.graph}-{job.workers}")]
    if args.dropout is not None:
        argv += ["--dropout", f"{args.dropout:g}"]
    return [*argv, "--workers", str(job.workers), *VARIANTS[job.variant]]


def _prepare(args: argparse.Namespace, work: Path) -> None:
    """The graphs' METIS parts, once per worker count."""
    if "synthetic" in args.graphs:
        jobs = [("metis", w, f"synthetic-{w}") for w in args.workers]
        prepare_graph(args, work, jobs)
    if "cora" in args.graphs:
        for workers in args.workers:
            start = time.perf_counter()
            cli(
                ["partition", "--dataset", f"planetoid:{args.cora}", "--quiet"]
                + ["--method", "metis", "--parts", str(workers)]
                + ["--out", str(work / f"cora-{workers}")],
                600,
            )
            print(
                f"partitioned Cora with metis into {workers} parts in "
                f"{time.perf_counter() - start:.1f}s",
                flush=True,
            )


Runs = dict[tuple[str, int], dict[str, list[Result]]]
Failures = dict[tuple[str, int], dict[str, str]]


def _run_all(
    args: argparse.Namespace,
    work: Path,
    net: ShapedNetwork,
    jobs: list[Job],
    runs: Runs,
    failures: Failures,
) -> None:
    """Run ``jobs`` in ``net``; a variant that fails once is not run again
    for that graph and worker count."""
    for job in jobs:
        key = (job.graph, job.workers)
        failed = failures.setdefault(key, {})
        done = runs.setdefault(key, {}).setdefault(job.variant, [])
        if job.variant in failed:
            continue
        argv, out = _argv(args, work, job), work / f"run-{job.slug}"
        try:
            ((summary, wall),) = train_runs(net, [argv], [out], args.run_timeout)
            result = _result(summary, wall, out)
        except (RunFailed, OSError, KeyError, ValueError, IndexError) as error:
            failed[job.variant] = str(error)
            print(f"  {job.slug}: FAILED\n{error}", flush=True)
            continue
        result.seed, result.round_index = job.seed, job.round_index
        result.timed = job.workers == TIMED_WORKERS and job.seed == args.seeds[0]
        done.append(result)
        print(
            f"  {job.slug:34s} test {result.test_acc:.4f} (ep {result.best_epoch}) "
            f"last {result.last_acc:.4f} train {result.train_bytes / MIB:8.3f} "
            f"MiB/ep epoch {result.epoch_s:.3f}s wall {wall:.0f}s",
            flush=True,
        )


def _bench(args: argparse.Namespace, work: Path, started: float) -> int:
    _prepare(args, work)
    shaped, plain = _jobs(args)
    runs: Runs = {}
    failures: Failures = {}
    if shaped:
        with ShapedNetwork(rate_mbit=args.rate_mbit) as net:
            shaper_check(net, args.rate_mbit)
            _run_all(args, work, net, shaped, runs, failures)
    if plain:
        with ShapedNetwork(rate_mbit=None) as net:
            _run_all(args, work, net, plain, runs, failures)

    names = {"synthetic": f"synthetic {args.nodes:,} nodes F={args.features}"}
    names["cora"] = "Cora 2,708 nodes"
    epochs = {"synthetic": args.epochs, "cora": args.cora_epochs}
    dropout = 0.5 if args.dropout is None else args.dropout
    print(
        f"\nGCN (2 layers, hidden 16, dropout {dropout:g}), METIS parts, 1 thread "
        f"per worker on {os.cpu_count()} CPUs, seeds {args.seeds}; load average now "
        f"{os.getloadavg()[0]:.1f}"
    )
    tables = {}
    order = {key: index for index, key in enumerate(GRAPHS)}
    for (graph, workers), variants in sorted(
        runs.items(), key=lambda kv: (order[kv[0][0]], kv[0][1])
    ):
        link = (
            f"{args.rate_mbit:g} Mbit/s shared loopback (tbf)"
            if workers == TIMED_WORKERS
            else "unshaped"
        )
        label = f"{names[graph]}, {workers} workers, {link}, {epochs[graph]} epochs"
        tables[(graph, workers)] = _table(label, variants, failures[(graph, workers)])
    print(LEGEND + "\n")
    for (graph, workers), rows in tables.items():
        label = f"{graph}, {workers} workers"
        _check_broadcast_cut(label, rows)
        _check_skipg(label, rows)
        _check_g3(label, rows, runs[(graph, workers)], failures[(graph, workers)])
    failed = {(k, v): e for k, errors in failures.items() for v, e in errors.items()}
    if failed:
        print("\nfailed variants (command and error):")
        for ((graph, workers), variant), error in failed.items():
            print(f"--- {variant} ({graph}, {workers} workers)\n{error}")
    if args.json:
        figures = {
            "args": {
                k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()
            },
            "results": {
                f"{g} {w} {v}": [asdict(r) for r in rs]
                for (g, w), variants in runs.items()
                for v, rs in variants.items()
            },
            "failures": {f"{g} {w} {v}": e for ((g, w), v), e in failed.items()},
        }
        write_figures(args.json, figures)
    print(f"\nbench_staleness took {time.perf_counter() - started:.0f}s")
    return 1 if failed else 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    add_graph_flags(parser)
    parser.add_argument(
        "--epochs",
        type=int,
        help="epochs per run, synthetic graph (default 25, --quick 5)",
    )
    parser.add_argument(
        "--cora-epochs",
        type=int,
        help="epochs per run on Cora (default 100, --quick 5)",
    )
    parser.add_argument(
        "--workers",
        default="2,4",
        help="worker counts, each >= 2 (default 2,4; "
        f"{TIMED_WORKERS} runs shaped and timed)",
    )
    parser.add_argument(
        "--graphs", help="synthetic, cora or both (default both, --quick synthetic)"
    )
    parser.add_argument(
        "--cora", default=str(CORA), help=f"Cora's planetoid spec path (default {CORA})"
    )
    parser.add_argument(
        "--seeds", default="0", help="seeds, each variant runs with each (default 0)"
    )
    parser.add_argument(
        "--dropout",
        type=float,
        help="dropout of every run (default GCN's 0.5); each epoch's new masks "
        "move the broadcast rows, which gap:X measures",
    )
    parser.add_argument(
        "--rounds",
        type=int,
        help="timing rounds at 2 workers on the synthetic graph, the accuracy "
        "runs' included (default 2, --quick 1)",
    )
    parser.add_argument(
        "--rate-mbit",
        type=float,
        default=1000.0,
        help="rate of the loopback the 2-worker runs share, Mbit/s (default 1000)",
    )
    parser.add_argument(
        "--only",
        nargs="+",
        metavar="NAME",
        help=f"only these variants, of {', '.join(VARIANTS)} (default all but "
        "SkipG-2 and g3+A1; --quick " + ", ".join(QUICK_VARIANTS) + ")",
    )
    parser.add_argument("--json", metavar="PATH", help="also write the figures")
    add_run_flags(parser)
    args = parser.parse_args(argv)
    for name, value in (QUICK if args.quick else FULL).items():
        if getattr(args, name) is None:
            setattr(args, name, value)
    check_flags(parser, args, MINIMUMS, ("rate_mbit", *TIMEOUTS))
    args.workers = worker_counts(parser, args.workers)
    args.seeds = comma_list(parser, "--seeds", args.seeds, int)
    if any(s < 0 for s in args.seeds):
        parser.error(f"--seeds: expected integers >= 0, got {args.seeds}")
    if args.dropout is not None and not 0 <= args.dropout < 1:
        parser.error(f"--dropout: expected a number in [0, 1), got {args.dropout}")
    graphs = args.graphs or ("synthetic" if args.quick else ",".join(GRAPHS))
    args.graphs = comma_list(parser, "--graphs", graphs, str)
    if not set(args.graphs) <= set(GRAPHS) or len(set(args.graphs)) < len(args.graphs):
        parser.error(f"--graphs: expected synthetic, cora or both, got {graphs}")
    unknown = sorted(set(args.only or ()) - VARIANTS.keys())
    if unknown:
        parser.error(
            f"--only: no variant named {unknown}; the names are {list(VARIANTS)}"
        )
    args.only = args.only or list(QUICK_VARIANTS if args.quick else DEFAULT)
    cora = Path(args.cora)
    if "cora" in args.graphs and not (cora.parent / f"ind.{cora.name}.x").exists():
        parser.error(f"--cora {cora}: no {cora.parent / f'ind.{cora.name}.x'}")
    available, why = netns_available()
    if not available:
        print(
            f"bench_staleness: needs network namespaces (run as root): {why}",
            file=sys.stderr,
        )
        return 1
    return in_work_folder("gw-bench-staleness-", args, _bench)


if __name__ == "__main__":
    raise SystemExit(run_script(main))
