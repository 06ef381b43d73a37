"""`Mode`: what one training mode (full-graph, mini-batch) brings to a run.

The run layer starts one process or a distributed job, writes the records
and prints the report the same way for every mode; a mode gives it its loops
and its report. ``graphwire train --mode NAME`` picks one by name
(:data:`graphwire.commands.train.MODES`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from graphwire.graph.graph import Graph
from graphwire.run.config import TrainConfig
from graphwire.run.job import RankReport
from graphwire.run.registry import Registry
from graphwire.run.training import EpochRecord, TrainResult

__all__ = ["Mode"]

OneProcess = Callable[
    [Graph, TrainConfig, Callable[[EpochRecord], None], str], TrainResult
]


@dataclass(frozen=True)
class Mode:
    """A training mode's parts.

    Attributes:
        name: ``--mode``'s value.
        registry: the strategies its distributed runs choose among
            (``--exchange``, ``--fetch``).
        train: the one-process loop, ``train(graph, config, on_epoch,
            node_order)``.
        train_rank: a distributed rank's loop (:attr:`Job.train
            <graphwire.run.job.Job.train>`; picklable).
        print_epoch: what rank 0 prints after each epoch (picklable).
        report: prints a distributed run's tables; returns its summary fields.
    """

    name: str
    registry: Registry
    train: OneProcess
    train_rank: Callable[..., Any]
    print_epoch: Callable[[EpochRecord], None]
    report: Callable[[list[RankReport]], dict[str, Any]]
