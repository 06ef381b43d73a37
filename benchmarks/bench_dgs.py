"""DGS against uniform sampling and the other samplers: bytes, accuracy, speed.

python benchmarks/bench_dgs.py [--nodes 200000] [--datasets products,cora]
                               [--methods metis,chunk,random] [--fetches LIST]
                               [--epochs 30] [--fixed-epochs 10] [--workers 4]
                               [--layer-nodes 1024[,4096...]]
                               [--speed] [--rate-mbit 1000] [--quick] [--json PATH]

In one run:

1. **bytes and accuracy** (no shaping): the synthetic products-like graph
   (``--nodes``, F=100, 47 classes) and Cora, each partitioned once per
   method into ``--workers`` parts; on each, ``graphwire train --mode
   minibatch`` (GraphSAGE, 2 layers, hidden 16 as DGS trains) with each
   fetcher of ``--fetches``:

   ============  ==========================================================
   uniform       ``--fetch on-demand`` (DistDGL: uniform sampling)
   ns            ``--fetch dgs --dgs-parts node`` (DGS's NS-only)
   fs            ``--fetch dgs --dgs-parts feature`` (FS-only)
   dgs           ``--fetch dgs`` (both)
   rf            ``--fetch dgs --dgs-parts rf`` (uniform + random dimensions)
   fastgcn       ``--fetch fastgcn``
   ladies        ``--fetch ladies``
   rapid         ``--fetch rapid`` (RapidGNN)
   rapid-dims    ``--fetch rapid --dgs-dims``
   ============  ==========================================================

   Per run, from ``metrics.jsonl``, summed over the ranks: the remote
   feature bytes per epoch (``kv.pull``/``prefetch``/``cache`` requests and
   answers, mean over the epochs); the samplers' own syncs per epoch (DGS's
   ``dgs.bias``, LADIES' ``layer.norms``, both directions) and the ones
   made once (DGS's halo pull ``kv.explain`` when its first round starts,
   FastGCN's ``setup.fastgcn`` at the set-up); the test
   accuracy after ``--fixed-epochs`` and at the best validation epoch of
   ``--epochs`` (the run's summary: "at convergence") and the mean of its
   last 10 epochs (steadier than one epoch's); the explainer's CPU
   seconds over the workers' CPU seconds. Ratios against ``uniform`` on the
   same parts: bytes (features plus syncs) and accuracy points.
2. **speed** (``--speed``): 2 workers (one core each) inside a network
   namespace whose loopback is shaped to ``--rate-mbit`` (one ``tbf`` shared
   by both), products on METIS parts, ``uniform`` and ``dgs``, the list run
   forwards then backwards; seeds/s of each (the summary's median over epochs
   after the first), their ratio, and where an epoch's time went (training,
   gradient sync, the trainer's wait for batches, the seconds spent sampling
   and fetching on any thread, the explainer's CPU).

The explanation period ``--explain-every`` (T_ex, default 30) and batch size
are per dataset (Cora's 140 training nodes make few steps). DGS's figures in
the paper are on 8 V100 workers over 10 Gbit/s, with Reddit, products, Amazon
and papers; this is a 2-core machine: the shape is compared, not the figures.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from shaped_bench import (  # noqa: E402
    RunFailed,
    cli,
    comma_list,
    epoch_records,
    in_work_folder,
    shaper_check,
    summary_fields,
    train_run,
    write_figures,
)

from graphwire.testing.netns import ShapedNetwork, netns_available  # noqa: E402

FETCHES: dict[str, tuple[str, ...]] = {
    "uniform": ("--fetch", "on-demand"),
    "ns": ("--fetch", "dgs", "--dgs-parts", "node"),
    "fs": ("--fetch", "dgs", "--dgs-parts", "feature"),
    "dgs": ("--fetch", "dgs"),
    "rf": ("--fetch", "dgs", "--dgs-parts", "rf"),
    "fastgcn": ("--fetch", "fastgcn"),
    "ladies": ("--fetch", "ladies"),
    "rapid": ("--fetch", "rapid"),
    "rapid-dims": ("--fetch", "rapid", "--dgs-dims"),
}
EXPLAINED = {"ns", "fs", "dgs", "rapid-dims"}  # take --explain-every
LAYERWISE = {"fastgcn", "ladies"}  # take --layer-nodes
TAIL = 10  # epochs whose mean test accuracy is the steadier convergence figure
FEATURE_TAGS = ("kv.pull", "kv.prefetch", "kv.cache")
SYNC_TAGS = ("dgs.bias", "layer.norms")  # per epoch, both directions
SETUP_TAGS = ("kv.explain", "setup.fastgcn")  # once a run
PAPER = (
    "paper (Table 3.3, GraphSAGE, 8 workers): DGS -24.05% (Reddit), -24.55% "
    "(products), -28.33% (Amazon), -24.89% (papers) against sampling-based; "
    "NS-only cuts more than FS-only; accuracy within 0.5 point (Table 3.4)"
)
DATASETS = {
    # name: (spec, batch size, T_ex); products' spec takes --nodes
    "products": (
        "synthetic:products?nodes={nodes}&degree=20&features=100&classes=47&seed=0",
        256,
        30,
    ),
    "cora": ("planetoid:{cora}", 16, 5),
}


def _tagged(record: dict[str, Any], tags: tuple[str, ...]) -> int:
    """Bytes a record's rank sent under ``tags`` (requests and answers)."""
    by_tag = record["comm"]["by_tag"]
    return sum(v for k, v in by_tag.items() if k.removesuffix(".req") in tags)


