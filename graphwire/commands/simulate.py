"""``graphwire simulate``: strategies on a cluster bigger than this machine.

Partitions the graph (or reads a partitioned folder), traces each strategy's
training step with its real engine, and replays it on a simulated fabric:
ns-3 at packet level, or a max-min fair flow model for large sweeps::

    graphwire simulate --dataset 'synthetic:products?nodes=200000' --parts 128 \\
        --exchange halo,g3,switch --topology star --link 100Gbps --delay 2us \\
        --switch-mb 10,100 --out runs/sim

Prints per (workers, strategy): epoch time, compute, communication time per
layer, bytes sent, bytes per link (max, mean), peak switch queue, and the
aggregator's occupancy; with ``--out``, writes ``outcomes.json`` and the plots.
"""

from __future__ import annotations

import argparse
import json

from graphwire.fsutil import atomic_dir
from graphwire.graph.seeds import check_seed
from graphwire.partition.base import check_method
from graphwire.run.config import TrainConfig
from graphwire.run.console import console, print_table
from graphwire.run.outputs import check_out
from graphwire.simulate.study import SIMULATORS, Outcome, strategies
from graphwire.simulate.sweep import SweepSpec, run_sweep
from graphwire.simulate.topology import parse_delay, parse_rate, parse_topology

__all__ = ["add_flags", "run"]


def add_flags(parser: argparse.ArgumentParser) -> None:
    """``graphwire simulate``'s flags (the dataset and --quiet come from cli)."""
    add = parser.add_argument
    add("--parts", type=int, default=8, help="workers, one part each (default 8)")
    add(
        "--workers-sweep",
        metavar="N,N,...",
        help="simulate each of these worker counts instead of --parts "
        "(e.g. 32,64,96,128)",
    )
    add("--partition", default="metis", help="partitioner (default metis)")
    add(
        "--exchange",
        default="halo,g3,switch",
        help="strategies, comma-separated: any --exchange of train, plus straw "
        "(switch, random order, one block) and straw-ul (straw, unlimited "
        "memory) (default halo,g3,switch)",
    )
    add(
        "--topology",
        default="star",
        help="star, leaf-spine:LxS (e.g. leaf-spine:8x8) or shared (one "
        "medium, as the tbf-shaped loopback) (default star)",
    )
    add("--link", default="100Gbps", help="every link's rate (default 100Gbps)")
    add("--delay", default="2us", help="every link's propagation delay (default 2us)")
    add(
        "--hosts",
        type=int,
        help="hosts the fabric has (default: as many as workers); more parts "
        "than hosts is refused",
    )
    add(
        "--switch-mb",
        default="10",
        metavar="MB,MB,...",
        help="aggregator memory in MiB for switch and straw; one run each (default 10)",
    )
    add(
        "--simulator",
        default="auto",
        choices=SIMULATORS,
        help="ns3 (packets), flow (max-min fair flows), both, or auto: ns-3 "
        "up to 200k packets an epoch, else flow (default auto)",
    )
    add("--model", default="gcn", help="gcn, sage or gat (default gcn)")
    add("--layers", type=int, default=2, help="message-passing layers (default 2)")
    add("--hidden", type=int, default=128, help="hidden width (default 128)")
    add(
        "--calibrate",
        metavar="RUN",
        help="a train run's folder: per-rank compute from its metrics.jsonl",
    )
    add(
        "--compute-scale",
        type=float,
        default=1.0,
        help="multiply the compute measured here (default 1)",
    )
    add(
        "--repeats",
        type=int,
        default=2,
        help="traced steps per strategy, after a warm-up one; each rank's "
        "least compute is kept (default 2)",
    )
    add("--seed", type=int, default=0, help="partitioning and weights (default 0)")
    add("--out", help="folder for outcomes.json and the PNG plots")
    add("--overwrite", action="store_true", help="replace --out if it exists")


def _numbers(text: str, flag: str, kind: type = int) -> list:
    try:
        values = [kind(piece) for piece in text.split(",") if piece.strip()]
    except ValueError:
        raise ValueError(f"{flag} {text!r}: expected comma-separated numbers") from None
    if not values:
        raise ValueError(f"{flag}: no values")
    return values


