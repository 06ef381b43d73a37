"""ByteGNN's schedules and block partitioning against the serial loader and METIS.

python benchmarks/bench_bytegnn.py [--nodes 200000] [--epochs 4]
                                   [--schedules serial,fifo,bytegnn]
                                   [--partitions metis,blocks] [--threads 2]
                                   [--tasks node,link] [--link-nodes 40000]
                                   [--rate-mbit 1000] [--no-shaped]
                                   [--only-shaped] [--prefetch 4] [--quick]
                                   [--json PATH]

In one run, on the synthetic products-like graph (``--nodes``, F = 100,
degree 20), split into 2 parts by each of ``--partitions``:

1. **the parts**: the edge cut, the train/val/test balance and the remote
   2-hop accesses of an epoch's training nodes (the figure ByteGNN's
   partitioner minimises) of each, blocks beside METIS;
2. **the schedules**: 2 workers of one core each (``--threads 1``) train
   GraphSAGE (fan-outs 10,25, batch ``--batch-size``) with ``--fetch
   on-demand --schedule S`` for each of ``--schedules`` (``--sampler-threads
   --threads``), on each partition, unshaped and, unless ``--no-shaped``,
   inside a namespace whose loopback is shaped to ``--rate-mbit`` (one
   ``tbf`` both workers share); the list run forwards then backwards. Per
   run: seeds/s (the summary's median over the epochs after the first), the
   workers' CPU utilisation (CPU seconds over wall seconds, both ranks'
   mean, of 100% a core), and the schedule's mean queue of batches waiting
   and DAGs in flight. Ratios against ``serial`` on the same parts and link.
   Each of ``--tasks``: ``node`` (supervised, the parts of part 1) and
   ``link`` (unsupervised: ``--task link``, one positive and one negative
   per seed, three branches per batch, on a graph of ``--link-nodes``
   (default 40,000) made as the other: an epoch's seeds are all its nodes,
   not 8% of them; its parts are of the graph without its held-out edges,
   split by the same method).

ByteGNN's figures (seed ``002``, Fig. 17) are on 4 machines of 48 cores over
25 Gbit/s against GraphLearn, Euler and DistDGL; this is 2 cores: the shape
(bytegnn >= 1.2x serial, with higher CPU use) is compared, not the figures.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

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

from graphwire.graph.graph import Graph  # noqa: E402
from graphwire.graph.links import split_links  # noqa: E402
from graphwire.graph.native import load_graph  # noqa: E402
from graphwire.graph.synthetic import ProductsConfig, products_graph  # noqa: E402
from graphwire.partition import (  # noqa: E402
    PartitionStats,
    load_partition_meta,
    write_partitioned,
)
from graphwire.partition.base import Partition  # noqa: E402
from graphwire.partition.blocks import (  # noqa: E402
    remote_khop_accesses,
    undirected_cut,
)
from graphwire.run.partitioning import partition_graph  # noqa: E402
from graphwire.testing.netns import ShapedNetwork, netns_available  # noqa: E402

SCHEDULES = ("serial", "fifo", "bytegnn")
TASKS = ("node", "link")
PARTITIONS = ("metis", "blocks")
PAPER = (
    "paper (Fig. 17, 4 machines x 48 cores, 25 Gbit/s): ByteGNN 2.1-3.5x "
    "DistDGL's throughput on ogbn-products (supervised), 3-6x its CPU use"
)


def _parts_report(args: argparse.Namespace, work: Path) -> dict[str, Any]:
    """Part 1: each partition's cut, balance and remote 2-hop accesses."""
    graph = load_graph(work / "graph")
    assert graph.train_idx is not None  # the synthetic graph has its splits
    train = graph.train_idx.numpy()
    out: dict[str, Any] = {}
    for method in args.partitions:
        assignment = _assignment(work / f"parts-{method}", graph.num_nodes)
        partition = Partition(assignment=assignment, num_parts=2, method=method)
        stats = PartitionStats.compute(graph, partition)
        balance = {
            k.removeprefix("num_"): v
            for k, v in stats.imbalance.items()
            if k in ("num_nodes", "num_train", "num_val", "num_test")
        }
        figures: dict[str, Any] = {
            "edge_cut": undirected_cut(graph, assignment.numpy()),
            "remote_2hop": remote_khop_accesses(graph, assignment.numpy(), train, 2),
            "imbalance": balance,
        }
        out[method] = figures
        print(
            f"{method:7s} edge cut {figures['edge_cut']:,}, remote 2-hop accesses "
            f"of an epoch's training nodes {figures['remote_2hop']:,}, balance "
            + ", ".join(f"{k} {v:.3f}" for k, v in balance.items()),
            flush=True,
        )
    if "metis" in out and "blocks" in out:
        ratio = out["blocks"]["remote_2hop"] / max(1, out["metis"]["remote_2hop"])
        print(f"blocks / METIS remote 2-hop accesses: {ratio:.2f}x (target <= 1)")
        out["blocks_over_metis"] = ratio
    return out