def _windows(out: Path) -> list[dict[str, Any]]:
    """Every traffic window's record (set-up, epochs, teardown), all ranks."""
    with open(out / "metrics.jsonl") as handle:
        records = [json.loads(line) for line in handle]
    return [r for r in records if "comm" in r]


def _measure(out: Path, fixed: int) -> dict[str, Any]:
    """One finished run's figures (module docstring, part 1)."""
    ranks = epoch_records(out)
    epochs = min(len(records) for records in ranks.values())
    per_epoch = [list(zip(*ranks.values(), strict=True))[e] for e in range(epochs)]
    feature = [sum(r["extra"]["remote_bytes"] for r in e) for e in per_epoch]
    sync = [sum(_tagged(r, SYNC_TAGS) for r in e) for e in per_epoch]
    setup = sum(_tagged(r, SETUP_TAGS) for r in _windows(out))  # whenever it ran
    cpu = sum(r["extra"]["resources"]["cpu_s"] for e in per_epoch for r in e)
    explain = sum(
        r["extra"].get("dgs", {}).get("explain_cpu_s", 0.0)
        for e in per_epoch
        for r in e
    )
    last = [r["extra"]["dgs"] for r in per_epoch[-1] if "dgs" in r["extra"]]
    rows = sum(d["remote_rows"] for d in last)
    fields = summary_fields((out / "stdout.txt").read_text(), f"the run in {out}")
    at = min(fixed, epochs) - 1
    return {
        "feature_mib": statistics.mean(feature) / 2**20,
        "sync_mib": statistics.mean(sync) / 2**20,
        "setup_mib": setup / 2**20,
        "fixed_acc": per_epoch[at][0]["test_acc"],
        "best_acc": float(fields["test_acc"]),
        "tail_acc": statistics.mean(e[0]["test_acc"] for e in per_epoch[-TAIL:]),
        "explain_share": explain / cpu if cpu else 0.0,
        "dims_share": (
            sum(d["dims_share"] * d["remote_rows"] for d in last) / rows
            if rows
            else 1.0
        ),
        "epochs": epochs,
    }


def _train(argv: list[str], out: Path, timeout_s: float) -> None:
    out.mkdir(parents=True, exist_ok=True)
    stdout = cli(["train", *argv, "--out", str(out), "--overwrite"], timeout_s)
    (out / "stdout.txt").write_text(stdout)


