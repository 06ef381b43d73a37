"""Distributed full-graph training over a shaped link: G3 vs halo vs replicate.

python benchmarks/bench_fullgraph.py [--nodes 200000] [--epochs 6] [--rate-mbit 1000]
                                     [--workers 4] [--threads 1] [--rounds 2] [--quick]
                                     [--node-order rcm|id]
                                     [--targets | --only NAME [NAME ...]]

In one run, on the synthetic products-like graph (F=100, GCN, hidden 128):

0. generates the graph once and partitions it once per method (metis, random,
   chunk, locality; plus metis into 2 parts for the scaling check), so
   partitioning is in no epoch time; the parts and the one-process runs lay
   their rows out in ``--node-order`` (default ``rcm``, graphwire's: ``id``
   runs every configuration as before that order existed);
1. checks the shaper with a single TCP stream at ``--rate-mbit``;
2. inside one network namespace whose loopback is shaped to ``--rate-mbit``
   (one ``tbf`` shared by all workers, ARCHITECTURE §4) trains single-process
   and, with ``--workers``, every engine (halo, replicate if the CLI offers
   it, g3, g3 with its last layer in bins, and G3's ablation modes) on
   METIS parts, then g3 on every partitioner. The list runs ``--rounds``
   times, forwards then backwards, and each configuration's figure is the
   median over rounds;
3. unshaped (a namespace without a qdisc): halo and g3 on the same METIS
   parts with ``--workers``, which shows what the link costs each (g3 shaped
   over g3 unshaped is 1.0 when it hides the link entirely, and g3 unshaped
   over halo shaped is the least g3 / halo the machine allows: g3 with no
   link at all); 1 worker vs 2 workers (g3 and halo), one thread each,
   alternating; and two copies of the 1-worker run
   started at once, whose throughput over one copy alone is what two processes
   get from this machine on this job (the ceiling the 2-worker target is read
   against: on a small VM, shared memory bandwidth and cache bound it below 2;
   on ``--quick``'s small graph one run alone has been measured slower than
   each of two at once, a ceiling above 2 that says nothing about the target).

``--targets`` runs only the configurations the issue's targets compare (halo,
g3 on METIS and on locality parts, and the unshaped scaling runs), so that
more ``--rounds`` fit in the same time; ``--only`` names the configurations
to run (the names the table prints).

Per run it records the summary's ``epoch_s_median`` (rank 0's forward +
backward + grad sync, every epoch including the first), the median without
the first epoch, the ledger's bytes (every rank, the whole run: set-up,
training and evaluation), the training bytes per epoch, the qdisc's byte
counter over the same run, test accuracy, and the time split (compute, comm,
grad sync, eval per epoch, mean over ranks), and the CPU seconds per epoch
of every rank's process (all threads; forward, backward, sync and step) with
the floor they set: no epoch is shorter than that CPU time spread over the
CPUs the ranks can use (this machine's, at most one per rank and thread).
Prints the table and the ratios
beside the issue's targets: the ratio of the medians, and each round's ratio
of the two runs made next to each other in that round, which the machine's
drifting load affects less. A configuration that fails or hangs is reported
with its command and error; the others still run.
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from graphwire.comm.context import usable_cores
from graphwire.commands.bench import run_script
from graphwire.run.summary import TRAINING_TAGS
from graphwire.testing.netns import ShapedNetwork, netns_available

sys.path.insert(0, str(Path(__file__).resolve().parent))
from shaped_bench import (  # noqa: E402
    TIMEOUTS,
    RunFailed,
    add_graph_flags,
    add_run_flags,
    check_flags,
    cli,
    epoch_records,
    in_work_folder,
    prepare_graph,
    qdisc_drops,
    shaper_check,
    take_sizes,
    train_runs,
    write_figures,
)

METHODS = ("metis", "random", "chunk", "locality")
SCALING_EXCHANGES = ("g3", "halo")  # 2 workers vs 1, unshaped
# What the targets compare (--targets).
UNSHAPED = tuple(f"{exchange} unshaped (metis)" for exchange in ("halo", "g3"))
TARGETS = (
    "halo (metis)",
    "g3 (metis)",
    "g3 (locality)",
    *UNSHAPED,
    "unshaped 1 worker",
    *(f"unshaped 2 workers {exchange}" for exchange in SCALING_EXCHANGES),
    "unshaped 1 worker x2",
)
# Two copies of the 1-worker run at once: the machine's two-process ceiling.
AT_ONCE = "unshaped 1 worker x2"


# G3's claims beside the ratios that compare the same things (digests/g3.md);
# the paper gives speedups, so below 1 here is a speedup there.
PAPER = {
    "g3 / halo": "paper, Fig. 11: G3 1.08-2.24x faster than the full-graph "
    "BNS-GCN and NeutronStar, i.e. 0.45-0.93",
    "locality / metis": "paper, Fig. 16: G3's partition up to 4.3x faster than "
    "the others under G3 (random and chunk among them; the gain over METIS "
    "alone is not given)",
}


@dataclass(frozen=True, slots=True)
class Config:
    """One training configuration: a name and the ``graphwire train`` flags."""

    name: str
    argv: tuple[str, ...]
    copies: int = 1  # runs started at once, each a Result


@dataclass(slots=True)
class Result:
    """What one run of a configuration measured (seconds are per epoch)."""

    epoch_s: float  # median of all epochs (rank 0)
    steady_s: float  # median of epochs 1.. (rank 0): the summary's epoch_s_median
    first_s: float  # epoch 0 (rank 0)
    compute_s: float  # mean over ranks and epochs
    comm_s: float
    sync_s: float
    eval_s: float
    bytes_sent: int  # ledger, all ranks, whole run
    train_bytes_epoch: float  # ledger, all ranks, training tags only
    qdisc_bytes: int  # root qdisc of lo over the run
    test_acc: float
    wall_s: float
    cpu_s: float = 0.0  # every rank's process CPU time, median epoch (extra.cpu_s)
    floor_s: float = 0.0  # cpu_s over the CPUs the ranks can use (usable_cores)
    round_index: int = 0


def _epoch_seconds(times: dict[str, float], distributed: bool) -> float:
    # The same definitions as the summary's epoch_s_median in each command.
    if distributed:
        return times["forward_s"] + times["backward_s"] + times["sync_s"]
    return sum(v for k, v in times.items() if k != "eval_s")


def _measure(
    net: ShapedNetwork, config: Config, out: Path, timeout_s: float
) -> list[Result]:
    """Run ``config`` (``copies`` runs at once, each in a folder of its own
    under ``out`` when there are several): one Result per run."""
    outs = (
        [out]
        if config.copies == 1
        else [out / f"copy-{i}" for i in range(config.copies)]
    )
    before = net.qdisc_bytes()
    runs = train_runs(net, [list(config.argv)] * config.copies, outs, timeout_s)
    qdisc = (net.qdisc_bytes() - before) // config.copies  # shared by the copies
    threads = int(_flag(config.argv, "--threads", "1"))
    return [
        _result(summary, wall, run_out, qdisc, threads)
        for (summary, wall), run_out in zip(runs, outs, strict=True)
    ]


def _flag(argv: tuple[str, ...], name: str, default: str) -> str:
    """The value of flag ``name`` in ``argv`` (the last one given)."""
    values = [argv[i + 1] for i, a in enumerate(argv[:-1]) if a == name]
    return values[-1] if values else default


def _result(
    summary: dict[str, str], wall: float, out: Path, qdisc: int, threads: int = 1
) -> Result:
    """The figures of one ended run from its summary line and ``metrics.jsonl``
    (``threads``: torch threads per rank, for the CPU floor)."""
    ranks = epoch_records(out)
    distributed = "bytes_sent" in summary
    lead = [_epoch_seconds(r["times"], distributed) for r in ranks[0]]
    epochs = len(lead)
    split = {"compute": 0.0, "comm": 0.0, "sync": 0.0, "eval": 0.0}
    train_bytes = 0
    cpu = [0.0] * epochs  # per epoch, every rank's
    for records in ranks.values():
        for index, record in enumerate(records):
            if index < epochs:
                cpu[index] += record.get("extra", {}).get("cpu_s", 0.0)
            times = record["times"]
            comm = times.get("comm_s", 0.0)
            split["compute"] += _epoch_seconds(times, distributed) - comm
            split["compute"] -= times.get("sync_s", 0.0)
            split["comm"] += comm
            split["sync"] += times.get("sync_s", 0.0)
            split["eval"] += times.get("eval_s", 0.0)
            by_tag = record.get("comm", {}).get("by_tag", {})
            train_bytes += sum(
                v for k, v in by_tag.items() if k.startswith(TRAINING_TAGS)
            )
    per = max(1, epochs * len(ranks))
    cpu_s = statistics.median(cpu or [0.0])
    return Result(
        epoch_s=statistics.median(lead),
        steady_s=float(summary["epoch_s_median"]),
        first_s=lead[0],
        compute_s=split["compute"] / per,
        comm_s=split["comm"] / per,
        sync_s=split["sync"] / per,
        eval_s=split["eval"] / per,
        bytes_sent=int(summary.get("bytes_sent", 0)),
        train_bytes_epoch=train_bytes / max(1, epochs),
        qdisc_bytes=qdisc,
        test_acc=float(summary["test_acc"]),
        wall_s=wall,
        cpu_s=cpu_s,
        floor_s=cpu_s / min(usable_cores(), len(ranks) * threads),
    )


# ------------------------------------------------------------------ setup
def _exchanges() -> list[str]:
    """The ``--exchange`` choices ``graphwire train --help`` lists."""
    text = cli(["train", "--help"], 120)
    match = re.search(r"--exchange \{([^}]*)\}", text)
    return match.group(1).split(",") if match else []


def _prepare(args: argparse.Namespace, work: Path) -> None:
    jobs = [(m, args.workers, f"parts-{m}") for m in METHODS]
    if args.workers != 2:
        jobs.append(("metis", 2, "parts-metis-2"))
    prepare_graph(args, work, jobs)


def _configs(
    args: argparse.Namespace, work: Path, exchanges: list[str]
) -> list[Config]:
    common: tuple[str, ...] = ("--model", args.model, "--hidden", str(args.hidden))
    common += ("--epochs", str(args.epochs), "--seed", "0", "--quiet")
    common += ("--patience", str(10 * args.epochs), "--threads", str(args.threads))
    single = ("--dataset", str(work / "graph"), "--node-order", args.node_order)
    configs = [Config("single process", (*common, *single))]
    common += ("--timeout", str(args.collective_timeout))  # distributed only
    metis = ("--dataset", str(work / "parts-metis"), "--workers", str(args.workers))
    configs.append(Config("halo (metis)", (*common, *metis, "--exchange", "halo")))
    if "replicate" in exchanges:
        configs.append(
            Config("replicate (metis)", (*common, *metis, "--exchange", "replicate"))
        )
    configs.append(Config("g3 (metis)", (*common, *metis, "--exchange", "g3")))
    configs.append(
        Config(
            "g3 priority (metis)",
            (*common, *metis, "--exchange", "g3", "--g3-order", "priority"),
        )
    )
    configs.append(
        Config(
            "g3 last bins (metis)",
            (*common, *metis, "--exchange", "g3", "--g3-last", "bins"),
        )
    )
    for mode in ("sequential", "inter", "intra"):
        configs.append(
            Config(
                f"g3 {mode} (metis)",
                (*common, *metis, "--exchange", "g3", "--g3-mode", mode),
            )
        )
    for method in METHODS[1:]:
        parts = ("--dataset", str(work / f"parts-{method}"))
        configs.append(
            Config(
                f"g3 ({method})",
                (*common, *parts, "--workers", str(args.workers), "--exchange", "g3"),
            )
        )
    return configs


# ------------------------------------------------------------------ report
def _median(results: list[Result], field: str) -> float:
    return statistics.median(float(getattr(r, field)) for r in results)


def _print_table(
    results: dict[str, list[Result]], failures: dict[str, str], epochs: int
) -> None:
    mib = 2**20
    print(
        f"\n{'configuration':22s} {'epoch s':>8s} {'w/o ep0':>8s} {'ep0 s':>7s} "
        f"{'compute':>8s} {'comm':>7s} {'sync':>6s} {'eval':>6s} "
        f"{'MiB/ep':>8s} {'trainMiB/ep':>11s} {'qdiscMiB':>9s} {'ledg/qd':>7s} "
        f"{'CPU s':>6s} {'floor':>6s} {'acc':>6s} {'wall s':>7s} {'n':>2s}"
    )
    for name, runs in results.items():
        if not runs:
            print(f"{name:22s} FAILED: {failures.get(name, '?').splitlines()[0]}")
            continue
        ledger = _median(runs, "bytes_sent")
        qdisc = _median(runs, "qdisc_bytes")
        # Each run's own ledger over its own qdisc bytes: a ratio of medians
        # would divide figures from different rounds.
        shares = [r.bytes_sent / r.qdisc_bytes for r in runs if r.qdisc_bytes]
        ratio = f"{statistics.median(shares):.3f}" if ledger and shares else "-"
        print(
            f"{name:22s} {_median(runs, 'epoch_s'):8.3f} "
            f"{_median(runs, 'steady_s'):8.3f} {_median(runs, 'first_s'):7.2f} "
            f"{_median(runs, 'compute_s'):8.3f} {_median(runs, 'comm_s'):7.3f} "
            f"{_median(runs, 'sync_s'):6.3f} {_median(runs, 'eval_s'):6.3f} "
            f"{ledger / mib / epochs:8.1f} "
            f"{_median(runs, 'train_bytes_epoch') / mib:11.1f} "
            f"{qdisc / mib:9.1f} {ratio:>7s} {_median(runs, 'cpu_s'):6.2f} "
            f"{_median(runs, 'floor_s'):6.3f} {runs[-1].test_acc:6.4f} "
            f"{_median(runs, 'wall_s'):7.1f} {len(runs):2d}"
        )
    print(
        "epoch s: rank 0's fwd+bwd+grad sync, median over all epochs and "
        "rounds; w/o ep0: the same without epoch 0 (the summary's "
        "epoch_s_median);\ncompute/comm/"
        "sync/eval: seconds per epoch, mean over ranks (compute = fwd+bwd-comm); "
        "MiB/ep: ledger bytes of the whole run (set-up, training, eval; all "
        "ranks) / epochs;\ntrainMiB/ep: training tags only (fwd, bwd, "
        "sync.grad); qdiscMiB: lo's root qdisc over the whole run (headers, "
        "ACKs, rendezvous included); "
        "ledg/qd: ledger / qdisc bytes of each run, median over rounds;\n"
        "CPU s: CPU seconds of every rank's process (all threads; fwd, bwd, "
        "sync, step) in an epoch, median over epochs; floor: CPU s over the "
        f"CPUs the ranks can use (this machine's {usable_cores()}, at most one per "
        "rank and thread), about the shortest epoch that CPU time allows."
    )


def _ratio_line(
    label: str,
    results: dict[str, list[Result]],
    a: str,
    b: str,
    target: str,
    ok: Any,
) -> None:
    if a not in results or b not in results:
        return  # not selected (--only, --targets)
    if not results[a] or not results[b]:
        print(f"{label:34s} n/a ({a} or {b} has no result){target}")
        return
    value = _median(results[a], "epoch_s") / _median(results[b], "epoch_s")
    steady = _median(results[a], "steady_s") / _median(results[b], "steady_s")
    verdict = "" if ok is None else ("  MET" if ok(value) else "  NOT MET")
    print(f"{label:34s} {value:5.2f}x (w/o epoch 0: {steady:.2f}x){target}{verdict}")
    _per_round(results[a], results[b])


def _floor_line(results: dict[str, list[Result]], a: str, b: str) -> None:
    """How far the CPU time ``a``'s ranks spend bounds ``a`` / ``b``: ``a``'s
    CPU floor over ``b``'s epoch time, the least ratio ``a`` could reach here
    were it to hide every transfer and wait behind its own CPU work."""
    if not results.get(a) or not results.get(b) or not _median(results[a], "cpu_s"):
        return
    floor = _median(results[a], "floor_s")
    print(
        f"{'':34s} {a}'s CPU floor over {b}'s epoch: "
        f"{floor / _median(results[b], 'epoch_s'):.2f}x (CPU s per epoch: "
        f"{_median(results[a], 'cpu_s'):.2f} vs {_median(results[b], 'cpu_s'):.2f}, "
        f"on {usable_cores()} CPUs)"
    )


def _per_round(a: list[Result], b: list[Result]) -> None:
    """Print each round's ratio of ``a``'s epoch time to ``b``'s, from the two
    runs made in that round, and their median, when there is more than one
    round."""
    by_round = {r.round_index: r.epoch_s for r in b}
    pairs = [
        (r.epoch_s, by_round[r.round_index]) for r in a if r.round_index in by_round
    ]
    _print_rounds([x / y for x, y in pairs])


def _print_rounds(ratios: list[float]) -> None:
    """Each round's ratio and their median, when there is more than one."""
    if len(ratios) > 1:
        each = " ".join(f"{v:.2f}" for v in ratios)
        print(
            f"{'':34s} per round: {each} (median {statistics.median(ratios):.2f}, "
            f"{min(ratios):.2f}-{max(ratios):.2f})"
        )


