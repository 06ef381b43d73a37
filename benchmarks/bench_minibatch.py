"""Distributed mini-batch training over a shaped link: RapidGNN vs on-demand.

python benchmarks/bench_minibatch.py [--nodes 200000] [--epochs 6] [--rounds 1]
                                     [--rate-mbit 1000] [--workers 4] [--quick]
                                     [--n-hot N] [--prefetch Q] [--json PATH]
                                     [--methods metis,random]

In one run, on the synthetic products-like graph (F=100, GraphSAGE, 2 layers,
fan-outs 10,25, batch 1000 seeds per trainer):

0. generates the graph once and partitions it once per method (metis,
   random) into ``--workers`` parts, so partitioning is in no run's time;
1. times the single-process sampler (``UniformNeighborSampler``, hashed draws,
   one thread) in this process on the same graph and fan-outs: sampled edges
   per second over ``--sampler-batches`` batches of training seeds;
2. checks the shaper with a single TCP stream at ``--rate-mbit``;
3. inside one network namespace whose loopback is shaped to ``--rate-mbit``
   (one ``tbf`` shared by all workers, as bench_fullgraph) trains
   {on-demand, rapid} x {metis, random}, ``--workers`` processes of
   ``--threads`` thread(s) each. The list runs ``--rounds`` times, forwards
   then backwards; each configuration's figure is the median over rounds.

Per run it reads ``OUT/metrics.jsonl``: the summary's seeds/s (median over
epochs of all ranks' seeds / the slowest rank's training time), epoch time,
remote feature rows and bytes (every on-demand, prefetch and cache-fill row
of the whole run, the first cache fill before epoch 0 included, / epochs),
cache hit rate and test accuracy; from the epoch records the fallbacks, the
time split (mean over ranks per epoch, the epochs after the first) and the
distributed sampler's edges/s per worker (on-demand runs: sampled edges /
sample time); and the qdisc's byte counter over the run. Rapid's
presampling time (the summary's ``presample_s``, slowest rank) is printed
under the table with the cache's size; "outside s" (the run's wall time
minus every epoch's slowest-rank training and evaluation time) holds the
first epoch's presampling, with process start, loading, set-up and the first
cache fill, for both modes. A configuration that fails
or hangs is reported with its command and error; the others still run.
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

import torch

from graphwire.commands.bench import run_script
from graphwire.graph.datasets import load_dataset
from graphwire.sampler.uniform import UniformNeighborSampler
from graphwire.testing.netns import MIN_RATE_MBIT, ShapedNetwork, netns_available

sys.path.insert(0, str(Path(__file__).resolve().parent))
from shaped_bench import (  # noqa: E402
    TIMEOUTS,
    RunFailed,
    add_graph_flags,
    add_run_flags,
    check_flags,
    epoch_records,
    in_work_folder,
    prepare_graph,
    qdisc_drops,
    shaper_check,
    take_sizes,
    train_run,
    write_figures,
)

FETCHES = ("on-demand", "rapid")
METHODS = ("metis", "random")
# Run sizes: the defaults, and --quick's (flags given on the command line win).
FULL = {"nodes": 200_000, "epochs": 6, "rounds": 1}
QUICK = {"nodes": 20_000, "epochs": 3, "rounds": 1}
# Flag -> its least value (unset ones pass), checked before any work.
MINIMUMS = {
    "nodes": 100,
    "features": 1,
    "workers": 2,
    "threads": 1,
    "epochs": 1,
    "eval_every": 1,
    "batch_size": 1,
    "n_hot": 0,
    "prefetch": 1,
    "rounds": 1,
    "sampler_batches": 1,
}
SPLIT = (
    "sample_s",
    "fetch_s",
    "wait_s",
    "forward_s",
    "backward_s",
    "sync_s",
    "eval_s",
)
# RapidGNN's claims against DistDGL on the same partitioner (digests/rapidgnn.md):
# Table 2's averages (step time and network time speedup over DGL-METIS and
# DGL-Random; 15.39x is over Dist GCN, not compared here) and Fig. 4's data per
# step (against DGL-METIS only).
PAPER = {
    "metis": {
        "rows": "paper, Fig. 4: data per step 2.2-2.5x on products, 15-23x on Reddit",
        "network": "paper, Table 2: network time 12.70x over DGL-METIS",
        "step": "paper, Table 2: 2.46x step time over DGL-METIS",
    },
    "random": {
        "rows": "paper: none against DGL-Random",
        "network": "paper, Table 2: network time 9.70x over DGL-Random",
        "step": "paper, Table 2: 2.26x step time over DGL-Random",
    },
}


@dataclass(frozen=True, slots=True)
class Config:
    """One training configuration: fetch mode, partitioner, ``train`` flags."""

    fetch: str
    method: str
    argv: tuple[str, ...]

    @property
    def name(self) -> str:
        return f"{self.fetch} ({self.method})"


@dataclass(slots=True)
class Result:
    """What one run of a configuration measured (per epoch unless said)."""

    seeds_per_s: float  # summary: median over epochs, all ranks / slowest rank
    epoch_s: float  # summary epoch_s_median: slowest rank's train_s, epochs 1..
    first_s: float  # epoch 0, slowest rank's train_s
    remote_rows: float  # summary remote_rows (whole run) / epochs
    in_epoch_rows: float  # epoch records' remote_rows, all ranks, mean per epoch
    remote_mib: float  # summary remote_bytes / epochs, MiB
    cache_hit_rate: float
    fallbacks: int  # all ranks, whole run
    sample_s: float  # time split: mean over ranks, epochs 1..
    fetch_s: float
    wait_s: float
    compute_s: float
    sync_s: float
    eval_s: float
    sampled_edges: float  # all ranks, mean per epoch
    dist_edges_per_s: float  # per worker, mean over ranks (0: nothing sampled)
    qdisc_bytes: int  # root qdisc of lo over the run
    bytes_sent: int  # ledger, all ranks, whole run
    test_acc: float
    outside_s: float  # wall minus every epoch's slowest train_s + eval_s
    wall_s: float
    peak_rss_mb: float = 0.0  # the largest worker's peak RSS
    total_rss_mb: float = 0.0  # the workers' peak RSS, summed
    presample_s: float = 0.0  # rapid: slowest rank's presampling (summary)
    n_hot: int = 0  # rapid: cache rows per buffer (summary, largest rank)
    cache_mib: float = 0.0  # rapid: both buffers (summary, largest rank)


# ------------------------------------------------------------------ running
def _measure(
    net: ShapedNetwork, shaped: bool, config: Config, out: Path, timeout_s: float
) -> Result:
    before = net.qdisc_bytes() if shaped else 0
    summary, wall = train_run(net, list(config.argv), out, timeout_s)
    qdisc = net.qdisc_bytes() - before if shaped else 0
    ranks = epoch_records(out)
    epochs = min(len(records) for records in ranks.values())
    slowest = [
        max(records[e]["extra"]["train_s"] for records in ranks.values())
        for e in range(epochs)
    ]
    evals = [
        max(records[e]["times"]["eval_s"] for records in ranks.values())
        for e in range(epochs)
    ]
    split = dict.fromkeys(SPLIT, 0.0)
    fallbacks = in_epoch_rows = edges = 0
    rates = []
    # The split is over the epochs after the first, as the summary's medians
    # are: the first pays the start-up (rapid: the presampling overlapped).
    steady = range(1 if epochs > 1 else 0, epochs)
    for records in ranks.values():
        for e in steady:
            for key in SPLIT:
                split[key] += records[e]["times"][key]
        for record in records[:epochs]:
            extra = record["extra"]
            fallbacks += extra["fallbacks"]
            in_epoch_rows += extra["remote_rows"]
            edges += extra["sampled_edges"]
        sample_s = sum(r["times"]["sample_s"] for r in records[:epochs])
        if sample_s > 0:
            edges_r = sum(r["extra"]["sampled_edges"] for r in records[:epochs])
            rates.append(edges_r / sample_s)
    per = max(1, len(steady) * len(ranks))
    peaks = [max(r["peak_rss_mb"] for r in records) for records in ranks.values()]
    num_epochs = max(1, int(summary.get("epochs", epochs)))
    return Result(
        seeds_per_s=float(summary["seeds_per_s"]),
        epoch_s=float(summary["epoch_s_median"]),
        first_s=slowest[0],
        remote_rows=int(summary["remote_rows"]) / num_epochs,
        in_epoch_rows=in_epoch_rows / max(1, epochs),
        remote_mib=int(summary["remote_bytes"]) / 2**20 / num_epochs,
        cache_hit_rate=float(summary["cache_hit_rate"]),
        fallbacks=fallbacks,
        sample_s=split["sample_s"] / per,
        fetch_s=split["fetch_s"] / per,
        wait_s=split["wait_s"] / per,
        compute_s=(split["forward_s"] + split["backward_s"]) / per,
        sync_s=split["sync_s"] / per,
        eval_s=split["eval_s"] / per,
        sampled_edges=edges / max(1, epochs),
        dist_edges_per_s=statistics.mean(rates) if rates else 0.0,
        qdisc_bytes=qdisc,
        bytes_sent=int(summary["bytes_sent"]),
        test_acc=float(summary["test_acc"]),
        outside_s=wall - sum(slowest) - sum(evals),
        wall_s=wall,
        peak_rss_mb=max(peaks),
        total_rss_mb=sum(peaks),
        presample_s=float(summary.get("presample_s", 0.0)),
        n_hot=int(summary.get("n_hot", 0)),
        cache_mib=float(summary.get("cache_mib", 0.0)),
    )


def _single_sampler(graph_dir: Path, args: argparse.Namespace) -> dict[str, float]:
    """Single-process sampled edges/s on one thread (hashed draws, as the
    distributed sampler makes), batches of training seeds timed one by one."""
    graph = load_dataset(str(graph_dir))
    assert graph.train_idx is not None
    order = graph.train_idx[
        torch.randperm(
            graph.train_idx.numel(), generator=torch.Generator().manual_seed(0)
        )
    ]
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        sampler = UniformNeighborSampler(graph, args.fanouts, hashed=True)
        sampler.sample(order[: args.batch_size], 0)  # warm-up
        seconds, edges, rates = 0.0, 0, []
        for b in range(args.sampler_batches):
            start = (b * args.batch_size) % order.numel()
            seeds = order[start : start + args.batch_size]
            began = time.perf_counter()
            batch = sampler.sample(seeds, b + 1)
            took = time.perf_counter() - began
            seconds += took
            edges += batch.num_sampled_edges
            rates.append(batch.num_sampled_edges / took)
    finally:
        torch.set_num_threads(threads)
    return {
        "edges_per_s": edges / seconds,
        "median_batch_edges_per_s": statistics.median(rates),
        "edges_per_batch": edges / args.sampler_batches,
        "batches": args.sampler_batches,
    }


def measure_or_fail(
    net: ShapedNetwork,
    shaped: bool,
    config: Config,
    out: Path,
    timeout_s: float,
    name: str,
    failures: dict[str, str],
) -> Result | None:
    """``config`` run into ``out`` (rapid's presample inside it, removed
    with it): its Result, or None, its failure printed and kept in
    ``failures[name]``."""
    argv = config.argv
    if config.fetch == "rapid":
        argv += ("--presample-dir", str(out / "presample"))
    try:
        return _measure(
            net, shaped, Config(config.fetch, config.method, argv), out, timeout_s
        )
    except (RunFailed, OSError, KeyError, ValueError, IndexError) as error:
        failures[name] = str(error)
        print(f"  {name}: FAILED\n{error}", flush=True)
        return None


# ------------------------------------------------------------------ setup
def _prepare(args: argparse.Namespace, work: Path) -> None:
    jobs = [(m, args.workers, f"parts-{m}") for m in args.methods]
    prepare_graph(args, work, jobs)


def _configs(args: argparse.Namespace, work: Path) -> list[Config]:
    common: tuple[str, ...] = ("--mode", "minibatch", "--model", "sage")
    common += ("--fanouts", ",".join(map(str, args.fanouts)))
    common += ("--batch-size", str(args.batch_size), "--epochs", str(args.epochs))
    common += ("--eval-every", str(args.eval_every), "--seed", "0", "--quiet")
    common += ("--workers", str(args.workers), "--threads", str(args.threads))
    common += ("--timeout", str(args.collective_timeout))
    rapid: tuple[str, ...] = ()
    if args.n_hot is not None:
        rapid += ("--n-hot", str(args.n_hot))
    if args.prefetch is not None:
        rapid += ("--prefetch", str(args.prefetch))
    configs = []
    for method in args.methods:
        data = ("--dataset", str(work / f"parts-{method}"))
        for fetch in FETCHES:
            extra = rapid if fetch == "rapid" else ()
            configs.append(
                Config(fetch, method, (*common, *data, "--fetch", fetch, *extra))
            )
    return configs


# ------------------------------------------------------------------ report
def _median(results: list[Result], field: str) -> float:
    return statistics.median(float(getattr(r, field)) for r in results)


def _print_tables(results: dict[str, list[Result]], failures: dict[str, str]) -> None:
    print(
        f"\n{'configuration':20s} {'seeds/s':>8s} {'epoch s':>8s} {'ep0 s':>6s} "
        f"{'rows/ep':>9s} {'in-ep rows':>10s} {'MiB/ep':>7s} {'hit rate':>8s} "
        f"{'fallbk':>6s} {'qdiscMiB':>9s} {'acc':>6s} {'outside s':>9s} "
        f"{'wall s':>7s} {'n':>2s}"
    )
    for name, runs in results.items():
        if not runs:
            print(f"{name:20s} FAILED: {failures.get(name, '?').splitlines()[0]}")
            continue
        print(
            f"{name:20s} {_median(runs, 'seeds_per_s'):8.0f} "
            f"{_median(runs, 'epoch_s'):8.3f} {_median(runs, 'first_s'):6.2f} "
            f"{_median(runs, 'remote_rows'):9.0f} "
            f"{_median(runs, 'in_epoch_rows'):10.0f} "
            f"{_median(runs, 'remote_mib'):7.1f} "
            f"{_median(runs, 'cache_hit_rate'):8.3f} "
            f"{_median(runs, 'fallbacks'):6.0f} "
            f"{_median(runs, 'qdisc_bytes') / 2**20:9.1f} "
            f"{runs[-1].test_acc:6.4f} {_median(runs, 'outside_s'):9.1f} "
            f"{_median(runs, 'wall_s'):7.1f} {len(runs):2d}"
        )
    print(
        "seeds/s: summary (median over epochs 1.. of all ranks' seeds / "
        "slowest rank's train s); epoch s: its median train s; ep0 s: epoch "
        "0's;\n"
        "rows/ep, MiB/ep: remote feature rows and their bytes (kv.pull, "
        "kv.prefetch, kv.cache; labels not counted) of the whole run "
        "(first cache fill included) / epochs; in-ep rows: rows pulled inside "
        "epochs (misses + later cache fills);\nfallbk: batches the trainer "
        "assembled itself (all ranks, whole run); qdiscMiB: lo's root qdisc over "
        "the whole run (sampling hops, eval, grad sync, headers included);\n"
        "outside s: wall minus every epoch's slowest train + eval s (process "
        "start, load, set-up; rapid: + presampling + first cache fill)."
    )
    for name, runs in results.items():
        if runs and _median(runs, "n_hot"):
            print(
                f"{name}: n_hot {_median(runs, 'n_hot'):.0f} rows per buffer "
                f"(largest rank), cache {_median(runs, 'cache_mib'):.1f} MiB, "
                f"presampling {_median(runs, 'presample_s'):.2f} s (slowest rank)"
            )
    print(
        f"\n{'time split s/epoch':20s} {'sample':>8s} {'fetch':>8s} {'wait':>8s} "
        f"{'compute':>8s} {'sync':>8s} {'eval':>8s} {'edges/ep':>10s} "
        f"{'edges/s/worker':>14s}"
    )
    for name, runs in results.items():
        if not runs:
            continue
        rate = _median(runs, "dist_edges_per_s")
        print(
            f"{name:20s} {_median(runs, 'sample_s'):8.3f} "
            f"{_median(runs, 'fetch_s'):8.3f} {_median(runs, 'wait_s'):8.3f} "
            f"{_median(runs, 'compute_s'):8.3f} {_median(runs, 'sync_s'):8.3f} "
            f"{_median(runs, 'eval_s'):8.3f} {_median(runs, 'sampled_edges'):10.0f} "
            f"{f'{rate:,.0f}' if rate else '-':>14s}"
        )
    print(
        "mean over ranks per epoch, epochs after the first; compute = forward + "
        "backward (with the optimizer step), sync = the wait for the gradients' "
        "sums after the backward; rapid samples ahead (no sample s) and reads "
        "its batches from the prefetcher (wait s);\nedges/s/worker: sampled "
        "edges / sample s per rank, mean over "
        "ranks (remote hops over the shaped link included)."
    )


def _ratios(
    results: dict[str, list[Result]], sampler: dict[str, float], methods: list[str]
) -> dict[str, float | None]:
    """Print each ratio beside its target; return them for --json."""
    out: dict[str, float | None] = {}

    def ratio(a: str, b: str, field: str) -> float | None:
        if not results.get(a) or not results.get(b):
            return None
        den = _median(results[b], field)
        return _median(results[a], field) / den if den else None

    def line(label: str, value: float | None, target: str, ok: float | None) -> None:
        out[label] = value
        if value is None:
            print(f"{label:58s}   n/a (a run failed or a figure is 0){target}")
            return
        verdict = "" if ok is None else ("  MET" if value >= ok else "  NOT MET")
        print(f"{label:58s} {value:6.2f}x{target}{verdict}")

    for method in methods:
        od, rapid = f"on-demand ({method})", f"rapid ({method})"
        paper = PAPER[method]
        line(
            f"remote rows on-demand / rapid ({method})",
            ratio(od, rapid, "remote_rows"),
            "  target >= 5x",
            5.0,
        )
        line(
            f"remote bytes on-demand / rapid ({method})",
            ratio(od, rapid, "remote_mib"),
            f"  ({paper['rows']})",
            None,
        )
        network = None
        if results.get(od) and results.get(rapid):
            rapid_s = _median(results[rapid], "fetch_s") + _median(
                results[rapid], "wait_s"
            )
            network = _median(results[od], "fetch_s") / rapid_s if rapid_s else None
        line(
            f"fetch s on-demand / fetch+wait s rapid ({method})",
            network,
            f"  ({paper['network']})",
            None,
        )
        line(
            f"seeds/s rapid / on-demand ({method})",
            ratio(rapid, od, "seeds_per_s"),
            f"  target >= 1.5x ({paper['step']})",
            1.5,
        )
    single = sampler.get("edges_per_s", 0.0)
    for method in methods:
        runs = results.get(f"on-demand ({method})")
        dist = _median(runs, "dist_edges_per_s") if runs else 0.0
        line(
            f"sampler edges/s: distributed per worker / single ({method})",
            dist / single if dist and single else None,
            f"  ({dist:,.0f} vs {single:,.0f} edges/s, 1 thread each)",
            None,
        )
    for method in methods:
        a, b = results.get(f"on-demand ({method})"), results.get(f"rapid ({method})")
        if a and b:
            same = a[-1].test_acc == b[-1].test_acc
            print(
                f"test acc on-demand vs rapid ({method}): {a[-1].test_acc:.4f} vs "
                f"{b[-1].test_acc:.4f} ({'equal' if same else 'DIFFER'}: the modes "
                "take bitwise-identical steps)"
            )
    return out


# ------------------------------------------------------------------ main
def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    add_graph_flags(parser)
    parser.add_argument(
        "--workers",
        type=int,
        default=4,
        help="trainer processes (and parts), at least 2 (default 4)",
    )
    parser.add_argument(
        "--threads", type=int, default=1, help="torch threads per worker (default 1)"
    )
    parser.add_argument(
        "--epochs", type=int, help="epochs per run (default 6, --quick 3)"
    )
    parser.add_argument(
        "--eval-every", type=int, help="evaluate every K epochs (default: --epochs)"
    )
    parser.add_argument(
        "--batch-size",
        type=int,
        default=1000,
        help="seeds per batch per trainer (default 1000)",
    )
    parser.add_argument(
        "--fanouts",
        default="10,25",
        help="fan-outs, input layer first; -1 takes every neighbour, as in "
        "--fanouts=-1,25 (default 10,25)",
    )
    parser.add_argument(
        "--n-hot", type=int, help="rapid: hot-cache rows (default: train's)"
    )
    parser.add_argument(
        "--prefetch",
        type=int,
        help="rapid: batches kept ready, Q (default: train's)",
    )
    parser.add_argument(
        "--methods",
        default="metis,random",
        help="partitioners to compare on, of metis and random (default both)",
    )
    parser.add_argument(
        "--rounds",
        type=int,
        help="times every configuration runs, alternating the order; figures "
        "are medians over rounds (default 1)",
    )
    parser.add_argument(
        "--rate-mbit",
        type=float,
        default=1000.0,
        help="rate of the shaped loopback every worker shares, Mbit/s; 0: "
        "unshaped (default 1000)",
    )
    parser.add_argument(
        "--sampler-batches",
        type=int,
        default=20,
        help="batches the single-process sampler is timed on (default 20)",
    )
    add_run_flags(parser)
    parser.add_argument(
        "--json", metavar="PATH", help="also write every figure to PATH"
    )
    args = parser.parse_args(argv)
    take_sizes(args, FULL, QUICK)
    check_flags(parser, args, MINIMUMS, TIMEOUTS)
    if args.rate_mbit != 0 and not MIN_RATE_MBIT <= args.rate_mbit < float("inf"):
        parser.error(
            f"--rate-mbit: expected a number >= {MIN_RATE_MBIT} (tc's 1 kbit/s), "
            f"or 0 for an unshaped link, got {args.rate_mbit}"
        )
    try:
        args.fanouts = [int(f) for f in args.fanouts.split(",")]
    except ValueError:
        parser.error(
            f"--fanouts: expected integers separated by commas, got {args.fanouts!r}"
        )
    if any(f == 0 or f < -1 for f in args.fanouts):
        parser.error(f"--fanouts: each must be >= 1 or -1 (all), got {args.fanouts}")
    args.methods = args.methods.split(",")
    if unknown := sorted(set(args.methods) - set(METHODS)):
        parser.error(f"--methods: expected some of {METHODS}, got {unknown}")
    if len(set(args.methods)) < len(args.methods):
        # Each method's parts and runs go in one folder and one table row.
        parser.error(f"--methods: each at most once, got {','.join(args.methods)}")
    args.eval_every = args.eval_every or args.epochs
    if args.epochs < 4 and not args.quick:
        print(
            f"note: --epochs {args.epochs}: rapid's presampling and first cache "
            "fill amortise over epochs; 4 or more is the fair comparison"
        )
    available, why = netns_available()
    if not available:
        print(
            f"bench_minibatch: needs network namespaces (run as root): {why}",
            file=sys.stderr,
        )
        return 1

    return in_work_folder("gw-bench-minibatch-", args, _bench)


def _bench(args: argparse.Namespace, work: Path, started: float) -> int:
    _prepare(args, work)
    sampler = _single_sampler(work / "graph", args)
    print(
        f"single-process sampler: {sampler['edges_per_s']:,.0f} sampled edges/s "
        f"(median batch {sampler['median_batch_edges_per_s']:,.0f}), "
        f"{sampler['edges_per_batch']:,.0f} edges per batch of {args.batch_size}, "
        f"{args.sampler_batches} batches, 1 thread",
        flush=True,
    )
    configs = _configs(args, work)
    results: dict[str, list[Result]] = {c.name: [] for c in configs}
    failures: dict[str, str] = {}
    shaped = args.rate_mbit > 0

    with ShapedNetwork(rate_mbit=args.rate_mbit if shaped else None) as net:
        if shaped:
            shaper_check(net, args.rate_mbit)
        for round_index in range(args.rounds):
            order = configs if round_index % 2 == 0 else configs[::-1]
            for config in order:
                if config.name in failures:
                    continue  # one failure per configuration is enough
                slug = re.sub(r"[^a-z0-9]+", "-", config.name.lower()).strip("-")
                out = work / f"run-{round_index}-{slug}"
                result = measure_or_fail(
                    net, shaped, config, out, args.run_timeout, config.name, failures
                )
                if result is None:
                    continue
                results[config.name].append(result)
                print(
                    f"  round {round_index}: {config.name:18s} seeds/s "
                    f"{result.seeds_per_s:7.0f} epoch {result.epoch_s:.3f}s "
                    f"rows/ep {result.remote_rows:,.0f} wall {result.wall_s:.0f}s",
                    flush=True,
                )
        if shaped:
            print(f"shaped link over the whole session: {qdisc_drops(net)}")

    link = f"{args.rate_mbit:g} Mbit/s shared loopback (tbf)" if shaped else "unshaped"
    print(
        f"\n{args.nodes:,} nodes, F={args.features}, GraphSAGE 2 layers, fan-outs "
        f"{args.fanouts}, batch {args.batch_size}/trainer, {args.workers} workers x "
        f"{args.threads} thread(s) on {os.cpu_count()} CPUs, {link}, "
        f"{args.epochs} epochs (eval every {args.eval_every}) x {args.rounds} "
        f"round(s); rapid n_hot {args.n_hot or 'default'}, prefetch "
        f"{args.prefetch or 'default'}; load average now {os.getloadavg()[0]:.1f}"
    )
    _print_tables(results, failures)
    print()
    ratios = _ratios(results, sampler, args.methods)
    if failures:
        print("\nfailed configurations (command and error):")
        for name, message in failures.items():
            print(f"--- {name}\n{message}")
    if args.json:
        write_figures(
            args.json,
            {
                "args": vars(args),
                "single_sampler": sampler,
                "results": {k: [asdict(r) for r in v] for k, v in results.items()},
                "ratios": ratios,
                "failures": failures,
            },
        )
    print(f"\nbench_minibatch took {time.perf_counter() - started:.0f}s")
    return 1 if failures else 0


if __name__ == "__main__":
    raise SystemExit(run_script(main))