def spec_of(args: argparse.Namespace) -> SweepSpec:
    """The sweep the flags ask for, every flag checked before any work.

    Raises:
        ValueError: naming the flag.
    """
    workers = (
        _numbers(args.workers_sweep, "--workers-sweep")
        if args.workers_sweep
        else [args.parts]
    )
    check_method(args.partition, "--partition")
    check_seed(args.seed, "--seed")
    try:
        rate = parse_rate(args.link)
        delay = parse_delay(args.delay)
        for count in workers:
            parse_topology(args.topology, count, rate, delay)
    except ValueError as error:
        raise ValueError(f"--topology/--link/--delay: {error}") from None
    if args.hosts is not None and args.hosts < 1:
        raise ValueError(f"--hosts: expected >= 1, got {args.hosts}")
    if args.repeats < 1:
        raise ValueError(f"--repeats: expected >= 1, got {args.repeats}")
    if not args.compute_scale >= 0:
        raise ValueError(f"--compute-scale: expected >= 0, got {args.compute_scale}")
    memories = _numbers(args.switch_mb, "--switch-mb", float)
    if any(mb <= 0 for mb in memories):
        raise ValueError(f"--switch-mb {args.switch_mb}: each must be above 0")
    names = [n.strip() for n in args.exchange.split(",") if n.strip()]
    try:
        chosen = strategies(names, memories)
    except ValueError as error:
        raise ValueError(f"--exchange: {error}") from None
    config = TrainConfig(
        model=args.model, num_layers=args.layers, hidden=args.hidden, seed=args.seed
    )
    if any(s.uses_switch for s in chosen) and args.model == "gat":
        raise ValueError("--exchange switch: only with --model gcn or sage, not gat")
    return SweepSpec(
        dataset=args.dataset,
        workers=tuple(workers),
        partition=args.partition,
        strategies=tuple(chosen),
        topology=args.topology,
        rate_bps=rate,
        delay_s=delay,
        config=config,
        simulator=args.simulator,
        compute_scale=args.compute_scale,
        calibrate=args.calibrate,
        hosts=args.hosts,
        seed=args.seed,
        repeats=args.repeats,
    )


def run(args: argparse.Namespace) -> int:
    spec = spec_of(args)
    if args.out:
        check_out(args.out, args.dataset, args.overwrite)
    if args.simulator in ("ns3", "both"):
        from graphwire.simulate import packet

        try:
            packet.import_ns3()  # before any work: a missing ns-3 says how
        except packet.SimulatorMissing as error:
            raise ValueError(f"--simulator {args.simulator}: {error}") from None

    def show(o: Outcome) -> None:
        if not args.quiet:
            console.print(
                f"simulated {o.label} on {o.workers} workers ({o.simulator}): "
                f"epoch {o.epoch_s * 1e3:.3f} ms"
            )

    outcomes = run_sweep(spec, show)
    title = f"{args.topology}, {args.link}, {args.delay} per link"
    print_table(
        f"simulated epoch: {title} (ms; sent and per link: MiB; queue: KiB)",
        ["strategy", "sim", "workers", "epoch", "compute", "sent"]
        + ["link max", "link mean", "queue"],
        [_row(o) for o in outcomes],
        text_columns=2,
    )
    layers = sorted({k for o in outcomes for k in o.comm_s}, key=_layer_order)
    print_table(
        "communication time per layer (ms: some message of it on the way), "
        "and the switch's aggregators",
        ["strategy", "sim", "workers", *layers, "aggregators peak/mean/pool"],
        [_layer_row(o, layers) for o in outcomes],
        text_columns=2,
    )
    if args.out:
        from graphwire.simulate.plots import write_plots

        with atomic_dir(args.out, overwrite=args.overwrite) as folder:
            (folder / "outcomes.json").write_text(
                json.dumps([o.row() for o in outcomes], indent=1) + "\n"
            )
            write_plots(outcomes, folder)
        console.print(f"outcomes and plots: {args.out}")
    return 0


def _row(o: Outcome) -> list:
    return [
        o.label,
        o.simulator,
        o.workers,
        o.epoch_s * 1e3,
        o.compute_s * 1e3,
        o.bytes / 2**20,
        o.link_max / 2**20,
        o.link_mean / 2**20,
        o.peak_queue / 2**10,
    ]


def _layer_order(key: str) -> tuple[int, str]:
    return (int(key[1:]), "") if key[1:].isdigit() else (1 << 30, key)


def _layer_row(o: Outcome, layers: list[str]) -> list:
    agg = "-"
    if o.switch:
        pool = o.switch["pool_rows"]
        agg = f"{o.switch['peak_slots']}/{o.switch['mean_slots']:g}/" + (
            "unlimited" if pool >= 1 << 60 else f"{pool}"
        )
    times = [o.comm_s[k] * 1e3 if k in o.comm_s else "-" for k in layers]
    return [o.label, o.simulator, o.workers, *times, agg]