def _bytes_and_accuracy(args: argparse.Namespace, work: Path) -> dict[str, Any]:
    results: dict[str, Any] = {}
    for dataset in args.datasets:
        spec, batch, every = DATASETS[dataset]
        spec = spec.format(nodes=args.nodes, cora=args.cora)
        for method in args.methods:
            parts = work / f"{dataset}-{method}"
            began = time.perf_counter()
            cli(
                ["partition", "--dataset", spec, "--method", method]
                + ["--parts", str(args.workers), "--out", str(parts)],
                3600,
            )
            print(f"{dataset}: {method} parts in {time.perf_counter() - began:.0f}s")
            for label, fetch, layer_nodes in _runs(args):
                name = f"{dataset} {method} {label}"
                argv = [
                    "--dataset", str(parts), "--mode", "minibatch", "--model", "sage",
                    "--hidden", "16", "--fanouts", args.fanouts,
                    "--batch-size", str(batch), "--epochs", str(args.epochs),
                    "--eval-every", "1", "--seed", "0", "--workers",
                    str(args.workers), *FETCHES[fetch],
                ]  # fmt: skip
                if fetch in EXPLAINED:
                    argv += ["--explain-every", str(every)]
                if layer_nodes is not None:
                    argv += ["--layer-nodes", str(layer_nodes)]
                began = time.perf_counter()
                try:
                    _train(
                        argv, work / "runs" / name.replace(" ", "-"), args.run_timeout
                    )
                    figures = _measure(
                        work / "runs" / name.replace(" ", "-"), args.fixed_epochs
                    )
                except (RunFailed, OSError, KeyError, ValueError) as error:
                    print(f"  {name}: FAILED\n{error}", flush=True)
                    results[name] = None
                    continue
                figures["wall_s"] = time.perf_counter() - began
                results[name] = figures
                print(f"  {name}: {_row(figures)}", flush=True)
    return results


def _runs(args: argparse.Namespace) -> list[tuple[str, str, int | None]]:
    """``(label, fetch, layer nodes)`` per run on one set of parts: the
    layer-wise samplers once per ``--layer-nodes`` value (labelled
    ``fastgcn@N`` where there are several)."""
    runs: list[tuple[str, str, int | None]] = []
    for fetch in args.fetches:
        if fetch not in LAYERWISE:
            runs.append((fetch, fetch, None))
            continue
        many = len(args.layer_nodes) > 1
        for n in args.layer_nodes:
            runs.append((f"{fetch}@{n}" if many else fetch, fetch, n))
    return runs


def _row(f: dict[str, Any]) -> str:
    return (
        f"features {f['feature_mib']:.2f} MiB/ep, syncs {f['sync_mib']:.3f} MiB/ep, "
        f"setup {f['setup_mib']:.2f} MiB, acc {f['fixed_acc']:.4f} (fixed) "
        f"{f['best_acc']:.4f} (best) {f['tail_acc']:.4f} (last {TAIL}), "
        f"explainer {100 * f['explain_share']:.1f}% of CPU, "
        f"dims {f['dims_share']:.2f}, {f['wall_s']:.0f}s"
    )


def _report(args: argparse.Namespace, results: dict[str, Any]) -> dict[str, Any]:
    ratios: dict[str, Any] = {}
    print(
        f"\n{'run':34s} {'feat MiB/ep':>11s} {'sync MiB/ep':>11s} {'setup MiB':>9s} "
        f"{'vs uniform':>10s} {'acc@fixed':>9s} {'acc best':>8s} {'Δ pt':>6s} "
        f"{'acc tail':>8s} {'Δ tail':>6s} "
        f"{'expl CPU':>8s}"
    )
    for dataset in args.datasets:
        for method in args.methods:
            base = results.get(f"{dataset} {method} uniform")
            for label, _, _ in _runs(args):
                name = f"{dataset} {method} {label}"
                f = results.get(name)
                if f is None:
                    print(f"{name:34s} FAILED")
                    continue
                total = f["feature_mib"] + f["sync_mib"]
                cut = delta = tail = None
                if base is not None:
                    base_total = base["feature_mib"] + base["sync_mib"]
                    cut = total / base_total - 1 if base_total else None
                    delta = 100 * (f["best_acc"] - base["best_acc"])
                    tail = 100 * (f["tail_acc"] - base["tail_acc"])
                ratios[name] = {
                    "bytes_vs_uniform": cut,
                    "acc_points": delta,
                    "tail_points": tail,
                }
                print(
                    f"{name:34s} {f['feature_mib']:11.2f} {f['sync_mib']:11.3f} "
                    f"{f['setup_mib']:9.2f} "
                    f"{'-' if cut is None else f'{100 * cut:+9.1f}%':>10s} "
                    f"{f['fixed_acc']:9.4f} {f['best_acc']:8.4f} "
                    f"{'-' if delta is None else f'{delta:+6.2f}':>6s} "
                    f"{f['tail_acc']:8.4f} "
                    f"{'-' if tail is None else f'{tail:+6.2f}':>6s} "
                    f"{100 * f['explain_share']:7.1f}%"
                )
    print(
        "feat: remote feature bytes (requests and answers), all ranks, mean per "
        "epoch; sync: dgs.bias / layer.norms per epoch; setup: once a run, the "
        "halo rows DGS's first round pulls (kv.explain) / FastGCN's all-reduce;"
        "\nvs uniform: (feat + sync) "
        "against uniform on the same parts; Δ pt: best-epoch test accuracy minus "
        f"uniform's, points; acc tail: mean test accuracy of the last {TAIL} "
        "epochs (Δ tail: minus uniform's); expl CPU: explainer CPU / the "
        "workers' CPU.\n" + PAPER
    )
    return ratios


