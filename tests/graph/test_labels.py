"""The shared label check: classes in range, -1 only outside the splits."""

from __future__ import annotations

import numpy as np
import pytest

from graphwire.graph.errors import DatasetError
from graphwire.graph.labels import check_labels


def test_returns_the_classes_the_labels_span() -> None:
    y = np.array([2, 0, -1, 1])
    assert check_labels("y.npy", y, {"train_idx": np.array([0, 1])}) == 3
    assert check_labels("y.npy", y, {}, num_classes=5) == 3
    assert check_labels("y.npy", np.full(4, -1), {}) == 0
    assert check_labels("y.npy", np.zeros(0, np.int64), {}, num_classes=0) == 0
    # A part's labels are bounded by its graph's node count, not its own rows.
    assert check_labels("part_0/y.npy", np.array([0, 9]), {}, num_nodes=10) == 10


@pytest.mark.parametrize(
    ("y", "splits", "num_classes", "message"),
    [
        ([0, 4, 1], {}, 4, r"label 4 at row 1 is out of range: .*num_classes=4"),
        ([0, -2, 1], {}, None, r"label -2 at row 1: labels must be >= 0"),
        ([0, 1, -1], {"val_local": [0, 2]}, 2, r"row 2 is in val_local but has"),
        # It read as 1,000,000,001 classes, then ran out of memory.
        (
            [0, 10**9, 1],
            {},
            None,
            r"the largest label is 1000000000 \(row 1\), but a graph of 3 nodes has "
            r"at most 3 classes; labels must be class indices 0\.\.C-1",
        ),
    ],
)
def test_bad_labels_are_named(
    y: list[int], splits: dict[str, list[int]], num_classes: int | None, message: str
) -> None:
    rows = {name: np.array(ids) for name, ids in splits.items()}
    with pytest.raises(DatasetError, match=message) as info:
        check_labels("part_0/y.npy", np.array(y), rows, num_classes)
    assert info.value.path == "part_0/y.npy"
