"""TrainConfig validation and the checks every training loop runs first."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch

from graphwire.fullgraph.trainer import train_fullgraph
from graphwire.graph.graph import Graph
from graphwire.graph.planetoid import load_planetoid
from graphwire.minibatch.trainer import train_minibatch
from graphwire.run.config import TrainConfig
from graphwire.run.training import check_split_sizes, check_trainable


def _graph(**splits: list[int]) -> Graph:
    ids = {"train_idx": [0, 1], "val_idx": [2], "test_idx": [3], **splits}
    return Graph.from_edge_index(
        [0, 1, 2],
        [1, 2, 3],
        num_nodes=4,
        x=torch.ones(4, 2),
        y=torch.tensor([0, 1, 0, 1]),
        **ids,
    )


@pytest.mark.parametrize("split", ["train_idx", "val_idx", "test_idx"])
def test_an_empty_split_is_refused(split: str) -> None:
    """An empty split trained on silently: NaN losses (train), the first epoch
    as the best (val) or a test accuracy of 0 (test)."""
    with pytest.raises(ValueError, match=f"graph 'graph': {split} holds no nodes"):
        check_trainable(_graph(**{split: []}))


def test_check_split_sizes_names_every_empty_split() -> None:
    check_split_sizes({"train": 1, "val": 1, "test": 1}, "g")
    with pytest.raises(ValueError, match="g: train_idx, test_idx holds no nodes"):
        check_split_sizes({"train": 0, "val": 3, "test": 0}, "g")


@pytest.mark.parametrize(
    "train, config",
    [
        (train_fullgraph, TrainConfig(model="gcn", epochs=1, seed=2, hidden=4)),
        (
            train_minibatch,
            TrainConfig(model="sage", epochs=1, seed=2, hidden=4, fanouts=[2, 3]),
        ),
    ],
    ids=["full-graph", "mini-batch"],
)
def test_the_callers_generator_is_left_as_it_was(
    cora_dir: Path, train, config: TrainConfig
) -> None:
    """The run seeds torch's generator; the caller's draws after it are those
    it would have made without it, and its state does not change the run."""
    cora = load_planetoid(cora_dir, "cora")
    torch.manual_seed(123)
    expected = torch.rand(3)
    torch.manual_seed(123)
    one = train(cora, config)
    assert torch.equal(torch.rand(3), expected)
    two = train(cora, config)  # the caller's generator is elsewhere now
    assert [r.loss for r in one.records] == [r.loss for r in two.records]


@pytest.mark.parametrize(
    "train, config",
    [
        (train_fullgraph, TrainConfig(model="gcn", epochs=3, hidden=4)),
        (train_minibatch, TrainConfig(model="sage", epochs=3, hidden=4)),
    ],
    ids=["full-graph", "mini-batch"],
)
def test_a_non_finite_training_loss_stops_the_run_naming_the_epoch(
    train, config: TrainConfig
) -> None:
    """One NaN feature on a training node: the run ran to the end with a NaN
    loss every epoch and reported an accuracy of NaN logits' argmax."""
    graph = _graph()
    assert graph.x is not None
    graph.x[1, 0] = math.nan
    seen: list[float] = []
    with pytest.raises(
        ValueError,
        match=r"^epoch 0: the training loss is nan \(not finite\); check the "
        r"features for NaN or infinite values, or lower the learning rate",
    ):
        train(graph, config, on_epoch=lambda record: seen.append(record.loss))
    assert seen == []  # no record of the failed epoch


@pytest.mark.parametrize(
    "train, config",
    [
        (train_fullgraph, TrainConfig(model="gcn", epochs=3, hidden=4, lr=1e30)),
        (train_minibatch, TrainConfig(model="sage", epochs=3, hidden=4, lr=1e30)),
    ],
    ids=["full-graph", "mini-batch"],
)
def test_a_non_finite_validation_loss_stops_the_run_naming_the_epoch(
    train, config: TrainConfig
) -> None:
    """Epoch 0's training loss is finite, but its step overflows the weights:
    the run scored NaN logits' argmax as that epoch's accuracy (and, were it
    the last, could pick it as the best)."""
    seen: list[float] = []
    with pytest.raises(
        ValueError,
        match=r"^epoch 0: the validation loss is nan \(not finite\): the weights "
        r"after this epoch's step give logits that overflow; lower the learning "
        r"rate \(lr=1e\+30\)$",
    ):
        train(_graph(), config, on_epoch=lambda record: seen.append(record.loss))
    assert seen == []  # no record of the failed epoch