def _speed(args: argparse.Namespace, work: Path) -> dict[str, Any]:
    spec = DATASETS["products"][0].format(nodes=args.nodes, cora=args.cora)
    parts = work / "speed-metis"
    cli(
        ["partition", "--dataset", spec, "--method", "metis", "--parts", "2"]
        + ["--out", str(parts)],
        3600,
    )
    rates: dict[str, list[float]] = {"uniform": [], "dgs": []}
    splits: dict[str, list[dict[str, float]]] = {"uniform": [], "dgs": []}
    order = ["uniform", "dgs"]
    with ShapedNetwork(rate_mbit=args.rate_mbit) as net:
        shaper_check(net, args.rate_mbit)
        for fetch in order + order[::-1]:
            argv = [
                "--dataset", str(parts), "--mode", "minibatch", "--model", "sage",
                "--hidden", "16", "--fanouts", args.fanouts, "--batch-size",
                str(DATASETS["products"][1]), "--epochs", str(args.speed_epochs),
                "--seed", "0", "--workers", "2", "--threads", "1", "--quiet",
                *FETCHES[fetch],
            ]  # fmt: skip
            if fetch == "dgs":
                argv += ["--explain-every", str(DATASETS["products"][2])]
            out = work / "speed" / f"{fetch}-{len(rates[fetch])}"
            summary, wall = train_run(net, argv, out, args.run_timeout)
            rates[fetch].append(float(summary["seeds_per_s"]))
            splits[fetch].append(_split(out))
            print(
                f"  {fetch}: {rates[fetch][-1]:.0f} seeds/s ({wall:.0f}s); per "
                f"epoch: {_split_text(splits[fetch][-1])}",
                flush=True,
            )
    ratio = statistics.median(rates["dgs"]) / statistics.median(rates["uniform"])
    for fetch, runs in splits.items():
        medians = {k: statistics.median(r[k] for r in runs) for k in SPLIT}
        print(f"{fetch} per epoch (median of runs): {_split_text(medians)}")
    print(
        f"\nseeds/s, 2 workers, {args.rate_mbit:g} Mbit/s shared: uniform "
        f"{statistics.median(rates['uniform']):.0f}, dgs "
        f"{statistics.median(rates['dgs']):.0f}: dgs / uniform {ratio:.2f}x "
        "(paper: 1.10-1.25x over random on 8 V100s)"
    )
    return {"seeds_per_s": rates, "dgs_over_uniform": ratio, "split": splits}


SPLIT = {  # the speed part's per-epoch split: name -> the record's fields
    "epoch": ("time",),
    "train": ("forward_s", "backward_s"),
    "sync": ("sync_s",),
    "wait": ("wait_s", "sample_s", "fetch_s"),
    "sample busy": ("sample_busy_s",),
    "fetch busy": ("fetch_busy_s",),
    "explain cpu": ("explain_cpu_s",),
}


