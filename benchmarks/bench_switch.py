"""SwitchGNN's in-network aggregation against halo and G3: bytes and time.

python benchmarks/bench_switch.py [--nodes 100000] [--epochs 4]
                                  [--workers 2,4] [--graphs synthetic,cora]
                                  [--num-layers 2] [--switch-timeout 1]
                                  [--rate-mbit 1000] [--unshaped] [--jobs 1]
                                  [--quick] [--only NAME [NAME ...]]
                                  [--json PATH]

On the synthetic products-like graph (F=100, 47 classes) and on Cora, with 2
and 4 workers of one thread each on METIS parts (partitioned once per worker
count, before any run), it trains a GCN (2 layers, hidden 16) once per
variant, every variant with the same seed:

- ``halo`` and ``g3`` (``--exchange halo|g3``): host-based, each boundary
  row once to each remote part that reads it;
- ``Straw-UL``: ``--exchange switch --switch-mb 0 --switch-blocks none
  --switch-order random`` (the strawman with unlimited aggregators);
- ``Straw-M``: the same at ``--switch-mb M`` (M = 1, 10, 100): a row that
  finds no free aggregator is forwarded raw to its owner;
- ``SwitchGNN-M``: ``--switch-mb M --switch-blocks multilevel
  --switch-order gamr`` (blocks that fit the memory, GAMR order);
- ``Straw-small`` and ``SwitchGNN-small``: at a memory sized by Straw-UL's
  run to hold a tenth of the rows it uploaded (pool rows = mem /
  (ceil(4F/128) * 128) at the first exchanged layer's width F), which
  matters on graphs that 10 MiB holds whole.

Every switch run passes ``--switch-timeout`` (default train's 1 s, which
doubles at each timeout within a block): with the emulated switch sharing
two cores with the workers a stall is common, and a timeout starts fetches
and resends that add bytes; the table's ``t/o`` column counts them.

Per variant it prints, from rank 0's per-epoch records in ``metrics.jsonl``
(``comm.by_rank`` and ``extra.switch`` hold every rank's), the mean over
epochs of the rows on the workers' links: ``fwd.*`` and ``bwd.*`` (to and
from the switch, or between hosts), sent plus received, summed over ranks;
for a switch run also every byte on its links (``extra.switch`` up plus
down: rows, headers, IDs, acknowledgements), the switch's aggregator pool
(rows of the exchanged width), its peak and mean occupancy, the rows it
forwarded raw (overflow) and the blocks per layer; and the epoch time
(rank 0's forward, backward and gradient sync, median over epochs 1..) with
its ratio to halo's. Then, per graph and worker count: the paper's volume
formula beside the measurement (Straw-UL against halo, 1 - 1/mean|R(v)|,
mean|R(v)| = the parts' halo rows / boundary rows, read from each part's
``halo_nid.npy``); SwitchGNN's rows against Straw's at each memory; the
overflow at the small memory; and at 2 workers the time ratios of halo, g3,
Straw-UL and SwitchGNN-small.

The 2-worker runs (one core each) share one loopback shaped to
``--rate-mbit`` by ``tbf`` (the switch, started by rank 0, sits on it too);
the 4-worker runs are unshaped. ``--unshaped`` runs everything outside
network namespaces. ``--quick`` (the test's) runs halo and Straw-UL on Cora
at 3 workers, 2 epochs, unshaped, both at once (``--jobs``: each run spends
most of its seconds importing torch in its processes, on half the cores).
A failing variant is printed with its command and error; the others still
run.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict
from pathlib import Path
from typing import Any

import numpy as np

from graphwire.cli import main as graphwire_main
from graphwire.commands.bench import run_script
from graphwire.testing.netns import ShapedNetwork, netns_available

sys.path.insert(0, str(Path(__file__).resolve().parent))
from shaped_bench import (  # noqa: E402
    TIMEOUTS,
    RunFailed,
    add_run_flags,
    check_flags,
    comma_list,
    in_work_folder,
    prepare_graph,
    shaper_check,
    train_runs,
    worker_counts,
    write_figures,
)
from switch_report import (  # noqa: E402
    LEGEND,
    Runs,
    print_checks,
    print_table,
    result_of,
)

MEMORIES = (1, 10, 100)  # MiB: the paper's 10 and 100 MB, and a tenth of 10
SMALL_SHARE = 10  # the small memory holds 1/10 of the boundary rows
VARIANTS = (
    "halo",
    "g3",
    "Straw-UL",
    *(f"Straw-{m}MB" for m in MEMORIES),
    "Straw-small",
    *(f"SwitchGNN-{m}MB" for m in MEMORIES),
    "SwitchGNN-small",
)
QUICK_VARIANTS = ("halo", "Straw-UL")
GRAPHS = ("synthetic", "cora")
TIMED_WORKERS = 2  # one core each: more workers than cores time the CPU
CORA = Path(__file__).resolve().parents[2] / "shared" / "data" / "planetoid" / "cora"
MIB = 2**20

FULL = {"epochs": 4, "workers": "2,4", "graphs": "synthetic,cora", "jobs": 1}
QUICK = {"epochs": 2, "workers": "3", "graphs": "cora", "jobs": 2}
MINIMUMS = {"nodes": 100, "features": 1, "epochs": 2, "num_layers": 2, "jobs": 1}


# ------------------------------------------------------------------ runs
def variant_flags(name: str, small_mb: float | None, timeout_s: float) -> list[str]:
    """The ``graphwire train`` flags of variant ``name``.

    Raises:
        RunFailed: a ``-small`` variant without a small memory (no Straw-UL).
    """
    if name in ("halo", "g3"):
        return ["--exchange", name]
    kind, memory = name.split("-", 1)
    if memory == "small" and small_mb is None:
        raise RunFailed(f"{name}: no small memory (it comes from Straw-UL's run)")
    sizes = {"UL": 0.0, "small": small_mb}
    mib = sizes[memory] if memory in sizes else float(memory.removesuffix("MB"))
    blocks, order = ("none", "random") if kind == "Straw" else ("multilevel", "gamr")
    return [
        *("--exchange", "switch", "--switch-mb", repr(mib)),
        *("--switch-blocks", blocks, "--switch-order", order),
        *("--switch-timeout", f"{timeout_s:g}"),
    ]


def parts_rows(folder: Path) -> tuple[int, int]:
    """``(halo rows, boundary rows)`` of a partitioned graph: the sum over
    parts of the rows each reads from the others (the sum of |R(v)|), and
    those rows counted once each."""
    halos = [np.load(f) for f in sorted(folder.glob("part_*/halo_nid.npy"))]
    if not halos:
        raise RunFailed(f"{folder}: no part_*/halo_nid.npy")
    return sum(h.size for h in halos), int(np.unique(np.concatenate(halos)).size)


class Direct:
    """What ``train_runs`` asks of a ShapedNetwork, outside any namespace."""

    def __init__(self) -> None:
        self.procs: list[subprocess.Popen[Any]] = []

    def popen(self, command: list[str], **kwargs: Any) -> subprocess.Popen[Any]:
        proc = subprocess.Popen(command, **kwargs)
        self.procs.append(proc)
        return proc

    def pids(self) -> list[int]:
        return [p.pid for p in self.procs if p.poll() is None]


@contextmanager
def network(args: argparse.Namespace, workers: int) -> Iterator[Any]:
    """Where the runs at ``workers`` go: the shaped loopback at TIMED_WORKERS,
    an unshaped namespace otherwise, no namespace under ``--unshaped``."""
    if args.unshaped:
        yield Direct()
        return
    rate = args.rate_mbit if workers == TIMED_WORKERS else None
    with ShapedNetwork(rate_mbit=rate) as net:
        if rate is not None:
            shaper_check(net, rate)
        yield net


def _prepare(args: argparse.Namespace, work: Path) -> None:
    """The graphs' METIS parts, once per worker count. Cora's are made in
    this process: a ``graphwire partition`` child would spend more seconds
    importing than partitioning."""
    if "synthetic" in args.graphs:
        jobs = [("metis", w, f"synthetic-{w}") for w in args.workers]
        prepare_graph(args, work, jobs)
    if "cora" in args.graphs:
        for workers in args.workers:
            start = time.perf_counter()
            argv = ["partition", "--dataset", f"planetoid:{args.cora}", "--quiet"]
            argv += ["--method", "metis", "--parts", str(workers)]
            argv += ["--out", str(work / f"cora-{workers}")]
            with contextlib.redirect_stdout(io.StringIO()) as said:
                code = graphwire_main(argv)
            if code:
                raise RunFailed(f"`graphwire {' '.join(argv)}` exited {code}:\n{said}")
            print(
                f"partitioned Cora with metis into {workers} parts in "
                f"{time.perf_counter() - start:.1f}s",
                flush=True,
            )


def _run_batch(
    args: argparse.Namespace, work: Path, net: Any, runs: Runs, batch: list[str]
) -> None:
    """The variants of ``batch`` at once on ``runs``' graph and worker count;
    if one fails, each alone again, to tell which."""
    dataset = work / f"{runs.graph}-{runs.workers}"
    base = ["--model", "gcn", "--layers", str(args.num_layers), "--quiet"]
    base += ["--epochs", str(args.epochs), "--threads", "1", "--seed", "0"]
    base += ["--timeout", f"{args.collective_timeout:g}", "--dataset", str(dataset)]
    base += ["--workers", str(runs.workers)]
    argvs, outs = {}, {}
    for variant in batch:
        try:
            small_mb = runs.small and runs.small[0]
            flags = variant_flags(variant, small_mb, args.switch_timeout)
        except RunFailed as error:
            runs.failures[variant] = str(error)
            continue
        argvs[variant] = [*base, *flags]
        outs[variant] = work / f"run-{runs.graph}-{runs.workers}w-{variant.lower()}"
    if not argvs:
        return
    try:
        ended = train_runs(net, [*argvs.values()], [*outs.values()], args.run_timeout)
        done = {v: result_of(*e, outs[v]) for v, e in zip(argvs, ended, strict=True)}
    except (RunFailed, OSError, KeyError, ValueError, IndexError) as error:
        if len(argvs) > 1:
            for variant in argvs:
                shutil.rmtree(outs[variant], ignore_errors=True)
                _run_batch(args, work, net, runs, [variant])
            return
        (variant,) = argvs
        runs.failures[variant] = str(error)
        print(f"  {runs.graph} {runs.workers}w {variant}: FAILED\n{error}", flush=True)
        return
    for variant, result in done.items():
        runs.results[variant] = result
        print(
            f"  {runs.graph} {runs.workers}w {variant:16s} rows "
            f"{result.train_bytes / MIB:8.3f} MiB/ep epoch {result.epoch_s:.3f}s "
            f"wall {result.wall_s:.0f}s",
            flush=True,
        )


def _run_graph(
    args: argparse.Namespace, work: Path, net: Any, graph: str, workers: int
) -> Runs:
    """Every selected variant on one graph and worker count, ``--jobs`` at a
    time, in VARIANTS' order; the ``-small`` ones after the others, sized by
    Straw-UL's run."""
    runs = Runs(graph, workers, *parts_rows(work / f"{graph}-{workers}"))
    for small in (False, True):
        if small:
            runs.size_small(SMALL_SHARE)
        wave = [v for v in args.only if v.endswith("-small") == small]
        for start in range(0, len(wave), args.jobs):
            _run_batch(args, work, net, runs, wave[start : start + args.jobs])
    return runs