def _print_ratios(results: dict[str, list[Result]]) -> None:
    """The ratio lines of the configurations ``results`` holds, each beside
    its target and the paper's claim where there is one."""
    print(
        "\nA / B: A's median epoch time over B's (below 1: A is faster); "
        "2 workers / 1 worker: throughput (above 1: 2 workers are faster)"
    )
    _ratio_line(
        "g3 / halo epoch time",
        results,
        "g3 (metis)",
        "halo (metis)",
        f"  target <= 0.75 ({PAPER['g3 / halo']})",
        lambda v: v <= 0.75,
    )
    _floor_line(results, "g3 (metis)", "halo (metis)")
    _ratio_line(
        "g3 shaped / g3 unshaped",
        results,
        "g3 (metis)",
        "g3 unshaped (metis)",
        "  1.00: g3 hides the link entirely",
        None,
    )
    _ratio_line(
        "g3 unshaped / halo shaped",
        results,
        "g3 unshaped (metis)",
        "halo (metis)",
        "  the least g3 / halo this machine allows (g3 with no link at all)",
        None,
    )
    _ratio_line(
        "halo shaped / halo unshaped",
        results,
        "halo (metis)",
        "halo unshaped (metis)",
        "  what the link adds to halo's epoch",
        None,
    )
    for other in ("replicate (metis)", "single process"):
        if other in results:
            _ratio_line(f"g3 / {other}", results, "g3 (metis)", other, "", None)
    _ratio_line(
        "g3 bfs / priority order",
        results,
        "g3 (metis)",
        "g3 priority (metis)",
        "",
        None,
    )
    _ratio_line(
        "g3 last sums / last bins",
        results,
        "g3 (metis)",
        "g3 last bins (metis)",
        "",
        None,
    )
    for mode in ("sequential", "inter", "intra"):
        _ratio_line(
            f"g3 full / g3 {mode}",
            results,
            "g3 (metis)",
            f"g3 {mode} (metis)",
            "",
            None,
        )
    _ratio_line(
        "locality / metis under g3",
        results,
        "g3 (locality)",
        "g3 (metis)",
        f"  target <= 0.9 ({PAPER['locality / metis']})",
        lambda v: v <= 0.9,
    )
    one = results.get("unshaped 1 worker")
    ceiling = _ceiling(one, results.get(AT_ONCE))
    for exchange in SCALING_EXCHANGES:
        two = results.get(f"unshaped 2 workers {exchange}")
        label = f"unshaped 2 workers {exchange} / 1 worker"
        if one is None or two is None:
            continue  # not selected (--only, --targets)
        if not (one and two):
            print(f"{label:34s} n/a (a run failed)")
            continue
        speedup = _median(one, "epoch_s") / _median(two, "epoch_s")
        steady = _median(one, "steady_s") / _median(two, "steady_s")
        verdict = "MET" if speedup >= 1.6 else "NOT MET"
        if ceiling is not None and ceiling[0] < 1.6:
            verdict += (
                f" (the machine's own ceiling is below 1.6 too: {ceiling[0]:.2f}x)"
            )
        print(
            f"{label:34s} {speedup:5.2f}x throughput (w/o "
            f"epoch 0: {steady:.2f}x)  target >= 1.6, 1 thread each  {verdict}"
        )
        _per_round(one, two)  # 1 worker's epoch time / 2 workers': the speedup
    if ceiling is not None:
        value, steady, rounds = ceiling
        print(
            f"{'ceiling: 2 x 1 worker at once':34s} {value:5.2f}x throughput (w/o "
            f"epoch 0: {steady:.2f}x)  two copies of the 1-worker run at once over "
            f"one alone: what 2 processes get from this machine on this job; "
            f"2 workers split the same work and add the exchange"
        )
        _print_rounds(rounds)


