"""npz archives and text edge lists: round trips and every kind of bad file."""

from __future__ import annotations

import gzip
import io
import zipfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

import graphwire.graph.files as files
from graphwire.graph.errors import DatasetError
from graphwire.graph.files import load_edgelist, load_npz, read_table, save_npz
from graphwire.graph.graph import Graph

ARRAYS = ("indptr", "indices", "x", "y", "train_idx", "val_idx", "test_idx")


def small_graph() -> Graph:
    """Node i has features [i, -i] and label i % 2; node 5 is isolated."""
    nid = torch.arange(6, dtype=torch.float32)
    return Graph.from_edge_index(
        torch.tensor([0, 1, 2, 3, 0, 4, 4]),
        torch.tensor([1, 2, 3, 0, 2, 4, 1]),
        num_nodes=6,
        x=torch.stack([nid, -nid], 1),
        y=torch.arange(6) % 2,
        train_idx=torch.tensor([0, 1, 2]),
        val_idx=torch.tensor([3]),
        test_idx=torch.tensor([4, 5]),
        name="small",
    )


def assert_same_graph(a: Graph, b: Graph) -> None:
    for name in ARRAYS:
        left, right = getattr(a, name), getattr(b, name)
        assert (left is None) == (right is None), name
        assert left is None or torch.equal(left, right), name


# ------------------------------------------------------------------------ npz
def test_npz_round_trip(tmp_path: Path) -> None:
    graph = small_graph()
    path = save_npz(graph, tmp_path / "small.npz")
    loaded = load_npz(path)
    assert_same_graph(loaded, graph)
    assert loaded.name == "small" and loaded.num_nodes == 6  # isolated node kept
    assert [p.name for p in tmp_path.iterdir()] == ["small.npz"]  # no temp left


def test_npz_minimal_and_num_nodes_inference(tmp_path: Path) -> None:
    np.savez(tmp_path / "a.npz", src=np.array([0, 2], np.int32), dst=np.array([1, 0]))
    graph = load_npz(tmp_path / "a.npz")
    assert graph.num_nodes == 3 and graph.x is None
    assert graph.edge_index()[0].tolist() == [2, 0]
    np.savez(tmp_path / "b.npz", src=[0], dst=[1], y=np.array([0, 1, 1, 0]))
    assert load_npz(tmp_path / "b.npz").num_nodes == 4  # from y
    bare = Graph.from_edge_index([], [], num_nodes=3)
    assert load_npz(save_npz(bare, tmp_path / "empty.npz")).num_nodes == 3


def test_failed_npz_save_leaves_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def failing_savez(*args: Any, **kwargs: Any) -> None:
        raise OSError("disk full")

    monkeypatch.setattr(files.np, "savez", failing_savez)
    with pytest.raises(OSError, match="disk full"):
        save_npz(small_graph(), tmp_path / "g.npz")
    assert list(tmp_path.iterdir()) == []


def _npz(**arrays: Any) -> Callable[[Path], object]:
    base: dict[str, Any] = {"src": np.array([0, 1]), "dst": np.array([1, 2])}
    base.update(arrays)
    contents = {k: v for k, v in base.items() if v is not None}
    return lambda path: np.savez(path, **contents)


def _truncated(path: Path) -> None:
    save_npz(small_graph(), path)
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])


def _corrupt(path: Path) -> None:
    save_npz(small_graph(), path)
    data = bytearray(path.read_bytes())
    start = data.find(b"\x93NUMPY")  # inside the first member: CRC must fail
    data[start + 200 : start + 220] = b"\xaa" * 20
    path.write_bytes(bytes(data))


def _save_one(path: Path) -> None:
    with open(path, "wb") as handle:
        np.save(handle, np.arange(3))


def _pickled(path: Path) -> None:
    np.savez(path, src=np.array([0]), dst=np.array([1]), y=np.array([{}, 1], object))