def _bench(args: argparse.Namespace, work: Path, started: float) -> int:
    _prepare(args, work)
    names = {"synthetic": f"synthetic {args.nodes:,} nodes F={args.features}"}
    names["cora"] = "Cora 2,708 nodes"
    done: list[Runs] = []
    for workers in args.workers:
        with network(args, workers) as net:
            done += [_run_graph(args, work, net, g, workers) for g in args.graphs]
    at_once = f", {args.jobs} runs at once (times: CPU sharing)" * (args.jobs > 1)
    print(
        f"\nGCN ({args.num_layers} layers, hidden 16), METIS parts, 1 thread per "
        f"worker on {os.cpu_count()} CPUs, {args.epochs} epochs, switch timeout "
        f"{args.switch_timeout:g}s{at_once}; load average now "
        f"{os.getloadavg()[0]:.1f}"
    )
    for runs in done:
        shaped = runs.workers == TIMED_WORKERS and not args.unshaped
        link = f"{args.rate_mbit:g} Mbit/s shared loopback" if shaped else "unshaped"
        print_table(
            f"{names[runs.graph]}, {runs.workers} workers, {link}", args.only, runs
        )
    print(LEGEND + "\n")
    for runs in done:
        label = f"{runs.graph}, {runs.workers} workers"
        label += ", unshaped" * args.unshaped
        print_checks(label, runs, timed=runs.workers == TIMED_WORKERS)
    failed = {
        f"{runs.graph} {runs.workers} {variant}": error
        for runs in done
        for variant, error in runs.failures.items()
    }
    if failed:
        print("\nfailed variants (command and error):")
        for key, error in failed.items():
            print(f"--- {key}\n{error}")
    if args.json:
        args_out = {
            k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()
        }
        write_figures(args.json, {"args": args_out, "runs": [asdict(r) for r in done]})
    print(f"\nbench_switch took {time.perf_counter() - started:.0f}s")
    return 1 if failed else 0


