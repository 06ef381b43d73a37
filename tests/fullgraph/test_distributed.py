"""train_distributed's checks: before its first epoch, and of every epoch's
loss (in-process ranks)."""

from __future__ import annotations

import functools
from pathlib import Path

import pytest
import torch

from graphwire.comm.base import Transport
from graphwire.comm.local import run_local
from graphwire.fullgraph.distributed import train_distributed
from graphwire.graph.graph import Graph
from graphwire.partition import Partition, load_part, write_partitioned
from graphwire.run.config import TrainConfig
from tests.fullgraph.dist_helpers import nan_feature_halves


def _train(transport: Transport, folder: str) -> None:
    part = load_part(folder, transport.rank)
    train_distributed(part, transport, TrainConfig(model="gcn", epochs=1), "halo")


def test_a_split_empty_on_every_part_is_refused_by_every_rank(
    tmp_path: Path,
) -> None:
    """Part 0 holds the only validation node of one graph; the other graph
    has none at all, so its run would pick the first epoch as the best."""
    x, y = torch.ones(4, 2), torch.tensor([0, 1, 0, 1])
    graph = Graph.from_edge_index(
        [0, 1, 2], [1, 2, 3], 4, x=x, y=y, train_idx=[1, 3], val_idx=[0], test_idx=[2]
    )
    halves = Partition(assignment=torch.tensor([0, 0, 1, 1]), num_parts=2)
    folder = write_partitioned(graph, halves, tmp_path / "ok")
    run_local(functools.partial(_train, folder=str(folder)), 2)
    no_val = graph.replace(val_idx=torch.empty(0, dtype=torch.int64))
    folder = write_partitioned(no_val, halves, tmp_path / "no-val")
    with pytest.raises(ValueError, match=r"\(all 2 parts\): val_idx holds no nodes"):
        run_local(functools.partial(_train, folder=str(folder)), 2)


def _nan_loss_message(
    transport: Transport,
    folder: str,
    eval_every: int,
    lr: float = 0.01,
    exchange: str = "halo",
) -> str:
    part = load_part(folder, transport.rank)
    config = TrainConfig(model="gcn", epochs=2, eval_every=eval_every, lr=lr)
    try:
        train_distributed(part, transport, config, exchange)
    except ValueError as error:
        return str(error)
    return "no error"


@pytest.mark.parametrize("eval_every", [1, 2], ids=["evaluated", "not-evaluated"])
def test_a_non_finite_loss_on_one_part_stops_every_rank(
    tmp_path: Path, eval_every: int
) -> None:
    """Only part 1's training node reads the NaN feature (no edge joins the
    halves), so only rank 1's own loss is NaN: every rank must still stop at
    epoch 0 with the same error (the summed loss decides), in an epoch with an
    evaluation and in one without."""
    folder = nan_feature_halves(tmp_path)
    train = functools.partial(
        _nan_loss_message, folder=str(folder), eval_every=eval_every
    )
    messages = run_local(train, 2)
    assert messages[0] == messages[1]
    assert messages[0].startswith("epoch 0: the training loss is nan (not finite)")


@pytest.mark.parametrize("exchange", ["halo", "g3"])
def test_a_non_finite_validation_loss_stops_every_rank(
    tmp_path: Path, exchange: str
) -> None:
    """Epoch 0's step overflows the weights (lr 1e30) after a finite training
    loss. Only part 0 holds the validation node, so only rank 0's own
    validation loss is NaN: every rank must stop at epoch 0 with the same
    error (the summed loss decides), where the run went on to score NaN
    logits' argmax."""
    folder = nan_feature_halves(tmp_path, nan=False)
    train = functools.partial(
        _nan_loss_message, folder=str(folder), eval_every=1, lr=1e30, exchange=exchange
    )
    messages = run_local(train, 2)
    assert messages[0] == messages[1]
    assert messages[0].startswith(
        "epoch 0: the validation loss is nan (not finite): the weights after "
        "this epoch's step give logits that overflow; lower the learning rate "
        "(lr=1e+30)"
    )
