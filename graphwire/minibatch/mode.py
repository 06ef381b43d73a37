"""Mini-batch training as a run mode (``--mode minibatch``)."""

from __future__ import annotations

import functools
from collections.abc import Callable

from graphwire.graph.graph import Graph
from graphwire.minibatch.dist import train_rank
from graphwire.minibatch.fetchers import FETCHERS
from graphwire.minibatch.linktrainer import train_link
from graphwire.minibatch.progress import print_epoch
from graphwire.minibatch.trainer import train_minibatch
from graphwire.run.collective import InferenceFactory
from graphwire.run.config import TrainConfig
from graphwire.run.mode import Mode
from graphwire.run.tables import minibatch_report
from graphwire.run.training import EpochRecord, TrainResult

__all__ = ["minibatch_mode"]


def _one_process(
    graph: Graph,
    config: TrainConfig,
    on_epoch: Callable[[EpochRecord], None],
    node_order: str,
) -> TrainResult:
    del node_order  # the batches follow the graph's own numbering
    if config.task == "link":
        return train_link(graph, config, on_epoch)
    return train_minibatch(graph, config, on_epoch)


def minibatch_mode(inference: InferenceFactory) -> Mode:
    """The mode, its distributed runs evaluating with ``inference`` (the
    full-graph engines' exact inference: the caller, which may import both
    loops, supplies it)."""
    return Mode(
        name="minibatch",
        registry=FETCHERS,
        train=_one_process,
        train_rank=functools.partial(train_rank, inference=inference),
        print_epoch=print_epoch,
        report=minibatch_report,
    )