def _assignment(folder: Path, num_nodes: int) -> Any:
    """int64 [N]: the part of every node (original IDs), from a partitioned
    folder (each part's ``orig_nid`` lists its owned nodes)."""
    import torch

    meta = load_partition_meta(folder)
    assignment = torch.full((num_nodes,), -1, dtype=torch.int64)
    for part in range(int(meta["num_parts"])):
        orig = np.load(folder / f"part_{part}" / "orig_nid.npy")
        assignment[torch.from_numpy(orig.astype(np.int64))] = part
    return assignment


def _link_parts(work: Path, method: str, graph: Graph) -> Path:
    """``graph`` without its held-out edges, split by ``method`` into 2
    parts, the held-out pairs beside them (as a ``--task link`` run writes
    its own)."""
    split = split_links(graph, seed=0)
    params = {"hops": 2, "compare": False} if method == "blocks" else None
    partition, stats, _ = partition_graph(split.graph, method, 2, 0, True, params)
    folder = work / f"parts-link-{method}"
    write_partitioned(
        split.graph,
        partition,
        folder,
        stats=stats,
        node_order="rcm",
        held_out=(split.val, split.test),
    )
    return folder


def _argv(args: argparse.Namespace, parts: Path, schedule: str, task: str) -> list[str]:
    argv = [
        "--dataset", str(parts), "--mode", "minibatch", "--model", "sage",
        "--fanouts", "10,25", "--batch-size", str(args.batch_size),
        "--epochs", str(args.epochs), "--seed", "0", "--workers", "2",
        "--threads", "1", "--quiet", "--fetch", "on-demand",
        "--schedule", schedule, "--prefetch", str(args.prefetch),
    ]  # fmt: skip
    if schedule != "serial":
        argv += ["--sampler-threads", str(args.threads)]
    if task == "link":
        argv += ["--task", "link"]
    return argv


def _figures(summary: dict[str, str], out: Path) -> dict[str, float]:
    ranks = list(epoch_records(out).values())
    after = [records[1:] or records for records in ranks]
    cpu = [
        sum(r["extra"]["resources"]["cpu_s"] for r in rs)
        / max(1e-9, sum(r["extra"]["resources"]["wall_s"] for r in rs))
        for rs in after
    ]
    sched = [r["extra"].get("schedule", {}) for rs in after for r in rs]
    return {
        "seeds_per_s": float(summary["seeds_per_s"]),
        "cpu_util": 100 * statistics.mean(cpu),
        "queue": statistics.mean(s.get("queue_mean", 0.0) for s in sched),
        "inflight": statistics.mean(s.get("inflight_mean", 0.0) for s in sched),
    }


def _unshaped(argv: list[str], out: Path, timeout_s: float) -> dict[str, str]:
    out.mkdir(parents=True, exist_ok=True)
    stdout = cli(["train", *argv, "--out", str(out), "--overwrite"], timeout_s)
    return summary_fields(stdout, f"the run in {out}")


def _schedules(args: argparse.Namespace, work: Path) -> dict[str, Any]:
    """Part 2: seeds/s, CPU use and queues of each schedule (docstring)."""
    results: dict[str, list[dict[str, float]]] = {}
    order = list(args.schedules) + list(args.schedules)[::-1]
    links = ([] if args.only_shaped else ["unshaped"]) + (
        [] if args.no_shaped else ["shaped"]
    )
    for link in links:
        net = ShapedNetwork(rate_mbit=args.rate_mbit) if link == "shaped" else None
        try:
            if net is not None:
                net.__enter__()
                shaper_check(net, args.rate_mbit)
            for task, method in _cases(args):
                parts = work / f"parts-{method}"
                if task == "link":
                    parts = work / f"parts-link-{method}"
                for schedule in order:
                    name = f"{link} {task} {method} {schedule}"
                    out = (
                        work
                        / "runs"
                        / f"{name.replace(' ', '-')}-{len(results.get(name, []))}"
                    )
                    argv = _argv(args, parts, schedule, task)
                    began = time.perf_counter()
                    if net is None:
                        summary = _unshaped(argv, out, args.run_timeout)
                    else:
                        summary, _ = train_run(net, argv, out, args.run_timeout)
                    figures = _figures(summary, out)
                    results.setdefault(name, []).append(figures)
                    print(
                        f"  {name}: {figures['seeds_per_s']:.0f} seeds/s, CPU "
                        f"{figures['cpu_util']:.0f}%, queue {figures['queue']:.2f}, "
                        f"in flight {figures['inflight']:.2f} "
                        f"({time.perf_counter() - began:.0f}s)",
                        flush=True,
                    )
        finally:
            if net is not None:
                net.__exit__(None, None, None)
    return _report(args, links, results)


def _cases(args: argparse.Namespace) -> list[tuple[str, str]]:
    return [(task, method) for task in args.tasks for method in args.partitions]