def _ceiling(
    one: list[Result] | None, at_once: list[Result] | None
) -> tuple[float, float, list[float]] | None:
    """The throughput of ``copies`` 1-worker runs started at once over one run
    alone: ``copies x`` (one alone's epoch time / each copy's), from the
    medians (all epochs, and without epoch 0) and round by round (the copies'
    mean in that round). None without both."""
    if not one or not at_once:
        return None
    copies = len(at_once) / len({r.round_index for r in at_once})
    value = copies * _median(one, "epoch_s") / _median(at_once, "epoch_s")
    steady = copies * _median(one, "steady_s") / _median(at_once, "steady_s")
    alone = {r.round_index: r.epoch_s for r in one}
    rounds = []
    for index in sorted({r.round_index for r in at_once} & alone.keys()):
        each = [r.epoch_s for r in at_once if r.round_index == index]
        rounds.append(len(each) * alone[index] / statistics.fmean(each))
    return value, steady, rounds


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    add_graph_flags(parser)
    parser.add_argument(
        "--hidden", type=int, default=128, help="hidden width (default 128)"
    )
    parser.add_argument(
        "--model",
        default="gcn",
        choices=["gcn", "sage", "gat"],
        help="model of every run (default gcn)",
    )
    parser.add_argument(
        "--workers",
        type=int,
        default=4,
        help="worker processes (and parts) of the shaped runs, at least 2 "
        "(default 4); the unshaped scaling check always uses 2",
    )
    parser.add_argument(
        "--epochs", type=int, help="epochs per run (default 6, --quick 3)"
    )
    parser.add_argument(
        "--rounds",
        type=int,
        help="times every configuration runs, alternating the order; figures "
        "are medians over rounds (default 2, --quick 1)",
    )
    parser.add_argument(
        "--rate-mbit",
        type=float,
        default=1000.0,
        help="rate of the shaped loopback every worker shares, Mbit/s (default 1000)",
    )
    parser.add_argument(
        "--threads", type=int, default=1, help="torch threads per process (default 1)"
    )
    parser.add_argument(
        "--node-order",
        choices=["rcm", "id"],
        default="rcm",
        help="how the parts and the one-process runs lay their rows out "
        "(graphwire's --node-order; default rcm)",
    )
    add_run_flags(parser)
    parser.add_argument(
        "--json", metavar="PATH", help="also write every run's figures to PATH"
    )
    which = parser.add_mutually_exclusive_group()
    which.add_argument(
        "--targets",
        action="store_true",
        help="only what the targets compare: halo and g3 on METIS parts, g3 on "
        "locality parts, unshaped 1 worker, 2 workers and 1 worker twice at once",
    )
    which.add_argument(
        "--only",
        nargs="+",
        metavar="NAME",
        help="only these configurations (the names the table prints)",
    )
    args = parser.parse_args(argv)
    take_sizes(args, FULL, QUICK)
    check_flags(parser, args, MINIMUMS, ("rate_mbit", *TIMEOUTS))
    wanted = _wanted(args)
    if wanted is not None:
        known = {c.name for c in _configs(args, Path(), ["replicate"])}
        unknown = sorted(wanted - known.union(TARGETS))
        if unknown:
            parser.error(
                f"--only: no configuration named {unknown}; the names are "
                f"{sorted(known.union(TARGETS))}"
            )
    available, why = netns_available()
    if not available:
        print(
            f"bench_fullgraph: needs network namespaces (run as root): {why}",
            file=sys.stderr,
        )
        return 1

    return in_work_folder("gw-bench-fullgraph-", args, _bench)


