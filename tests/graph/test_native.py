"""graphwire's own graph folder: exact round trips, memory mapping, bad folders."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

import graphwire.graph.native as native
from graphwire.graph.errors import DatasetError
from graphwire.graph.graph import Graph
from graphwire.graph.native import is_graph_folder, load_graph, save_graph

ARRAYS = ("indptr", "indices", "x", "y", "train_idx", "val_idx", "test_idx")


def small_graph() -> Graph:
    """Node i has features [i, i + 0.5] and label i % 3, so any mix-up shows."""
    src = torch.tensor([0, 1, 2, 3, 4, 0, 2])
    dst = torch.tensor([1, 2, 3, 4, 0, 3, 0])
    nid = torch.arange(5, dtype=torch.float32)
    return Graph.from_edge_index(
        src,
        dst,
        num_nodes=5,
        x=torch.stack([nid, nid + 0.5], 1),
        y=torch.arange(5) % 3,
        train_idx=torch.tensor([0, 1]),
        val_idx=torch.tensor([2]),
        test_idx=torch.tensor([3, 4]),
        name="small",
    )


@pytest.fixture
def saved(tmp_path: Path) -> Path:
    return save_graph(small_graph(), tmp_path / "g")


def mapped_file(tensor: torch.Tensor) -> str | None:
    """The file a tensor's memory is mapped from (Linux), or None if anonymous."""
    address = tensor.data_ptr()
    with open("/proc/self/maps") as maps:
        for line in maps:
            fields = line.split()
            low, high = (int(a, 16) for a in fields[0].split("-"))
            if low <= address < high:
                return fields[5] if len(fields) > 5 else None
    return None


@pytest.mark.parametrize("mmap", [True, False])
def test_round_trip_is_exact(saved: Path, mmap: bool) -> None:
    graph, loaded = small_graph(), load_graph(saved, mmap=mmap, verify=True)
    for name in ARRAYS:
        assert torch.equal(getattr(loaded, name), getattr(graph, name)), name
    assert loaded.name == "small" and loaded.x is not None
    assert loaded.x.dtype == torch.float32 and loaded.y is not None
    meta = json.loads((saved / "meta.json").read_text())
    assert meta["format"] == "graphwire.graph" and meta["version"] == 1
    assert (meta["num_nodes"], meta["num_edges"]) == (5, 7)
    assert (meta["num_features"], meta["num_classes"]) == (2, 3)
    assert meta["arrays"]["x"] == {
        "dtype": "float32",
        "shape": [5, 2],
        "sha256": meta["arrays"]["x"]["sha256"],
    }


def test_absent_node_arrays_are_not_written(tmp_path: Path) -> None:
    bare = Graph.from_edge_index([0, 1], [1, 2], num_nodes=3)
    folder = save_graph(bare, tmp_path / "bare")
    assert sorted(p.name for p in folder.iterdir()) == [
        "indices.npy",
        "indptr.npy",
        "meta.json",
    ]
    loaded = load_graph(folder)
    assert loaded.x is None and loaded.y is None and loaded.train_idx is None
    assert torch.equal(loaded.indices, bare.indices)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="/proc/self/maps")
def test_arrays_are_memory_mapped(saved: Path) -> None:
    loaded = load_graph(saved)
    for name in ARRAYS:
        assert mapped_file(getattr(loaded, name)) == str(saved / f"{name}.npy"), name
    copied = load_graph(saved, mmap=False)
    assert mapped_file(copied.indices) != str(saved / "indices.npy")


def test_failed_save_leaves_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    real_save = native.save_npy

    def failing_save(folder: Path, name: str, array: np.ndarray) -> str:
        if name == "x":
            raise OSError("disk full")
        return real_save(folder, name, array)

    monkeypatch.setattr(native, "save_npy", failing_save)
    with pytest.raises(OSError, match="disk full"):
        save_graph(small_graph(), tmp_path / "g")
    assert list(tmp_path.iterdir()) == []


def test_overwrite(saved: Path) -> None:
    with pytest.raises(FileExistsError):
        save_graph(small_graph(), saved)
    bare = Graph.from_edge_index([0], [1], num_nodes=2, name="bare")
    save_graph(bare, saved, overwrite=True)
    assert load_graph(saved).name == "bare" and not (saved / "x.npy").exists()