# ------------------------------------------------------------------ flags
def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    parser.add_argument(
        "--nodes",
        type=int,
        default=100_000,
        help="nodes of the synthetic graph (default 100000)",
    )
    parser.add_argument(
        "--features", type=int, default=100, help="input features F (default 100)"
    )
    parser.add_argument(
        "--epochs", type=int, help="epochs per run (default 4, --quick 2)"
    )
    parser.add_argument(
        "--workers",
        help=f"worker counts, each >= 2 (default 2,4, --quick 3; {TIMED_WORKERS} "
        "runs shaped and timed)",
    )
    parser.add_argument(
        "--graphs", help="synthetic, cora or both (default both, --quick cora)"
    )
    parser.add_argument(
        "--cora", default=str(CORA), help=f"Cora's planetoid spec path (default {CORA})"
    )
    parser.add_argument(
        "--num-layers", type=int, default=2, help="GCN layers (train --layers; 2)"
    )
    parser.add_argument(
        "--switch-timeout",
        type=float,
        default=1.0,
        help="train --switch-timeout of every switch run, seconds (default 1)",
    )
    parser.add_argument(
        "--rate-mbit",
        type=float,
        default=1000.0,
        help="rate of the loopback the 2-worker runs share, Mbit/s (default 1000)",
    )
    parser.add_argument(
        "--jobs",
        type=int,
        help="variants run at once (default 1; --quick 2: there the imports of "
        "each run's processes, not its epochs, take the time)",
    )
    parser.add_argument(
        "--unshaped",
        action="store_true",
        help="run everything outside network namespaces, unshaped (--quick does)",
    )
    parser.add_argument(
        "--only",
        nargs="+",
        metavar="NAME",
        help=f"only these variants, of {', '.join(VARIANTS)} (default all; "
        "--quick " + ", ".join(QUICK_VARIANTS) + ")",
    )
    parser.add_argument("--json", metavar="PATH", help="also write the figures")
    add_run_flags(parser)
    args = parser.parse_args(argv)
    for name, value in (QUICK if args.quick else FULL).items():
        if getattr(args, name) is None:
            setattr(args, name, value)
    args.unshaped = args.unshaped or args.quick
    check_flags(parser, args, MINIMUMS, ("rate_mbit", "switch_timeout", *TIMEOUTS))
    graphs = args.graphs
    args.workers = worker_counts(parser, args.workers)
    args.graphs = comma_list(parser, "--graphs", graphs, str)
    if not set(args.graphs) <= set(GRAPHS) or len(set(args.graphs)) < len(args.graphs):
        parser.error(f"--graphs: expected synthetic, cora or both, got {graphs}")
    unknown = sorted(set(args.only or ()) - set(VARIANTS))
    if unknown:
        parser.error(
            f"--only: no variant named {unknown}; the names are {list(VARIANTS)}"
        )
    # In VARIANTS' order: Straw-UL runs before the -small ones it sizes.
    chosen = set(args.only or (QUICK_VARIANTS if args.quick else VARIANTS))
    args.only = [v for v in VARIANTS if v in chosen]
    if any(v.endswith("-small") for v in chosen) and "Straw-UL" not in chosen:
        parser.error("--only: the -small variants need Straw-UL (it sizes them)")
    cora = Path(args.cora)
    if "cora" in args.graphs and not (cora.parent / f"ind.{cora.name}.x").exists():
        parser.error(f"--cora {cora}: no {cora.parent / f'ind.{cora.name}.x'}")
    if not args.unshaped:
        available, why = netns_available()
        if not available:
            print(
                f"bench_switch: needs network namespaces (run as root): {why}",
                file=sys.stderr,
            )
            return 1
    return in_work_folder("gw-bench-switch-", args, _bench)


if __name__ == "__main__":
    raise SystemExit(run_script(main))
