"""bench_simulate's checks of the simulators themselves: ``validate`` (against
a real run on a shaped loopback), ``agreement`` (ns-3 against the flow
model) and ``cc`` (rate control under background flows, ns-3).

benchmarks/ is not a package: bench_simulate puts this folder on sys.path.
"""

from __future__ import annotations

import statistics
from pathlib import Path
from typing import Any

from shaped_bench import epoch_records, shaper_check, train_run

from graphwire.simulate.background import add_background
from graphwire.simulate.flow import simulate_flows
from graphwire.simulate.replay import workload_from_traces
from graphwire.simulate.study import Strategy, strategies, summarise
from graphwire.simulate.sweep import calibrated_compute
from graphwire.simulate.topology import Topology, parse_topology
from graphwire.testing.netns import ShapedNetwork, netns_available

VALIDATE_WORKERS = 2  # one core each
# (topology, strategy, parts) run through both simulators, compute left out.
AGREEMENT = (
    ("star", "halo", 4),
    ("leaf-spine:2x2", "g3", 4),
    ("shared", "halo", 2),
    ("star", "switch", 8),
)


def validate(bench: Any) -> None:
    """Simulated against measured epoch times, 2 workers, shared shaped link."""
    args = bench.args
    rate = args.rate_mbit
    print(
        f"\n== validate: {VALIDATE_WORKERS} workers, one loopback at {rate:g} Mbit/s =="
    )
    if not netns_available():
        print("skipped: network namespaces need root (ip netns)")
        return
    folder = bench.folder("metis", VALIDATE_WORKERS)
    topology = Topology("shared", VALIDATE_WORKERS, rate * 1e6, 0.0)
    rows = {}
    with ShapedNetwork(rate_mbit=rate) as net:
        shaper_check(net, rate)
        for exchange in ("halo", "g3"):
            out = bench.work / f"run-{exchange}"
            train_run(net, _train_argv(bench, folder, exchange), out, 3600.0)
            measured = _measured_epoch(out)
            compute = calibrated_compute(str(out))
            strategy = Strategy(exchange, exchange)
            capture = bench.capture("metis", VALIDATE_WORKERS, strategy)
            workload = workload_from_traces(capture, compute_s=compute)
            result = simulate_flows(workload, topology)
            simulated = summarise(exchange, capture.ranks, workload, result).epoch_s
            rows[exchange] = {"measured_s": measured, "simulated_s": simulated}
            print(
                f"{exchange:<5} measured {measured * 1e3:9.1f} ms  simulated "
                f"{simulated * 1e3:9.1f} ms  ratio {simulated / measured:.3f}  "
                f"({'within' if abs(simulated / measured - 1) <= 0.15 else 'outside'}"
                " 15%)"
            )
    bench.figures["validate"] = rows


def _train_argv(bench: Any, folder: str, exchange: str) -> list[str]:
    config = bench.config
    return [
        *("--dataset", folder, "--workers", str(VALIDATE_WORKERS)),
        *("--exchange", exchange, "--model", config.model),
        *("--layers", str(config.num_layers), "--hidden", str(config.hidden)),
        *("--epochs", str(bench.args.epochs), "--eval-every", "1000"),
        *("--seed", str(config.seed), "--quiet"),
    ]


def _measured_epoch(out: Path) -> float:
    """The slowest rank's forward + backward + gradient sum, median over
    epochs 1.. (epoch 0 warms up)."""
    ranks = epoch_records(out)
    epochs = len(next(iter(ranks.values())))
    per_epoch = [
        max(
            sum(r[e]["times"][k] for k in ("forward_s", "backward_s", "sync_s"))
            for r in ranks.values()
        )
        for e in range(1, epochs)
    ]
    return statistics.median(per_epoch)


def agreement(bench: Any) -> None:
    """ns-3 against the flow model on the same workloads (compute left out)."""
    from graphwire.simulate.packet import ns3_available, simulate_packets

    print("\n== agreement: epoch communication time, ns-3 and the flow model ==")
    if not ns3_available():
        print("skipped: ns-3 is not installed (pip install 'graphwire[sim]')")
        return
    rows = []
    for kind, name, parts in AGREEMENT:
        (strategy,) = strategies([name], [10.0])
        topology = parse_topology(kind, parts, 1e9, 2e-6)
        capture = bench.capture("metis", parts, strategy)
        workload = workload_from_traces(
            capture, aggregator=topology.aggregator, compute_scale=0.0
        )
        ns3 = simulate_packets(workload, topology).makespan
        flow = simulate_flows(workload, topology).makespan
        rows.append({"topology": kind, "strategy": name, "ns3_s": ns3, "flow_s": flow})
        print(
            f"{kind:<16} {name:<7} {parts:>3} hosts: ns-3 {ns3 * 1e3:8.3f} ms, flow "
            f"{flow * 1e3:8.3f} ms, flow/ns-3 {flow / ns3:.3f}"
        )
    bench.figures["agreement"] = rows


def cc(bench: Any) -> None:
    """The switch's queue and the epoch under background flows, with and
    without DCQCN-like rate control (ns-3, 8 hosts, 10 Gbit/s)."""
    from graphwire.simulate.packet import ns3_available, simulate_packets

    print("\n== cc: background flows at 30% load, star, 8 hosts, 10 Gbit/s (ns-3) ==")
    if not ns3_available():
        print("skipped: ns-3 is not installed (pip install 'graphwire[sim]')")
        return
    topology = Topology("star", 8, 10e9, 2e-6)
    rows = {}
    for name in ("halo", "switch"):
        (strategy,) = strategies([name], [10.0])
        capture = bench.capture("metis", 8, strategy)
        workload = workload_from_traces(capture, aggregator=topology.aggregator)
        quiet = simulate_packets(workload, topology)
        epoch_end = quiet.makespan
        busy = add_background(workload, topology, load=0.3, until_s=epoch_end, seed=0)
        for control in (True, False):
            result = simulate_packets(busy, topology, rate_control=control)
            epoch = summarise(name, capture.ranks, busy, result).epoch_s
            key = f"{name} {'dcqcn' if control else 'no rate control'}"
            rows[key] = {
                "quiet_s": epoch_end,
                "epoch_s": epoch,
                "peak_queue": result.peak_queue_bytes,
                "ecn_marks": result.ecn_marks,
            }
            print(
                f"{key:<26} epoch {epoch * 1e3:8.3f} ms (quiet {epoch_end * 1e3:.3f}),"
                f" peak queue {result.peak_queue_bytes / 1024:8.1f} KiB, "
                f"{result.ecn_marks} ECN marks"
            )
    bench.figures["cc"] = rows


SECTIONS = {"validate": validate, "agreement": agreement, "cc": cc}