BAD_NPZ: list[tuple[str, Callable[[Path], object], str]] = [
    ("missing", lambda path: None, "missing"),
    # numpy took it for a pickle and suggested allow_pickle=True
    ("not zip", lambda path: path.write_bytes(b"hello"), "not an .npz archive \\("),
    ("truncated", _truncated, "truncated or corrupt archive"),
    ("corrupt", _corrupt, "truncated or corrupt archive"),
    ("pickle", _pickled, "not a readable .npz.*allow_pickle"),
    ("one array", lambda path: _save_one(path), "one array"),
    ("no src", _npz(src=None), "lacks the required array 'src'"),
    ("no dst", _npz(dst=None), "lacks the required array 'dst'"),
    ("unknown", _npz(train_mask=np.ones(3, bool)), r"unknown arrays \['train_mask'\]"),
    ("float ids", _npz(src=np.array([0.0, 1.0])), "'src': expected integer"),
    ("2-D ids", _npz(dst=np.array([[1, 2]])), r"'dst': expected integer \[E\]"),
    ("lengths", _npz(dst=np.array([1, 2, 0])), r"differ in length \(2 vs 3\)"),
    ("out of range", _npz(num_nodes=np.array(2)), r"must lie in \[0, 2\).*\[0, 2\]"),
    ("negative", _npz(src=np.array([-1, 0])), r"must lie in \[0, 3\).*\[-1, 2\]"),
    ("num_nodes", _npz(num_nodes=np.array([3])), "'num_nodes': expected one integer"),
    ("x rows", _npz(x=np.zeros((4, 2)), y=np.zeros(3, int)), r"y: expected shape"),
    ("x shape", _npz(x=np.zeros(3)), "x: expected shape"),
    ("split", _npz(test_idx=np.array([7])), r"test_idx: node IDs must lie in \[0, 3\)"),
    ("y float", _npz(y=np.array([0.5, 1, 0])), "y: expected an integer dtype"),
    (  # it read as 1,000,000,001 classes, then ran out of memory
        "label beyond the nodes",
        _npz(y=np.array([0, 10**9, 1])),
        r"array 'y': the largest label is 1000000000 \(row 1\), but a graph of 3 "
        "nodes has at most 3 classes",
    ),
    (
        "unlabelled split node",
        _npz(y=np.array([0, -1, 1]), train_idx=np.array([0, 1])),
        "array train_idx: node 1 has label -1",
    ),
]


@pytest.mark.parametrize(
    "make, message", [b[1:] for b in BAD_NPZ], ids=[b[0] for b in BAD_NPZ]
)
def test_bad_npz_is_named(
    tmp_path: Path, make: Callable[[Path], object], message: str
) -> None:
    path = tmp_path / "g.npz"
    make(path)
    with pytest.raises(DatasetError, match=message) as info:
        load_npz(path)
    assert info.value.path == str(path)


def test_npz_unlabelled_node_outside_the_splits_loads(tmp_path: Path) -> None:
    path = tmp_path / "g.npz"
    _npz(y=np.array([0, -1, 1]), train_idx=np.array([0, 2]))(path)
    assert load_npz(path).num_classes == 2


def test_corrupt_fixture_really_corrupts(tmp_path: Path) -> None:
    path = tmp_path / "g.npz"
    _corrupt(path)
    with zipfile.ZipFile(path) as archive:
        assert archive.testzip() is not None  # the damage is inside a member


# ------------------------------------------------------------------ edge lists
@pytest.mark.parametrize("gz", [False, True])
@pytest.mark.parametrize("delimiter", [None, ","])
def test_edgelist_parses(tmp_path: Path, gz: bool, delimiter: str | None) -> None:
    sep = "\t" if delimiter is None else ","
    text = f"# a comment\n0{sep}1\n\n2{sep}0  # trailing comment\n2{sep}2\n"
    path = tmp_path / ("g.txt.gz" if gz else "g.txt")
    path.write_bytes(gzip.compress(text.encode()) if gz else text.encode())
    graph = load_edgelist(path, delimiter=delimiter)
    assert graph.num_nodes == 3 and graph.name == "g"
    src, dst = graph.edge_index()
    assert sorted(zip(src.tolist(), dst.tolist(), strict=True)) == [
        (0, 1),
        (2, 0),
        (2, 2),
    ]
    assert load_edgelist(path, num_nodes=5, delimiter=delimiter).num_nodes == 5


def test_edgelist_round_trip_matches_graph(tmp_path: Path) -> None:
    graph = small_graph()
    src, dst = graph.edge_index()
    lines = "".join(
        f"{s} {d}\n" for s, d in zip(src.tolist(), dst.tolist(), strict=True)
    )
    (tmp_path / "g.el").write_text(lines)
    loaded = load_edgelist(tmp_path / "g.el", num_nodes=6)
    assert torch.equal(loaded.indptr, graph.indptr)
    assert torch.equal(loaded.indices, graph.indices)


def test_empty_edgelist(tmp_path: Path) -> None:
    (tmp_path / "e.txt").write_text("# nothing\n")
    assert load_edgelist(tmp_path / "e.txt").num_nodes == 0
    assert load_edgelist(tmp_path / "e.txt", num_nodes=4).num_edges == 0


