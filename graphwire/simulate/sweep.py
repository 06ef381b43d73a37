"""`run_sweep`: every (worker count, strategy) of ``graphwire simulate``.

For each worker count the graph is partitioned once (or a partitioned folder
is read as it is), then each strategy's epoch is traced and simulated on the
topology sized to that count (:func:`simulate_strategy`). Compute per rank is
what the trace measured, times ``compute_scale``, or, with ``calibrate``, a
real run's: per rank the median over its epochs (the first left out when
there are others) of forward + backward time less the engine's communication
time, as its ``metrics.jsonl`` records them.
"""

from __future__ import annotations

import functools
import json
import statistics
import tempfile
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from graphwire.graph.datasets import load_dataset
from graphwire.graph.graph import Graph
from graphwire.partition import get_partitioner, write_partitioned
from graphwire.partition.format import is_partitioned_folder, load_partition_meta
from graphwire.run.config import TrainConfig
from graphwire.simulate.study import Outcome, Strategy, simulate_strategy
from graphwire.simulate.topology import parse_topology

__all__ = ["SweepSpec", "calibrated_compute", "run_sweep"]


@dataclass(frozen=True, kw_only=True, slots=True)
class SweepSpec:
    """What ``graphwire simulate`` was asked (its flags, parsed)."""

    dataset: str
    workers: tuple[int, ...]
    partition: str
    strategies: tuple[Strategy, ...]
    topology: str
    rate_bps: float
    delay_s: float
    config: TrainConfig
    simulator: str = "auto"
    compute_scale: float = 1.0
    calibrate: str | None = None
    hosts: int | None = None
    seed: int = 0
    repeats: int = 2


def run_sweep(
    spec: SweepSpec, on_outcome: Callable[[Outcome], None] | None = None
) -> list[Outcome]:
    """Simulate every (worker count, strategy) of ``spec``, in that order.

    Raises:
        ValueError: bad input, naming the flag (more parts than the graph's
            nodes or than the topology's hosts, a calibrating run of another
            size, a topology that cannot hold the hosts).
    """
    outcomes: list[Outcome] = []
    compute = None
    if spec.calibrate is not None:
        compute = calibrated_compute(spec.calibrate)
    # A graph (not a partitioned folder) is read or generated once for every
    # worker count.
    graph = functools.cache(functools.partial(load_dataset, spec.dataset))
    with tempfile.TemporaryDirectory(prefix="graphwire-simulate-") as scratch:
        for workers in spec.workers:
            _check_hosts(spec, workers)
            if compute is not None and len(compute) != workers:
                raise ValueError(
                    f"--calibrate {spec.calibrate}: that run had {len(compute)} "
                    f"workers, this simulation {workers}"
                )
            topology = parse_topology(
                spec.topology, workers, spec.rate_bps, spec.delay_s
            )
            folder = _parts(spec, workers, Path(scratch), graph)
            for strategy in spec.strategies:
                for outcome in simulate_strategy(
                    folder,
                    spec.config,
                    strategy,
                    topology,
                    simulator=spec.simulator,
                    compute_scale=spec.compute_scale,
                    compute_s=compute,
                    repeats=spec.repeats,
                ):
                    outcomes.append(outcome)
                    if on_outcome is not None:
                        on_outcome(outcome)
    return outcomes


def _check_hosts(spec: SweepSpec, workers: int) -> None:
    if workers < 2:
        raise ValueError(f"--parts {workers}: a simulation needs at least 2 workers")
    if spec.hosts is not None and workers > spec.hosts:
        raise ValueError(
            f"--parts {workers}: more parts than the topology's {spec.hosts} hosts "
            "(one worker per host)"
        )


def _parts(
    spec: SweepSpec, workers: int, scratch: Path, source: Callable[[], Graph]
) -> str:
    """The partitioned folder of ``workers`` parts (written to ``scratch``)."""
    if is_partitioned_folder(spec.dataset):
        have = int(load_partition_meta(spec.dataset)["num_parts"])
        if have != workers:
            raise ValueError(
                f"--dataset {spec.dataset} is partitioned into {have} parts, "
                f"not {workers} (--parts / --workers-sweep)"
            )
        return spec.dataset
    graph = source()
    if workers > graph.num_nodes:
        raise ValueError(
            f"--parts {workers}: more parts than the {graph.num_nodes} nodes of "
            f"{spec.dataset}"
        )
    partition = get_partitioner(spec.partition).partition(
        graph, workers, seed=spec.seed
    )
    return str(
        write_partitioned(graph, partition, scratch / f"{spec.partition}{workers}")
    )


def calibrated_compute(run: str) -> list[float]:
    """Per rank, a real run's compute seconds per epoch (see the module).

    Raises:
        ValueError: no ``metrics.jsonl`` in ``run``, or no epoch in it.
    """
    path = Path(run) / "metrics.jsonl"
    if not path.is_file():
        raise ValueError(
            f"--calibrate {run}: no metrics.jsonl there (a train run's folder)"
        )
    per_rank: dict[int, list[float]] = defaultdict(list)
    with open(path) as lines:
        for number, line in enumerate(lines, 1):
            try:
                record = json.loads(line)
            except json.JSONDecodeError:
                raise ValueError(
                    f"--calibrate {path}: line {number} is not JSON"
                ) from None
            if record.get("kind") != "epoch":
                continue
            times = record.get("times", {})
            try:
                busy = times["forward_s"] + times["backward_s"] - times["comm_s"]
            except (KeyError, TypeError):
                raise ValueError(
                    f"--calibrate {path}: line {number} has no forward_s, backward_s "
                    "and comm_s times"
                ) from None
            per_rank[int(record.get("rank", 0))].append(max(float(busy), 0.0))
    if not per_rank:
        raise ValueError(f"--calibrate {path}: no epoch records")
    ranks = sorted(per_rank)
    if ranks != list(range(len(ranks))):
        raise ValueError(f"--calibrate {path}: ranks {ranks} are not 0..N-1")
    return [
        statistics.median(per_rank[r][1:] if len(per_rank[r]) > 1 else per_rank[r])
        for r in ranks
    ]
