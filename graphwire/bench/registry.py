"""Name -> benchmark entry point, and the options they share."""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from graphwire.graph.seeds import check_seed
from graphwire.graph.synthetic import MAX_NODES

__all__ = ["BENCHMARKS", "TARGET_NODES", "BenchOptions", "run_benchmark", "target_note"]

# The graph size the benchmarks' targets are set for (the default --nodes).
TARGET_NODES = 1_000_000


@dataclass(kw_only=True, slots=True)
class BenchOptions:
    """The options every benchmark reads.

    ``graphwire bench --help`` says what each one does with them.

    Attributes:
        nodes: nodes of the synthetic products-like graph, 100 to 2**31
            (the generator's limit).
        seed: the graph's seed and the benchmark's own (weights, batch order).
        repeat: how many times a timed step runs (at least 1).
    """

    nodes: int = TARGET_NODES
    seed: int = 0
    repeat: int = 5

    def __post_init__(self) -> None:
        if not 100 <= self.nodes <= MAX_NODES:
            raise ValueError(f"nodes: need 100 to 2**31, got {self.nodes}")
        if self.repeat < 1:
            raise ValueError(f"repeat: need at least 1, got {self.repeat}")
        # The generator's numpy would refuse a negative seed only deep inside
        # (and in the generator benchmark's child process, as a traceback).
        self.seed = check_seed(self.seed)


# name -> (module, one-line description); modules are imported on use.
BENCHMARKS: dict[str, tuple[str, str]] = {
    "generator": (
        "graphwire.bench.generator",
        "synthetic products graph: seconds and peak memory / output size, vs "
        "the 60 s and 3x targets",
    ),
    "gcn-epoch": (
        "graphwire.bench.gcn_epoch",
        "full-graph GCN epoch: graphwire vs plain torch.sparse.mm (ratio)",
    ),
    "sampler": (
        "graphwire.bench.sampler",
        "uniform neighbour sampler: sampled edges per second on one thread, "
        "vs the 2 M/s target",
    ),
}


def target_note(options: BenchOptions) -> str:
    """What a printed target line adds when the graph is not the targets' size.

    The targets are set for :data:`TARGET_NODES` nodes; a figure on a small
    graph does not meet or miss one."""
    if options.nodes == TARGET_NODES:
        return ""
    return f"; the targets are for {TARGET_NODES:,} nodes"


def run_benchmark(name: str, options: BenchOptions) -> dict[str, Any]:
    if name not in BENCHMARKS:
        raise ValueError(f"unknown benchmark {name!r}; known: {sorted(BENCHMARKS)}")
    module = importlib.import_module(BENCHMARKS[name][0])
    run: Callable[[BenchOptions], dict[str, Any]] = module.run
    return run(options)