def _split(out: Path) -> dict[str, float]:
    """Where a speed run's epochs went: per field of :data:`SPLIT`, the
    median over epochs after the first of the ranks' mean seconds (``epoch``:
    wall time; ``wait``: the trainer's, for batches not yet made; ``busy``:
    the loader's and the trainer's making them; ``explain cpu``: DGS's)."""
    ranks = list(epoch_records(out).values())
    walls = [r["time"] for r in ranks[0]]
    split: dict[str, float] = {}
    for name, fields in SPLIT.items():
        per_epoch = []
        for e in range(1, min(len(r) for r in ranks)):
            if name == "epoch":
                per_epoch.append(walls[e] - walls[e - 1])
                continue
            values = [_fields(r[e], fields) for r in ranks]
            per_epoch.append(statistics.mean(values))
        split[name] = statistics.median(per_epoch) if per_epoch else 0.0
    return split


def _fields(record: dict[str, Any], fields: tuple[str, ...]) -> float:
    where = {**record["times"], **record["extra"], **record["extra"].get("dgs", {})}
    return sum(float(where.get(f, 0.0)) for f in fields)


def _split_text(split: dict[str, float]) -> str:
    return ", ".join(f"{name} {seconds:.2f}s" for name, seconds in split.items())


def _bench(args: argparse.Namespace, work: Path, started: float) -> int:
    payload: dict[str, Any] = {"args": vars(args)}
    results = _bytes_and_accuracy(args, work)
    payload["runs"] = results
    payload["ratios"] = _report(args, results)
    if args.speed:
        payload["speed"] = _speed(args, work)
    print(f"\nbenchmark wall time {time.perf_counter() - started:.0f}s")
    if args.json:
        write_figures(args.json, payload)
    return 1 if any(v is None for v in results.values()) else 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=200_000)
    parser.add_argument(
        "--cora",
        default=str(Path(__file__).resolve().parents[2] / "shared/data/planetoid/cora"),
    )
    parser.add_argument("--datasets", default="products,cora")
    parser.add_argument("--methods", default="metis,chunk,random")
    parser.add_argument("--fetches", default=",".join(FETCHES))
    parser.add_argument("--epochs", type=int, default=30)
    parser.add_argument("--fixed-epochs", type=int, default=10)
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--fanouts", default="10,25")
    parser.add_argument(
        "--layer-nodes",
        default="1024",
        help="fastgcn and ladies: nodes per layer, a comma list (one run each)",
    )
    parser.add_argument(
        "--speed", action="store_true", help="also part 2 (needs ip netns)"
    )
    parser.add_argument("--speed-epochs", type=int, default=6)
    parser.add_argument("--rate-mbit", type=float, default=1000.0)
    parser.add_argument("--run-timeout", type=float, default=3600.0)
    parser.add_argument(
        "--quick", action="store_true", help="20000 nodes, 4 epochs, metis"
    )
    parser.add_argument("--keep", action="store_true")
    parser.add_argument("--json")
    args = parser.parse_args(argv)
    if args.quick:
        args.nodes, args.epochs, args.fixed_epochs, args.speed_epochs = 20_000, 4, 2, 2
        args.methods = "metis"
    args.datasets = comma_list(parser, "--datasets", args.datasets, str)
    args.methods = comma_list(parser, "--methods", args.methods, str)
    args.fetches = comma_list(parser, "--fetches", args.fetches, str)
    args.layer_nodes = comma_list(parser, "--layer-nodes", args.layer_nodes, int)
    if min(args.layer_nodes) < 1 or len(set(args.layer_nodes)) < len(args.layer_nodes):
        parser.error(
            f"--layer-nodes: expected distinct integers >= 1: {args.layer_nodes}"
        )
    for name, known in (("datasets", DATASETS), ("fetches", FETCHES)):
        unknown = [v for v in getattr(args, name) if v not in known]
        if unknown:
            parser.error(f"--{name}: unknown {unknown}; known: {list(known)}")
    for name in (
        "nodes",
        "epochs",
        "fixed_epochs",
        "workers",
        "speed_epochs",
    ):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')}: expected >= 1")
    if "uniform" not in args.fetches:
        parser.error("--fetches: the ratios need uniform")
    if args.speed:
        usable, why = netns_available()
        if not usable:
            parser.error(f"--speed: needs a shaped network namespace: {why}")
    return in_work_folder("graphwire-dgs-", args, _bench)


if __name__ == "__main__":
    sys.exit(main())
