"""Name -> benchmark entry point, and the options they share."""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

__all__ = ["BENCHMARKS", "BenchOptions", "run_benchmark"]


@dataclass(kw_only=True, slots=True)
class BenchOptions:
    nodes: int = 1_000_000
    seed: int = 0
    repeat: int = 5

    def __post_init__(self) -> None:
        if self.nodes < 100:
            raise ValueError(f"nodes: need at least 100, got {self.nodes}")
        if self.repeat < 1:
            raise ValueError(f"repeat: need at least 1, got {self.repeat}")


# name -> (module, one-line description); modules are imported on use.
BENCHMARKS: dict[str, tuple[str, str]] = {
    "generator": (
        "graphwire.bench.generator",
        "synthetic products graph: seconds and peak memory / output size",
    ),
    "gcn-epoch": (
        "graphwire.bench.gcn_epoch",
        "full-graph GCN epoch: graphwire vs plain torch.sparse.mm (ratio)",
    ),
    "sampler": (
        "graphwire.bench.sampler",
        "uniform neighbour sampler: sampled edges per second on one thread",
    ),
}


def run_benchmark(name: str, options: BenchOptions) -> dict[str, Any]:
    if name not in BENCHMARKS:
        raise ValueError(f"unknown benchmark {name!r}; known: {sorted(BENCHMARKS)}")
    module = importlib.import_module(BENCHMARKS[name][0])
    run: Callable[[BenchOptions], dict[str, Any]] = module.run
    return run(options)
