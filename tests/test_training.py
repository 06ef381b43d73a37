"""TrainConfig validation and the checks every training loop runs first."""

from __future__ import annotations

import pytest
import torch

from graphwire.graph.graph import Graph
from graphwire.training import check_split_sizes, check_trainable


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