def _report(
    args: argparse.Namespace, links: list[str], results: dict[str, list[dict]]
) -> dict[str, Any]:
    ratios: dict[str, Any] = {}
    print(
        f"\n{'run':33s} {'seeds/s':>8s} {'x serial':>8s} {'CPU %':>6s} "
        f"{'queue':>6s} {'flight':>6s}"
    )
    for link in links:
        for task, method in _cases(args):
            base = results.get(f"{link} {task} {method} serial")
            base_rate = (
                statistics.median(r["seeds_per_s"] for r in base) if base else None
            )
            for schedule in args.schedules:
                name = f"{link} {task} {method} {schedule}"
                runs = results.get(name)
                if not runs:
                    continue
                med = {k: statistics.median(r[k] for r in runs) for k in runs[0]}
                ratio = med["seeds_per_s"] / base_rate if base_rate else None
                ratios[name] = {**med, "over_serial": ratio}
                print(
                    f"{name:33s} {med['seeds_per_s']:8.0f} "
                    f"{'-' if ratio is None else f'{ratio:.2f}x':>8s} "
                    f"{med['cpu_util']:6.0f} {med['queue']:6.2f} {med['inflight']:6.2f}"
                )
    print(
        "medians of the forward and backward runs; CPU %: the workers' CPU "
        "seconds over wall seconds (100 = one core); queue: batches made and "
        "waiting for the trainer; flight: DAGs launched, not yet done.\n"
        "target: bytegnn >= 1.2x serial, with higher CPU use.\n" + PAPER
    )
    return ratios


def _bench(args: argparse.Namespace, work: Path, started: float) -> int:
    spec = (
        f"synthetic:products?nodes={args.nodes}&degree=20&features=100"
        "&classes=47&seed=0"
    )
    cli(["data", "generate", "--dataset", spec, "--out", str(work / "graph")], 3600)
    link_graph = products_graph(
        ProductsConfig(
            nodes=args.link_nodes, degree=20, features=100, classes=47, seed=0
        )
    )
    for method in args.partitions:
        began = time.perf_counter()
        cli(
            ["partition", "--dataset", str(work / "graph"), "--method", method]
            + ["--parts", "2", "--out", str(work / f"parts-{method}")],
            3600,
        )
        print(f"{method}: 2 parts in {time.perf_counter() - began:.0f}s", flush=True)
        if "link" in args.tasks:
            began = time.perf_counter()
            _link_parts(work, method, link_graph)
            print(
                f"{method}: 2 parts of the graph without its held-out edges in "
                f"{time.perf_counter() - began:.0f}s",
                flush=True,
            )
    payload: dict[str, Any] = {"args": vars(args)}
    payload["parts"] = _parts_report(args, work)
    try:
        payload["schedules"] = _schedules(args, work)
    except RunFailed as error:
        print(f"FAILED\n{error}")
        return 1
    print(f"\nbenchmark wall time {time.perf_counter() - started:.0f}s")
    if args.json:
        write_figures(args.json, payload)
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=200_000)
    parser.add_argument("--epochs", type=int, default=4)
    parser.add_argument("--batch-size", type=int, default=1000)
    parser.add_argument("--schedules", default=",".join(SCHEDULES))
    parser.add_argument("--partitions", default=",".join(PARTITIONS))
    parser.add_argument("--tasks", default=",".join(TASKS))
    parser.add_argument("--link-nodes", type=int, default=40_000)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--rate-mbit", type=float, default=1000.0)
    parser.add_argument("--no-shaped", action="store_true")
    parser.add_argument("--only-shaped", action="store_true")
    parser.add_argument(
        "--prefetch", type=int, default=4, help="batches alive at once (Q)"
    )
    parser.add_argument("--run-timeout", type=float, default=1800.0)
    parser.add_argument("--quick", action="store_true", help="20000 nodes, 2 epochs")
    parser.add_argument("--keep", action="store_true")
    parser.add_argument("--json")
    args = parser.parse_args(argv)
    if args.quick:
        args.nodes, args.epochs, args.link_nodes = 20_000, 2, 5_000
    args.schedules = comma_list(parser, "--schedules", args.schedules, str)
    args.partitions = comma_list(parser, "--partitions", args.partitions, str)
    args.tasks = comma_list(parser, "--tasks", args.tasks, str)
    for name, known in (
        ("schedules", SCHEDULES),
        ("partitions", PARTITIONS),
        ("tasks", TASKS),
    ):
        unknown = [v for v in getattr(args, name) if v not in known]
        if unknown:
            parser.error(f"--{name}: unknown {unknown}; known: {list(known)}")
    if "serial" not in args.schedules:
        parser.error("--schedules: the ratios need serial")
    if args.no_shaped and args.only_shaped:
        parser.error("--no-shaped and --only-shaped: nothing to run")
    for name in ("nodes", "epochs", "batch_size", "threads", "link_nodes", "prefetch"):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')}: expected >= 1")
    if args.epochs < 2:
        parser.error("--epochs: expected >= 2 (seeds/s leaves out the first)")
    if not args.no_shaped:
        usable, why = netns_available()
        if not usable:
            parser.error(f"shaped runs need a network namespace ({why}); --no-shaped")
    return in_work_folder("graphwire-bytegnn-", args, _bench)


if __name__ == "__main__":
    sys.exit(main())
