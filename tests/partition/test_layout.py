"""A partitioned folder's meta.json against what the folder holds: its part
count and its class count."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from graphwire.graph.errors import DatasetError
from graphwire.partition import load_part, load_partition_meta
from tests.partition.test_format import edit_meta, write_example


def test_a_meta_json_claiming_more_parts_than_the_folder_holds(tmp_path: Path) -> None:
    """It was blamed on the offsets ("offsets must be 5 non-decreasing ints")."""
    folder = write_example(tmp_path)  # 3 parts
    edit_meta(folder, num_parts=4)
    with pytest.raises(DatasetError) as caught:
        load_partition_meta(folder)
    assert str(caught.value) == (
        f"{folder / 'meta.json'}: claims 4 parts, but the folder holds 3 "
        "(part_0..part_2)"
    )
    edit_meta(folder, num_parts=2)
    with pytest.raises(DatasetError, match=r"claims 2 parts, but the folder holds 3 "):
        load_part(folder, 0)


def test_a_part_missing_from_the_folder_is_counted(tmp_path: Path) -> None:
    """It said only that the part's first file was missing."""
    folder = write_example(tmp_path)
    shutil.rmtree(folder / "part_2")
    assert load_part(folder, 1).part_id == 1  # the others load alone
    with pytest.raises(DatasetError) as caught:
        load_part(folder, 2)
    assert str(caught.value) == (
        f"{folder / 'meta.json'}: claims 3 parts, but the folder holds 2 "
        "(part_0, part_1)"
    )
    shutil.rmtree(folder / "part_0")
    with pytest.raises(DatasetError, match=r"claims 3 parts, .* holds 1 \(part_1\)"):
        load_part(folder, 0)


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