def _gz_truncated(path: Path) -> None:
    data = gzip.compress(b"".join(b"%d %d\n" % (i, i + 1) for i in range(5000)))
    path.write_bytes(data[: len(data) // 2])


BAD_EDGELISTS: list[tuple[str, str, bytes | Callable[[Path], object], str]] = [
    ("one column", "g.txt", b"0 1\n2\n", "cannot parse.*number of columns"),
    ("three columns", "g.txt", b"0 1 2\n", "expected 2 columns per line, found 3"),
    ("word", "g.txt", b"0 1\n2 x\n", "cannot parse.*'x'"),
    ("float", "g.txt", b"0 1.5\n", "cannot parse.*'1.5'"),
    ("negative", "g.txt", b"0 1\n-4 2\n", r"must lie in \[0, 3\).*\[-4, 2\]"),
    ("binary", "g.txt", b"0 1\n\xff\xfe 2\n", "not ASCII text"),
    ("truncated gz", "g.txt.gz", _gz_truncated, "truncated gzip"),
    ("not gz", "g.txt.gz", b"0 1\n", "corrupt gzip"),
    ("missing", "g.txt", b"", "missing"),
]


@pytest.mark.parametrize(
    "name, content, message",
    [b[1:] for b in BAD_EDGELISTS],
    ids=[b[0] for b in BAD_EDGELISTS],
)
def test_bad_edgelist_is_named(
    tmp_path: Path, name: str, content: Any, message: str
) -> None:
    path = tmp_path / name
    if callable(content):
        content(path)
    elif content:
        path.write_bytes(content)
    with pytest.raises(DatasetError, match=message) as info:
        load_edgelist(path)
    assert info.value.path == str(path)


def test_edgelist_ids_beyond_num_nodes(tmp_path: Path) -> None:
    (tmp_path / "g.txt").write_text("0 1\n1 7\n")
    with pytest.raises(
        DatasetError, match=r"g.txt: edge node IDs must lie in \[0, 4\)"
    ):
        load_edgelist(tmp_path / "g.txt", num_nodes=4)


def test_an_edgelist_id_beyond_2_31_asks_for_relabelling(tmp_path: Path) -> None:
    """An unmapped ID (a user number, say) made num_nodes = ID + 1, and the
    CSR's row offsets then a MemoryError traceback (745 GiB here)."""
    (tmp_path / "g.txt").write_text("0 1\n1 99999999999\n")
    said = "g.txt: edge node ID 99999999999 would make 100,000,000,000 nodes"
    with pytest.raises(DatasetError, match=said + ".*relabel the IDs to 0..N-1"):
        load_edgelist(tmp_path / "g.txt")


def test_read_table_any_width_and_floats(tmp_path: Path) -> None:
    (tmp_path / "f.csv").write_text("0.5,1,nan\n2,3e2,-1\n")
    table = read_table(tmp_path / "f.csv", np.float32)
    assert table.shape == (2, 3) and table.dtype == np.float32
    assert np.isnan(table[0, 2]) and table[1, 1] == 300
    (tmp_path / "ragged.csv").write_text("1,2\n3,4,5\n")
    with pytest.raises(DatasetError, match="ragged.csv: cannot parse"):
        read_table(tmp_path / "ragged.csv", np.float32)


def test_an_npz_member_that_is_not_npy_is_named(tmp_path: Path) -> None:
    # np.load returns such a member's raw bytes (an AttributeError later on).
    path = tmp_path / "g.npz"
    with zipfile.ZipFile(path, "w") as archive:
        for name, array in (("src", np.arange(3)), ("dst", np.arange(3))):
            buffer = io.BytesIO()
            np.save(buffer, array)
            archive.writestr(f"{name}.npy", buffer.getvalue())
        archive.writestr("x.npy", b"1.0,2.0\n3.0,4.0\n")
    with pytest.raises(DatasetError, match=r"g.npz: array 'x': not an .npy array"):
        load_npz(path)


@pytest.mark.parametrize("num_nodes", [2**31 + 1, 2**40, 2**62])
def test_a_given_node_count_is_capped_as_an_inferred_one(
    tmp_path: Path, num_nodes: int
) -> None:
    path = tmp_path / "g.npz"
    np.savez(path, src=np.arange(3), dst=np.arange(3), num_nodes=np.int64(num_nodes))
    with pytest.raises(DatasetError, match=f"g.npz: num_nodes is {num_nodes:,}, more"):
        load_npz(path)
    text = tmp_path / "g.txt"
    text.write_text("0 1\n")
    with pytest.raises(DatasetError, match=f"g.txt: num_nodes is {num_nodes:,}"):
        load_edgelist(text, num_nodes=num_nodes)
