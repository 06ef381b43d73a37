"""OGB raw folders: contents of a small fake dataset, split schemes, bad files."""

from __future__ import annotations

import gzip
import re
from pathlib import Path

import numpy as np
import pytest
import torch

from graphwire.graph.datasets import load_dataset
from graphwire.graph.errors import DatasetError
from graphwire.graph.graph import Graph
from graphwire.graph.ogb import load_ogb

EDGES = [(0, 1), (1, 2), (2, 0), (3, 1), (1, 0), (4, 4)]  # 1->0 reverses 0->1
NUM_NODES = 6  # node 5 has no edges, no label (nan) and is in no split


def write_gz(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(gzip.compress(text.encode()))


def make_ogb(root: Path, schemes: tuple[str, ...] = ("time",)) -> Path:
    """ogbn-like folder: node i has features [i, i / 2, -i], label i % 3."""
    folder = root / "ogbn_fake"
    raw = folder / "raw"
    write_gz(raw / "edge.csv.gz", "".join(f"{s},{d}\n" for s, d in EDGES))
    write_gz(raw / "num-node-list.csv.gz", f"{NUM_NODES}\n")
    write_gz(
        raw / "node-feat.csv.gz",
        "".join(f"{i}.0,{i / 2},{-i}\n" for i in range(NUM_NODES)),
    )
    write_gz(
        raw / "node-label.csv.gz",
        "".join("nan\n" if i == 5 else f"{i % 3}\n" for i in range(NUM_NODES)),
    )
    for scheme in schemes:
        for name, ids in (("train", "0\n1\n"), ("valid", "3\n"), ("test", "4\n2\n")):
            write_gz(folder / "split" / scheme / f"{name}.csv.gz", ids)
    return folder


def edge_set(graph: Graph) -> list[tuple[int, int]]:
    src, dst = graph.edge_index()
    return sorted(zip(src.tolist(), dst.tolist(), strict=True))


def test_contents(tmp_path: Path) -> None:
    graph = load_ogb(make_ogb(tmp_path))
    assert graph.name == "ogbn_fake" and graph.num_nodes == NUM_NODES
    nid = torch.arange(NUM_NODES, dtype=torch.float32)
    assert graph.x is not None
    assert torch.equal(graph.x, torch.stack([nid, nid / 2, -nid], 1))
    assert graph.y is not None and graph.y.tolist() == [0, 1, 2, 0, 1, -1]
    assert graph.train_idx is not None and graph.train_idx.tolist() == [0, 1]
    assert graph.val_idx is not None and graph.val_idx.tolist() == [3]
    assert graph.test_idx is not None and graph.test_idx.tolist() == [4, 2]
    undirected = {(s, d) for s, d in EDGES} | {(d, s) for s, d in EDGES}
    assert edge_set(graph) == sorted(undirected)  # both ways, once each


def test_directed_when_asked(tmp_path: Path) -> None:
    graph = load_ogb(make_ogb(tmp_path), symmetrize=False)
    assert edge_set(graph) == sorted(EDGES)


def test_optional_files_and_node_count(tmp_path: Path) -> None:
    folder = make_ogb(tmp_path)
    (folder / "raw" / "num-node-list.csv.gz").unlink()
    assert load_ogb(folder).num_nodes == NUM_NODES  # from features
    (folder / "raw" / "node-feat.csv.gz").unlink()
    (folder / "raw" / "node-label.csv.gz").unlink()
    write_gz(folder / "split" / "time" / "test.csv.gz", "4\n")
    graph = load_ogb(folder)
    assert graph.x is None and graph.y is None
    assert graph.num_nodes == 5  # largest edge ID + 1


def test_split_schemes(tmp_path: Path) -> None:
    folder = make_ogb(tmp_path, schemes=("time", "random"))
    with pytest.raises(DatasetError, match=r"several: \['random', 'time'\]") as info:
        load_ogb(folder)
    assert info.value.path == str(folder / "split")
    write_gz(folder / "split" / "random" / "test.csv.gz", "2\n")  # not in train
    for scheme, test_ids in (("random", [2]), ("time", [4, 2])):
        test_idx = load_ogb(folder, scheme=scheme).test_idx
        assert test_idx is not None and test_idx.tolist() == test_ids
    with pytest.raises(DatasetError, match="split/year: missing split scheme"):
        load_ogb(folder, scheme="year")


def test_dataset_spec_options(tmp_path: Path) -> None:
    folder = make_ogb(tmp_path)
    graph = load_dataset(f"ogb:{folder}?symmetrize=0&scheme=time")
    assert edge_set(graph) == sorted(EDGES)
    assert load_dataset(f"ogb:{folder}").num_edges == 9
    with pytest.raises(ValueError, match="symmetrize: expected true/false"):
        load_dataset(f"ogb:{folder}?symmetrize=maybe")


def _truncate(path: Path) -> None:
    data = gzip.compress("".join(f"{i},{i + 1}\n" for i in range(3000)).encode())
    path.write_bytes(data[: len(data) // 2])


@pytest.mark.parametrize(
    "file, content, message",
    [
        ("raw/edge.csv.gz", None, "missing"),
        ("split/time/valid.csv.gz", None, "missing"),
        ("raw/edge.csv.gz", _truncate, "truncated gzip"),
        ("raw/node-feat.csv.gz", b"not gzip", "corrupt gzip"),
        ("raw/edge.csv.gz", "0,1,2\n1,2,0\n", "expected 2 columns per line, found 3"),
        ("raw/edge.csv.gz", "0,1\n1\n", "cannot parse.*columns"),
        ("raw/node-feat.csv.gz", "1,2\n3,abc\n", "cannot parse.*'abc'"),
        ("raw/edge.csv.gz", "0,1\nx,2\n", "cannot parse.*'x'"),
        ("raw/edge.csv.gz", "0,1\n1,6\n", r"node IDs must lie in \[0, 6\).*\[0, 6\]"),
        ("raw/edge.csv.gz", "0,-1\n", r"node IDs must lie in \[0, 6\).*\[-1, 0\]"),
        ("split/time/test.csv.gz", "2\n9\n", r"node IDs must lie in \[0, 6\)"),
        ("raw/node-feat.csv.gz", "1,2\n3,4\n", "expected 6 rows .*found 2"),
        ("raw/node-label.csv.gz", "0\n1\n", "expected 6 rows .*found 2"),
        ("raw/node-label.csv.gz", "0\n1\n1.5\n0\n0\n0\n", "found 1.5 on data line 3"),
        ("raw/node-label.csv.gz", "0\n1\n-2\n0\n0\n0\n", "non-negative integers"),
        ("raw/node-label.csv.gz", "0,1\n" * 6, "expected 1 columns per line"),
        ("raw/node-label.csv.gz", "0\n1\n2\nnan\n0\n0\n", "row 3 is in val_idx"),
        ("raw/num-node-list.csv.gz", "6\n7\n", "expected one non-negative node count"),
    ],
)
def test_bad_file_is_named(
    tmp_path: Path, file: str, content: object, message: str
) -> None:
    folder = make_ogb(tmp_path)
    path = folder / file
    if content is None:
        path.unlink()
    elif callable(content):
        content(path)
    elif isinstance(content, bytes):
        path.write_bytes(content)
    else:
        write_gz(path, str(content))
    with pytest.raises(DatasetError, match=message) as info:
        load_ogb(folder)
    assert info.value.path == str(path)


def test_missing_folders_are_named(tmp_path: Path) -> None:
    folder = make_ogb(tmp_path)
    for sub in ("split/time", "split"):
        for path in sorted((folder / sub).rglob("*"), reverse=True):
            path.unlink() if path.is_file() else path.rmdir()
        (folder / sub).rmdir()
        with pytest.raises(DatasetError, match="split: (missing|expected one)"):
            load_ogb(folder)
    with pytest.raises(DatasetError, match="raw: missing"):
        load_ogb(tmp_path / "nowhere")
    np.savez(folder / "raw" / "data.npz", a=np.zeros(1))
    (folder / "raw" / "edge.csv.gz").unlink()
    with pytest.raises(DatasetError, match="only the raw CSV layout"):
        load_ogb(folder)


def test_overlapping_splits_are_named(tmp_path: Path) -> None:
    folder = make_ogb(tmp_path)
    write_gz(folder / "split" / "time" / "test.csv.gz", "4\n1\n")  # 1 is in train
    with pytest.raises(DatasetError, match="test_idx: node 1 is also in train_idx"):
        load_ogb(folder)


@pytest.mark.parametrize("label", ["inf", "-inf", "1e30", "9007199254740992"])
def test_a_label_that_is_not_a_finite_integer_is_named(
    tmp_path: Path, label: str
) -> None:
    # inf and 1e30 passed as integers and were cast to -9223372036854775808.
    folder = make_ogb(tmp_path)
    labels = "".join(f"{i % 3}\n" if i != 2 else f"{label}\n" for i in range(6))
    write_gz(folder / "raw" / "node-label.csv.gz", labels)
    shown = re.escape(str(float(label)))
    with pytest.raises(
        DatasetError, match=rf"label.csv.gz: .*found {shown} on data li"
    ):
        load_ogb(folder)
