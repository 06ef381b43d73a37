"""Distributed full-graph training over a shaped link: G3 vs halo vs replicate.

python benchmarks/bench_fullgraph.py [--nodes 200000] [--epochs 6] [--rate-mbit 1000]

In one run, on the synthetic products-like graph (F=100, GCN, hidden 128):

1. generates the graph once and partitions it once per method (random, chunk,
   metis, locality), so partitioning is not in any epoch time;
2. checks the shaper with a single TCP stream;
3. inside one network namespace whose loopback is shaped to ``--rate-mbit``
   (one ``tbf`` shared by all workers, ARCHITECTURE §4), trains with
   ``--workers 4`` for every engine (halo, replicate, g3 and G3's ablation
   modes) on METIS parts, then g3 on every partitioner, plus single-process
   training; the list runs ``--rounds`` times, alternating, and each
   configuration's figure is its median over rounds of the median epoch time;
4. unshaped: 1 worker vs 2 workers, one thread each (throughput scaling).

Prints the table (epoch time, bytes per epoch from the ledger, the qdisc's byte
counter for the same run) and the ratios beside the issue's targets.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from graphwire.testing.netns import (
    ShapedNetwork,
    measure_tcp_throughput,
    netns_available,
)

PYTHON = [sys.executable, "-m", "graphwire"]


def _cli(argv: list[str], net: ShapedNetwork | None = None) -> dict[str, str]:
    command = [*PYTHON, *argv]
    done = (
        net.run(command, capture_output=True, text=True, timeout=1800)
        if net is not None
        else subprocess.run(command, capture_output=True, text=True, timeout=1800)
    )
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(command)} failed:\n{done.stderr[-3000:]}")
    last = done.stdout.strip().splitlines()[-1]
    if not last.startswith("summary "):
        return {}
    return dict(pair.split("=", 1) for pair in last.split()[1:])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--nodes", type=int, default=200_000)
    parser.add_argument("--epochs", type=int, default=6)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--rate-mbit", type=float, default=1000.0)
    parser.add_argument("--hidden", type=int, default=128)
    args = parser.parse_args()
    available, why = netns_available()
    if not available:
        print(f"bench_fullgraph: needs network namespaces: {why}")
        return 1

    work = Path(tempfile.mkdtemp(prefix="gw-bench-fullgraph-"))
    spec = (
        f"synthetic:products?nodes={args.nodes}&degree=20&features=100"
        "&classes=47&seed=0"
    )
    graph = work / "graph"
    _cli(["data", "generate", "--dataset", spec, "--out", str(graph)])
    methods = ["metis", "random", "chunk", "locality"]
    for method in methods:
        start = time.perf_counter()
        _cli(
            ["partition", "--dataset", str(graph), "--method", method]
            + ["--parts", str(args.workers), "--out", str(work / f"parts-{method}")]
        )
        print(f"partitioned with {method} in {time.perf_counter() - start:.1f}s")
    _cli(
        ["partition", "--dataset", str(graph), "--method", "metis", "--parts", "2"]
        + ["--out", str(work / "parts-metis-2")]
    )

    train = ["train", "--model", "gcn", "--hidden", str(args.hidden)]
    train += ["--epochs", str(args.epochs), "--seed", "0", "--quiet"]
    train += ["--patience", str(10 * args.epochs)]
    runs: dict[str, list[str]] = {
        "single process": ["--dataset", str(graph), "--workers", "1"],
    }
    metis = ["--dataset", str(work / "parts-metis"), "--workers", str(args.workers)]
    for exchange in ("halo", "replicate", "g3"):
        runs[f"{exchange} (metis)"] = [*metis, "--exchange", exchange]
    for mode in ("sequential", "inter", "intra"):
        runs[f"g3 {mode} (metis)"] = [*metis, "--exchange", "g3", "--g3-mode", mode]
    for method in methods[1:]:
        runs[f"g3 ({method})"] = [
            "--dataset",
            str(work / f"parts-{method}"),
            "--workers",
            str(args.workers),
            "--exchange",
            "g3",
        ]

    results: dict[str, list[dict[str, float]]] = {name: [] for name in runs}
    with ShapedNetwork(rate_mbit=args.rate_mbit) as net:
        tcp = measure_tcp_throughput(net, seconds=1.0)
        print(
            f"shaper: one TCP stream {tcp:.0f} Mbit/s of {args.rate_mbit:.0f} "
            f"configured ({tcp / args.rate_mbit:.2f}x)"
        )
        for round_index in range(args.rounds):
            names = list(runs) if round_index % 2 == 0 else list(reversed(runs))
            for name in names:
                before = net.qdisc_bytes()
                out = work / f"run-{len(results[name])}-{name.replace(' ', '_')}"
                summary = _cli([*train, *runs[name], "--out", str(out)], net)
                qdisc = net.qdisc_bytes() - before
                results[name].append(
                    {
                        "epoch_s": float(summary["epoch_s_median"]),
                        "bytes": float(summary.get("bytes_sent", 0)),
                        "qdisc": float(qdisc),
                        "test_acc": float(summary["test_acc"]),
                    }
                )
                print(
                    f"  round {round_index}: {name:22s} epoch "
                    f"{float(summary['epoch_s_median']):.3f}s",
                    flush=True,
                )

    print(
        f"\n{args.nodes:,} nodes, F=100, GCN hidden {args.hidden}, {args.workers} "
        f"workers, {args.rate_mbit:.0f} Mbit/s shared loopback, {args.epochs} "
        f"epochs x {args.rounds} rounds"
    )
    print(
        f"{'configuration':24s} {'epoch s':>8s} {'MiB/epoch':>10s} "
        f"{'qdisc/ledger':>12s} {'test acc':>8s}"
    )
    epoch_s = {}
    for name, values in results.items():
        epoch_s[name] = statistics.median(v["epoch_s"] for v in values)
        mib = statistics.median(v["bytes"] for v in values) / 2**20 / args.epochs
        ledger = statistics.median(v["bytes"] for v in values)
        qdisc = statistics.median(v["qdisc"] for v in values)
        ratio = f"{qdisc / ledger:.3f}" if ledger else "-"
        print(
            f"{name:24s} {epoch_s[name]:8.3f} {mib:10.1f} {ratio:>12s} "
            f"{values[-1]['test_acc']:8.4f}"
        )
    print("(MiB/epoch: every byte of the run, training, evaluation and set-up.)")

    def ratio(a: str, b: str) -> float:
        return epoch_s[a] / epoch_s[b]

    print(
        f"\ng3 / halo epoch time        = {ratio('g3 (metis)', 'halo (metis)'):.2f}x "
        "(target <= 0.75x)"
    )
    print(
        f"g3 / replicate epoch time   = {ratio('g3 (metis)', 'replicate (metis)'):.2f}x"
    )
    print(f"g3 / single process         = {ratio('g3 (metis)', 'single process'):.2f}x")
    print(
        f"locality / metis (under g3) = {ratio('g3 (locality)', 'g3 (metis)'):.2f}x "
        "(target <= 0.9x)"
    )

    # Unshaped scaling: one worker vs two, one thread each, alternating.
    one, two = [], []
    for _ in range(args.rounds):
        one.append(
            float(
                _cli(
                    [*train, "--dataset", str(graph), "--workers", "1"]
                    + ["--threads", "1", "--out", str(work / "scale-1")]
                )["epoch_s_median"]
            )
        )
        two.append(
            float(
                _cli(
                    [*train, "--dataset", str(work / "parts-metis-2")]
                    + ["--workers", "2", "--exchange", "g3", "--threads", "1"]
                    + ["--out", str(work / "scale-2")]
                )["epoch_s_median"]
            )
        )
    speedup = statistics.median(one) / statistics.median(two)
    print(
        f"unshaped 2 workers / 1 worker throughput = {speedup:.2f}x "
        "(target >= 1.6x; 1 thread per worker)"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
