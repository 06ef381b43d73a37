"""A partitioned folder's meta.json against what the folder holds: its class
count."""

from __future__ import annotations

from pathlib import Path

import pytest

from graphwire.graph.errors import DatasetError
from graphwire.partition import load_part
from tests.partition.test_format import edit_meta, write_example


def test_a_class_count_beyond_the_node_count_is_refused(tmp_path: Path) -> None:
    """The model's output layer is sized by num_classes: 10**9 of them, on a
    40-node graph, ran out of memory instead of naming meta.json."""
    folder = write_example(tmp_path)
    edit_meta(folder, num_classes=10**9)
    with pytest.raises(DatasetError) as caught:
        load_part(folder, 0)
    assert str(caught.value) == (
        f"{folder / 'meta.json'}: num_classes is 1,000,000,000, but a graph of "
        "40 nodes (num_nodes) has at most 40 classes"
    )
