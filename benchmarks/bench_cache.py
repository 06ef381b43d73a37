"""RapidGNN's hot cache against its size: seeds/s and remote rows per epoch.

python benchmarks/bench_cache.py [--nodes 200000] [--epochs 4] [--workers 4]
                                 [--shares 0,0.05,0.1,0.25,0.5,1]
                                 [--rate-mbit 1000] [--quick] [--plot PATH]
                                 [--json PATH]

On one METIS partition of the synthetic products-like graph (GraphSAGE, 2
layers, fan-outs 10,25, batch 1000 seeds per trainer), inside one network
namespace whose loopback is shaped to ``--rate-mbit`` (as bench_minibatch),
it trains once with ``--fetch on-demand``, then once with ``--fetch rapid
--cache-share S`` per share S: each worker's cache holds that share of the
distinct remote rows its schedule's first epoch reads, the most read of each
epoch (a budget large enough for all of them is given, so the share is what
binds). Per share it prints seeds/s and its ratio to on-demand's, remote
rows per epoch (every prefetch, pull and cache-fill row, the first fill
included) and how many fewer than on-demand's, the hit rate and the cache's
MiB, and against on-demand's: forward + backward time, the largest worker's
peak RSS and the time outside the epochs (set-up); and it draws seeds/s
and remote rows against the share in a PNG (``--plot``): RapidGNN's Fig. 5,
remote fetches against cache size, which the paper gives without numbers.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from dataclasses import asdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_minibatch import Config, Result, measure_or_fail  # noqa: E402
from shaped_bench import (  # noqa: E402
    TIMEOUTS,
    add_graph_flags,
    add_run_flags,
    check_flags,
    in_work_folder,
    prepare_graph,
    shaper_check,
    take_sizes,
    write_figures,
)

from graphwire.testing.netns import MIN_RATE_MBIT, ShapedNetwork, netns_available

FULL = {"nodes": 200_000, "epochs": 4}
QUICK = {"nodes": 20_000, "epochs": 3}
MINIMUMS = {"nodes": 100, "features": 1, "workers": 2, "epochs": 2}
SHARES = (0.0, 0.05, 0.1, 0.25, 0.5, 1.0)
# Enough for every remote row of the largest run here: the share binds.
BUDGET_MB = 1e6


def _argv(args: argparse.Namespace, work: Path, fetch: str) -> tuple[str, ...]:
    argv: tuple[str, ...] = ("--mode", "minibatch", "--model", "sage")
    argv += ("--fanouts", "10,25", "--batch-size", "1000")
    argv += ("--epochs", str(args.epochs), "--eval-every", str(args.epochs))
    argv += ("--seed", "0", "--quiet", "--workers", str(args.workers))
    argv += ("--threads", "1", "--timeout", str(args.collective_timeout))
    return (*argv, "--dataset", str(work / "parts"), "--fetch", fetch)


def _configs(args: argparse.Namespace, work: Path) -> list[tuple[str, Config]]:
    runs = [("on-demand", Config("on-demand", "metis", _argv(args, work, "on-demand")))]
    for share in args.shares:
        argv = _argv(args, work, "rapid")
        argv += ("--cache-share", f"{share:g}", "--cache-mb", f"{BUDGET_MB:g}")
        runs.append((f"rapid {share:g}", Config("rapid", "metis", argv)))
    return runs


def _table(
    results: dict[str, Result], args: argparse.Namespace
) -> list[dict[str, float]]:
    """Print one line per share; return them (for --json and the plot)."""
    base = results.get("on-demand")
    print(
        f"\n{'configuration':14s} {'share':>6s} {'seeds/s':>8s} {'x on-dem':>8s} "
        f"{'rows/ep':>10s} {'rows cut':>8s} {'hit rate':>8s} {'cache MiB':>9s} "
        f"{'n_hot':>8s} {'fwd+bwd x':>9s} {'RSS MiB':>8s} {'RSS x':>6s} "
        f"{'start s':>7s} {'start x':>7s}"
    )
    rows = []
    for name, result in results.items():
        share = float(name.split()[1]) if name.startswith("rapid") else float("nan")
        speed = result.seeds_per_s / base.seeds_per_s if base else float("nan")
        cut = 1 - result.remote_rows / base.remote_rows if base else float("nan")
        ratio = {
            key: _ratio(getattr(result, key), getattr(base, key, 0.0))
            for key in ("compute_s", "peak_rss_mb", "outside_s")
        }
        print(
            f"{name:14s} {share:6.2f} {result.seeds_per_s:8.0f} {speed:7.2f}x "
            f"{result.remote_rows:10,.0f} {cut:8.1%} {result.cache_hit_rate:8.3f} "
            f"{result.cache_mib:9.1f} {result.n_hot:8d} "
            f"{ratio['compute_s']:8.2f}x {result.peak_rss_mb:8.0f} "
            f"{ratio['peak_rss_mb']:5.2f}x {result.outside_s:7.1f} "
            f"{ratio['outside_s']:6.2f}x"
        )
        rows.append(
            {
                "share": share,
                "seeds_per_s": result.seeds_per_s,
                "speedup": speed,
                "remote_rows": result.remote_rows,
                "rows_cut": cut,
                "hit_rate": result.cache_hit_rate,
                "compute_ratio": ratio["compute_s"],
                "peak_rss_mb": result.peak_rss_mb,
                "total_rss_mb": result.total_rss_mb,
                "rss_ratio": ratio["peak_rss_mb"],
                "start_s": result.outside_s,
                "start_ratio": ratio["outside_s"],
            }
        )
    print(
        "share: --cache-share (of the distinct remote rows the first epoch of "
        "each worker's schedule reads); seeds/s: the summary's (median over "
        "epochs 1..); rows/ep: "
        "remote feature rows of the whole run / epochs, all ranks; rows cut: "
        "fewer than on-demand's; n_hot: rows per buffer, largest rank; "
        "fwd+bwd x: forward and backward per epoch against on-demand's; RSS: "
        "the largest worker's peak; start s: the run's wall time outside its "
        "epochs (launch, set-up before epoch 0, teardown)."
    )
    return rows


def _ratio(value: float, base: float) -> float:
    return value / base if base else float("nan")


def _plot(rows: list[dict[str, float]], path: str, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rapid = [r for r in rows if r["share"] == r["share"]]  # not NaN: rapid's
    base = next((r for r in rows if r["share"] != r["share"]), None)
    shares = [100 * r["share"] for r in rapid]
    figure, (left, right) = plt.subplots(1, 2, figsize=(10, 4))
    left.plot(shares, [r["seeds_per_s"] for r in rapid], "o-", label="rapid")
    right.plot(shares, [r["remote_rows"] for r in rapid], "o-", label="rapid")
    if base is not None:
        left.axhline(base["seeds_per_s"], color="grey", ls="--", label="on-demand")
        right.axhline(base["remote_rows"], color="grey", ls="--", label="on-demand")
    what = "cache, % of the remote rows a worker's first epoch reads"
    left.set(xlabel=what, ylabel="seeds/s")
    right.set(xlabel=what)
    right.set(ylabel="remote rows per epoch")
    for axes in (left, right):
        axes.grid(alpha=0.3)
        axes.legend()
    figure.suptitle(title, fontsize=9)
    figure.tight_layout()
    tmp = f"{path}.tmp.png"
    figure.savefig(tmp, dpi=110)
    plt.close(figure)
    os.replace(tmp, path)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    add_graph_flags(parser)
    parser.add_argument(
        "--workers", type=int, default=4, help="trainer processes (default 4)"
    )
    parser.add_argument(
        "--epochs", type=int, help="epochs per run (default 4, --quick 3)"
    )
    parser.add_argument(
        "--shares",
        default=",".join(f"{s:g}" for s in SHARES),
        help="cache shares to run rapid with, 0..1 (default 0,0.05,0.1,0.25,0.5,1)",
    )
    parser.add_argument(
        "--rate-mbit",
        type=float,
        default=1000.0,
        help="rate of the shaped loopback, Mbit/s; 0: unshaped (default 1000)",
    )
    parser.add_argument("--plot", metavar="PATH", help="write the PNG here")
    parser.add_argument("--json", metavar="PATH", help="also write the figures")
    add_run_flags(parser)
    args = parser.parse_args(argv)
    take_sizes(args, FULL, QUICK)
    check_flags(parser, args, MINIMUMS, TIMEOUTS)
    try:
        args.shares = [float(s) for s in args.shares.split(",")]
    except ValueError:
        parser.error(f"--shares: expected numbers separated by commas: {args.shares}")
    if not all(0 <= s <= 1 for s in args.shares):
        parser.error(f"--shares: each must be in [0, 1], got {args.shares}")
    if args.rate_mbit != 0 and not args.rate_mbit >= MIN_RATE_MBIT:
        parser.error(f"--rate-mbit: expected >= {MIN_RATE_MBIT}, or 0 (unshaped)")
    if args.plot and Path(args.plot).is_dir():
        parser.error(f"--plot {args.plot}: is a folder")
    available, why = netns_available()
    if not available:
        print(f"bench_cache: needs network namespaces (root): {why}", file=sys.stderr)
        return 1
    return in_work_folder("gw-bench-cache-", args, _bench)


def _bench(args: argparse.Namespace, work: Path, started: float) -> int:
    prepare_graph(args, work, [("metis", args.workers, "parts")])
    results: dict[str, Result] = {}
    failures: dict[str, str] = {}
    shaped = args.rate_mbit > 0
    with ShapedNetwork(rate_mbit=args.rate_mbit if shaped else None) as net:
        if shaped:
            shaper_check(net, args.rate_mbit)
        for name, config in _configs(args, work):
            out = work / f"run-{name.replace(' ', '-')}"
            result = measure_or_fail(
                net, shaped, config, out, args.run_timeout, name, failures
            )
            if result is None:
                continue
            results[name] = result
            print(
                f"  {name:14s} seeds/s {result.seeds_per_s:7.0f} rows/ep "
                f"{result.remote_rows:,.0f} wall {result.wall_s:.0f}s",
                flush=True,
            )
    link = f"{args.rate_mbit:g} Mbit/s shared loopback" if shaped else "unshaped"
    title = (
        f"{args.nodes:,} nodes, F={args.features}, METIS, {args.workers} workers x 1 "
        f"thread on {os.cpu_count()} CPUs, {link}, {args.epochs} epochs"
    )
    print(f"\n{title}; load average now {os.getloadavg()[0]:.1f}")
    rows = _table(results, args)
    if args.plot and rows:
        _plot(rows, args.plot, title)
        print(f"plot: {args.plot}")
    if args.json:
        payload = {"args": vars(args), "rows": rows, "failures": failures}
        payload["results"] = {k: asdict(v) for k, v in results.items()}
        write_figures(args.json, payload)
    for name, message in failures.items():
        print(f"--- {name} failed\n{message}")
    print(f"\nbench_cache took {time.perf_counter() - started:.0f}s")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
