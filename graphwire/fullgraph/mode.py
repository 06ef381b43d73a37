"""Full-graph training as a run mode (``--mode fullgraph``)."""

from __future__ import annotations

from collections.abc import Callable

from graphwire.fullgraph.distributed import train_rank
from graphwire.fullgraph.engines import EXCHANGES
from graphwire.fullgraph.progress import print_epoch
from graphwire.fullgraph.trainer import train_fullgraph
from graphwire.graph.graph import Graph
from graphwire.run.config import TrainConfig
from graphwire.run.mode import Mode
from graphwire.run.tables import fullgraph_report
from graphwire.run.training import EpochRecord, TrainResult

__all__ = ["FULLGRAPH"]


def _one_process(
    graph: Graph,
    config: TrainConfig,
    on_epoch: Callable[[EpochRecord], None],
    node_order: str,
) -> TrainResult:
    return train_fullgraph(graph, config, on_epoch, node_order=node_order)


FULLGRAPH = Mode(
    name="fullgraph",
    registry=EXCHANGES,
    train=_one_process,
    train_rank=train_rank,
    print_epoch=print_epoch,
    report=fullgraph_report,
)