# Run sizes: the defaults, and --quick's (flags given on the command line win).
FULL = {"nodes": 200_000, "epochs": 6, "rounds": 2}
QUICK = {"nodes": 20_000, "epochs": 3, "rounds": 1}
# Flag -> its least value, checked before any work: a bad value is a usage
# error, not a traceback (or a failed run) after the graph is generated.
MINIMUMS = {
    "nodes": 100,
    "features": 1,
    "hidden": 1,
    "workers": 2,  # one worker is the single process: no exchange to compare
    "epochs": 2,  # the figures without epoch 0 need another
    "rounds": 1,
    "threads": 1,
}


def _wanted(args: argparse.Namespace) -> set[str] | None:
    """The configuration names ``--targets`` or ``--only`` select; None: all."""
    if args.targets:
        return set(TARGETS)
    return set(args.only) if args.only else None


def _bench(args: argparse.Namespace, work: Path, started: float) -> int:
    _prepare(args, work)
    exchanges = _exchanges()
    if "replicate" not in exchanges:
        print(f"note: `train --exchange` offers {exchanges}; replicate skipped")
    every = _configs(args, work, exchanges)
    wanted = _wanted(args)
    configs = [c for c in every if wanted is None or c.name in wanted]
    results: dict[str, list[Result]] = {c.name: [] for c in configs}
    failures: dict[str, str] = {}

    def attempt(
        net: ShapedNetwork, config: Config, round_index: int, tag: str
    ) -> list[Result]:
        if config.name in failures:
            return []  # one failure per configuration is enough
        slug = re.sub(r"[^a-z0-9]+", "-", config.name.lower()).strip("-")
        out = work / f"run-{tag}-{slug}"
        try:
            measured = _measure(net, config, out, args.run_timeout)
        except (RunFailed, OSError, KeyError, ValueError, IndexError) as error:
            failures[config.name] = str(error)
            print(f"  {config.name}: FAILED\n{error}", flush=True)
            return []
        for result in measured:
            result.round_index = round_index
        results[config.name].extend(measured)
        return measured

    if configs:
        with ShapedNetwork(rate_mbit=args.rate_mbit) as net:
            shaper_check(net, args.rate_mbit)
            for round_index in range(args.rounds):
                order = configs if round_index % 2 == 0 else configs[::-1]
                for config in order:
                    for result in attempt(net, config, round_index, str(round_index)):
                        print(
                            f"  round {round_index}: {config.name:22s} epoch "
                            f"{result.epoch_s:.3f}s (w/o ep0 {result.steady_s:.3f}s"
                            f", ep0 {result.first_s:.2f}s) wall {result.wall_s:.0f}s",
                            flush=True,
                        )
            print(f"shaped link over the whole session: {qdisc_drops(net)}")

    # Unshaped: 1 worker vs 2 workers, one thread each, alternating.
    common = ["--model", args.model, "--hidden", str(args.hidden)]
    common += ["--epochs", str(args.epochs), "--seed", "0", "--quiet"]
    common += ["--patience", str(10 * args.epochs), "--threads", "1"]
    two_parts = "parts-metis" if args.workers == 2 else "parts-metis-2"
    two_argv = (*common, "--dataset", str(work / two_parts), "--workers", "2")
    one_argv = ("--dataset", str(work / "graph"), "--node-order", args.node_order)
    shaped = {c.name: c.argv for c in every}
    scaling = [  # the same runs as the shaped ones, on an unshaped loopback
        *(Config(name, shaped[name.replace(" unshaped", "")]) for name in UNSHAPED),
        Config("unshaped 1 worker", (*common, *one_argv)),
        *(
            Config(
                f"unshaped 2 workers {exchange}", (*two_argv, "--exchange", exchange)
            )
            for exchange in SCALING_EXCHANGES
        ),
        Config(AT_ONCE, (*common, *one_argv), copies=2),
    ]
    scaling = [c for c in scaling if wanted is None or c.name in wanted]
    for config in scaling:
        results[config.name] = []
    if scaling:
        with ShapedNetwork(rate_mbit=None) as net:
            for round_index in range(args.rounds):
                order = scaling if round_index % 2 == 0 else scaling[::-1]
                for config in order:
                    for result in attempt(net, config, round_index, f"u{round_index}"):
                        print(
                            f"  round {round_index}: {config.name:22s} epoch "
                            f"{result.epoch_s:.3f}s (w/o ep0 "
                            f"{result.steady_s:.3f}s)",
                            flush=True,
                        )

    print(
        f"\n{args.nodes:,} nodes, F={args.features}, {args.model.upper()} hidden "
        f"{args.hidden}, {args.workers} workers x {args.threads} thread(s), "
        f"{args.rate_mbit:g} Mbit/s shared loopback (tbf), {args.epochs} epochs "
        f"x {args.rounds} round(s), node order {args.node_order}; load average "
        f"now {os.getloadavg()[0]:.1f}"
    )
    _print_table(results, failures, args.epochs)
    _print_ratios(results)
    if failures:
        print("\nfailed configurations (command and error):")
        for name, error in failures.items():
            print(f"--- {name}\n{error}")
    if args.json:
        runs = {k: [asdict(r) for r in v] for k, v in results.items()}
        figures = {"args": vars(args), "results": runs, "failures": failures}
        write_figures(args.json, figures)
    print(f"\nbench_fullgraph took {time.perf_counter() - started:.0f}s")
    return 1 if failures else 0


if __name__ == "__main__":
    raise SystemExit(run_script(main))