def test_is_graph_folder(saved: Path, tmp_path: Path) -> None:
    assert is_graph_folder(saved)
    assert not is_graph_folder(tmp_path / "nowhere")
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "meta.json").write_text('{"format": "something else"}')
    assert not is_graph_folder(tmp_path / "other")
    (tmp_path / "other" / "meta.json").write_text("{not json")
    assert not is_graph_folder(tmp_path / "other")


# ------------------------------------------------------------------ bad input
def edit_meta(change: Callable[[dict[str, Any]], Any]) -> Callable[[Path], object]:
    def apply(folder: Path) -> None:
        meta = json.loads((folder / "meta.json").read_text())
        change(meta)
        (folder / "meta.json").write_text(json.dumps(meta))

    return apply


def truncate(name: str) -> Callable[[Path], object]:
    def apply(folder: Path) -> None:
        data = (folder / name).read_bytes()
        (folder / name).write_bytes(data[: len(data) // 2])

    return apply


def resave(name: str, array: np.ndarray) -> Callable[[Path], object]:
    return lambda folder: np.save(folder / f"{name}.npy", array)


def archive(name: str) -> Callable[[Path], object]:
    """Write an ``.npz`` archive (a zip, which ``np.load`` opens as one)
    where ``name`` was."""

    def apply(folder: Path) -> None:
        with (folder / name).open("wb") as handle:
            np.savez(handle, a=np.arange(5))

    return apply


def flip_last_byte(name: str) -> Callable[[Path], object]:
    def apply(folder: Path) -> None:
        data = bytearray((folder / name).read_bytes())
        data[-1] ^= 0xFF
        (folder / name).write_bytes(bytes(data))

    return apply


BAD_FOLDERS: list[tuple[str, Callable[[Path], object], str, str]] = [
    ("no meta", lambda f: (f / "meta.json").unlink(), "meta.json", "missing"),
    (
        "bad json",
        lambda f: (f / "meta.json").write_text('{"format": '),
        "meta.json",
        "not valid JSON",
    ),
    (
        "not object",
        lambda f: (f / "meta.json").write_text("[1, 2]"),
        "meta.json",
        "expected a JSON object, found list",
    ),
    (
        "format",
        edit_meta(lambda m: m.update(format="other")),
        "meta.json",
        "format is 'other'",
    ),
    (
        "version",
        edit_meta(lambda m: m.update(version=2)),
        "meta.json",
        "unknown version 2",
    ),
    (
        "field type",
        edit_meta(lambda m: m.update(num_nodes="5")),
        "meta.json",
        "field 'num_nodes' must be a int",
    ),
    (  # JSON's true is 1 to Python, and 1.0 equals 1: both were taken
        "version true",
        edit_meta(lambda m: m.update(version=True)),
        "meta.json",
        "unknown version True",
    ),
    (
        "version float",
        edit_meta(lambda m: m.update(version=1.0)),
        "meta.json",
        "unknown version 1.0",
    ),
    (
        "bool count",
        edit_meta(lambda m: m.update(num_edges=True)),
        "meta.json",
        "field 'num_edges' must be a int, found True",
    ),
    (
        "bool shape",
        edit_meta(lambda m: m["arrays"]["y"].update(shape=[True])),
        "meta.json",
        "arrays.y must be",
    ),
    (
        "unknown array",
        edit_meta(lambda m: m["arrays"].update(z=m["arrays"]["x"])),
        "meta.json",
        r"unknown arrays \['z'\]",
    ),
    (
        "no indptr",
        edit_meta(lambda m: m["arrays"].pop("indptr")),
        "meta.json",
        "lacks the required 'indptr'",
    ),
    (
        "entry",
        edit_meta(lambda m: m["arrays"]["y"].pop("shape")),
        "meta.json",
        "arrays.y must be",
    ),
    (
        "node count",
        edit_meta(lambda m: m.update(num_nodes=6)),
        "meta.json",
        "num_nodes is 6 but the arrays hold 5",
    ),
    ("missing array", lambda f: (f / "y.npy").unlink(), "y.npy", "missing"),
    ("truncated", truncate("indices.npy"), "indices.npy", "truncated or corrupt"),
    ("truncated x", truncate("x.npy"), "x.npy", "truncated or corrupt"),
    ("archive", archive("y.npy"), "y.npy", "expected one array, found an archive"),
    (
        "header",
        lambda f: (f / "y.npy").write_bytes(b"not an npy file at all"),
        "y.npy",
        "truncated or corrupt",
    ),
    (
        "dtype",
        resave("y", np.arange(5, dtype=np.int32)),
        "y.npy",
        r"holds int32 \[5\], but meta.json says int64 \[5\]",
    ),
    (
        "shape",
        resave("x", np.zeros((5, 3), np.float32)),
        "x.npy",
        r"holds float32 \[5, 3\], but meta.json says float32 \[5, 2\]",
    ),
    (
        "feature count",
        edit_meta(lambda m: m.update(num_features=3)),
        "meta.json",
        "num_features is 3 but the arrays hold 2 feature columns",
    ),
    (
        "class count type",
        edit_meta(lambda m: m.update(num_classes="3")),
        "meta.json",
        "field 'num_classes' must be an int >= 0, found '3'",
    ),
    (
        "label above num_classes",
        resave("y", np.array([0, 1, 2, 9, 1])),
        "y.npy",
        r"label 9 at row 3 is out of range: meta.json says num_classes=3",
    ),
    (  # it read as 1,000,000,001 classes, then ran out of memory
        "label beyond the nodes",
        lambda f: (
            resave("y", np.array([0, 1, 2, 10**9, 1]))(f),
            edit_meta(lambda m: m.update(num_classes=10**9 + 1))(f),
        ),
        "y.npy",
        r"the largest label is 1000000000 \(row 3\), but a graph of 5 nodes has "
        "at most 5 classes",
    ),
    (
        "class count above the labels",
        edit_meta(lambda m: m.update(num_classes=4)),
        "meta.json",
        "num_classes is 4 but the labels span 3",
    ),
    (
        "unlabelled training node",
        resave("y", np.array([0, -1, 2, 0, 1])),
        "",  # the Graph's own check: the folder, not one file
        "train_idx: node 1 has label -1",
    ),
]


@pytest.mark.parametrize(
    "spoil, file, message",
    [b[1:] for b in BAD_FOLDERS],
    ids=[b[0] for b in BAD_FOLDERS],
)
@pytest.mark.parametrize("mmap", [True, False])
def test_bad_folder_is_named(
    saved: Path, spoil: Callable[[Path], object], file: str, message: str, mmap: bool
) -> None:
    spoil(saved)
    with pytest.raises(DatasetError, match=message) as info:
        load_graph(saved, mmap=mmap)
    assert info.value.path == str(saved / file)


def test_unlabelled_nodes_outside_the_splits_load(tmp_path: Path) -> None:
    """-1 (OGB's unlabelled) is fine on a node no loss or metric reads."""
    graph = small_graph()
    y = graph.y.clone()
    y[2] = -1
    folder = save_graph(graph.replace(y=y, val_idx=None), tmp_path / "g")
    loaded = load_graph(folder)
    assert torch.equal(loaded.y, y) and loaded.num_classes == 2


def test_checksum_is_checked_only_when_asked(saved: Path) -> None:
    flip_last_byte("x.npy")(saved)
    assert load_graph(saved).x is not None  # same shape and dtype: loads
    with pytest.raises(DatasetError, match="checksum mismatch") as info:
        load_graph(saved, verify=True)
    assert info.value.path == str(saved / "x.npy")


@pytest.mark.parametrize("mmap", [True, False])
def test_verify_reads_each_file_once(saved: Path, monkeypatch, mmap: bool) -> None:
    # The checksum is taken from the arrays as loaded, x's finiteness in the
    # same pass (one row a block here): neither a read of the file for the
    # checksum alone nor a second pass over x for its values.
    checked: list[object] = []
    monkeypatch.setattr(native, "sha256_file", None)  # calling it fails
    monkeypatch.setattr(native, "check_finite_features", checked.append)
    monkeypatch.setattr(native, "_HASH_BLOCK_BYTES", 8)
    loaded = load_graph(saved, mmap=mmap, verify=True)
    assert torch.equal(loaded.x, small_graph().x) and not checked
    flip_last_byte("x.npy")(saved)  # the last entry of the last block
    with pytest.raises(DatasetError, match="checksum mismatch") as info:
        load_graph(saved, mmap=mmap, verify=True)
    assert info.value.path == str(saved / "x.npy")


@pytest.mark.parametrize(
    "spoil",
    [
        lambda path: path.write_bytes(path.read_bytes() + b"\0"),  # bytes after
        lambda path: path.write_bytes(path.read_bytes()[:-3]),  # cut short
        lambda path: archive(path.name)(path.parent),  # np.load: an archive
    ],
    ids=["appended", "truncated", "archive"],
)
def test_verify_finds_a_file_changed_outside_its_data(saved: Path, spoil) -> None:
    spoil(saved / "y.npy")
    with pytest.raises(DatasetError, match="y.npy: checksum mismatch"):
        load_graph(saved, verify=True)


def test_an_archive_in_place_of_an_array_is_closed(saved: Path, monkeypatch) -> None:
    # np.load opens an .npz and leaves it open: refused, it is closed at
    # once, not when the error's traceback lets go of it.
    opened: list[Any] = []

    def load(path, mmap_mode=None):
        opened.append(np.load(path, mmap_mode=mmap_mode, allow_pickle=False))
        return opened[-1]

    monkeypatch.setattr(native, "load_npy", load)
    archive("y.npy")(saved)
    with pytest.raises(DatasetError, match="found an archive"):
        load_graph(saved)
    archives = [a for a in opened if isinstance(a, np.lib.npyio.NpzFile)]
    assert len(archives) == 1 and archives[0].fid is None


def test_arrays_that_are_no_graph_are_named(saved: Path) -> None:
    resave("indices", np.array([0, 1, 2, 3, 9, 0, 2]))(saved)
    edit_meta(lambda m: m["arrays"]["indices"].update(sha256="?"))(saved)
    with pytest.raises(DatasetError, match=r"do not form a graph: indices") as info:
        load_graph(saved)
    assert info.value.path == str(saved)


def test_not_a_folder(tmp_path: Path) -> None:
    with pytest.raises(DatasetError, match="not a folder"):
        load_graph(tmp_path / "nowhere")


def test_cora_round_trip(cora_dir: Path, tmp_path: Path) -> None:
    from graphwire.graph.planetoid import load_planetoid

    cora = load_planetoid(cora_dir, "cora")
    loaded = load_graph(save_graph(cora, tmp_path / "cora"), verify=True)
    for name in ARRAYS:
        assert torch.equal(getattr(loaded, name), getattr(cora, name)), name
    assert repr(loaded) == repr(cora)


def test_an_array_in_the_other_byte_order_is_named(saved: Path) -> None:
    """torch refused it deep inside, naming no file."""
    x = np.load(saved / "x.npy")
    np.save(saved / "x.npy", x.astype(x.dtype.newbyteorder(">")))
    with pytest.raises(DatasetError, match=r"x.npy: big-endian, not in this machine"):
        load_graph(saved)


def test_in_place_ops_on_mapped_arrays_stay_private(saved: Path) -> None:
    """With read-only maps, ``g.x.sub_(0)`` segfaulted: a child process runs it."""
    before = {p.name: p.read_bytes() for p in saved.iterdir()}
    script = (
        "import torch\n"
        "from graphwire.graph.native import load_graph\n"
        f"g = load_graph({str(saved)!r})\n"
        "g.x.sub_(1.0)\n"
        "g.indices.zero_()\n"
        "print(g.x[1].tolist(), int(g.indices.sum()))\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, (result.returncode, result.stderr[-2000:])
    assert result.stdout.split() == ["[0.0,", "0.5]", "0"]
    assert {p.name: p.read_bytes() for p in saved.iterdir()} == before
    again = load_graph(saved)
    assert torch.equal(again.x, small_graph().x)
    assert torch.equal(again.indices, small_graph().indices)


@pytest.mark.parametrize("name", ["indptr", "indices"])
def test_a_0d_structure_array_is_named(saved: Path, name: str) -> None:
    # meta.json agrees with the file, so only the 1-D check catches it (it was
    # an IndexError on shape[0]).
    meta = json.loads((saved / "meta.json").read_text())
    np.save(saved / f"{name}.npy", np.array(3, dtype=np.int64))
    meta["arrays"][name]["shape"] = []
    (saved / "meta.json").write_text(json.dumps(meta))
    with pytest.raises(DatasetError, match=rf"{name}.npy: expected a 1-D array.*\[\]"):
        load_graph(saved)
