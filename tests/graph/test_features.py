"""Non-finite features are refused by every loader, naming file, row and column."""

from __future__ import annotations

import gzip
import json
import pickle
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import scipy.sparse as sp
import torch

import graphwire.graph.features as features
from graphwire.cli import main
from graphwire.fsutil import sha256_file
from graphwire.graph.errors import DatasetError
from graphwire.graph.features import check_finite_features
from graphwire.graph.files import load_npz
from graphwire.graph.graph import Graph, GraphError
from graphwire.graph.native import load_graph, save_graph
from graphwire.graph.ogb import load_ogb
from graphwire.graph.planetoid import load_planetoid

BAD = [np.nan, np.inf, -np.inf]


def ring_x(bad: float, row: int = 2, col: int = 1) -> np.ndarray:
    """float32 [4, 3] features of a 4-node ring, one entry ``bad``."""
    x = np.arange(12, dtype=np.float32).reshape(4, 3)
    x[row, col] = bad
    return x


def message(bad: float, row: int = 2, col: int = 1) -> str:
    return f"expected finite numbers, found {bad} at row {row}, column {col}"


@pytest.mark.parametrize("bad", BAD)
def test_npz(tmp_path: Path, bad: float) -> None:
    path = tmp_path / "g.npz"
    np.savez(path, src=np.arange(4), dst=np.roll(np.arange(4), 1), x=ring_x(bad))
    with pytest.raises(DatasetError, match=f"g.npz: array 'x': {message(bad)}"):
        load_npz(path)


@pytest.mark.parametrize("verify", [False, True])
@pytest.mark.parametrize("bad", BAD)
def test_native_folder(tmp_path: Path, bad: float, verify: bool) -> None:
    ring = Graph.from_edge_index(np.arange(4), np.roll(np.arange(4), 1), x=ring_x(0))
    folder = save_graph(ring, tmp_path / "g")
    np.save(folder / "x.npy", ring_x(bad))  # same dtype and shape as meta.json says
    if verify:  # the checksum agrees: the values are what is refused
        meta = json.loads((folder / "meta.json").read_text())
        meta["arrays"]["x"]["sha256"] = sha256_file(folder / "x.npy")
        (folder / "meta.json").write_text(json.dumps(meta))
    with pytest.raises(DatasetError, match=f"x.npy: x: {message(bad)}"):
        load_graph(folder, verify=verify)


@pytest.mark.parametrize("bad", BAD)
def test_ogb(tmp_path: Path, bad: float) -> None:
    raw = tmp_path / "ogbn" / "raw"
    raw.mkdir(parents=True)
    (raw / "edge.csv.gz").write_bytes(gzip.compress(b"0,1\n1,2\n2,3\n3,0\n"))
    rows = "".join(",".join(map(str, row)) + "\n" for row in ring_x(bad).tolist())
    (raw / "node-feat.csv.gz").write_bytes(gzip.compress(rows.encode()))
    for name in ("train", "valid", "test"):
        split = tmp_path / "ogbn" / "split" / "time" / f"{name}.csv.gz"
        split.parent.mkdir(parents=True, exist_ok=True)
        split.write_bytes(gzip.compress(b"0\n"))
    with pytest.raises(DatasetError, match=f"node-feat.csv.gz: .*{message(bad)}"):
        load_ogb(tmp_path / "ogbn")


@pytest.mark.parametrize("part", ["x", "tx", "allx"])
def test_planetoid_before_normalising(tmp_path: Path, part: str) -> None:
    # Row normalisation would spread the nan over the whole row: refused first.
    allx = np.eye(4, dtype=np.float32)
    parts = {
        "x": allx[:2].copy(),
        "allx": allx,
        "tx": np.eye(4, dtype=np.float32)[:2],
        "y": np.eye(2, dtype=np.int32)[[0, 1]],
        "ally": np.eye(2, dtype=np.int32)[[0, 1, 0, 1]],
        "ty": np.eye(2, dtype=np.int32)[[0, 1]],
        "graph": {0: [1], 1: [2], 2: [3], 3: [4], 4: [5]},
    }
    parts[part][1, 3] = np.nan
    for name, value in parts.items():
        data = pickle.dumps(sp.csr_matrix(value) if name.endswith("x") else value)
        (tmp_path / f"ind.toy.{name}").write_bytes(data)
    (tmp_path / "ind.toy.test.index").write_text("4\n5\n")
    with pytest.raises(
        DatasetError, match=f"ind.toy.{part}: .*{message(np.nan, 1, 3)}"
    ):
        load_planetoid(tmp_path, "toy")


@pytest.mark.parametrize("bad", BAD)
def test_from_pyg_and_from_dgl(bad: float) -> None:
    src, dst = torch.arange(4), torch.arange(4).roll(1)
    x = torch.from_numpy(ring_x(bad))
    data = SimpleNamespace(edge_index=torch.stack([src, dst]), num_nodes=4, x=x)
    with pytest.raises(GraphError, match=f"pyg data: x: {message(bad)}"):
        Graph.from_pyg(data)
    dgl_graph = SimpleNamespace(
        edges=lambda: (src, dst), num_nodes=lambda: 4, ndata={"feat": x}
    )
    with pytest.raises(GraphError, match=f"dgl ndata: feat: {message(bad)}"):
        Graph.from_dgl(dgl_graph)


def test_a_bad_entry_past_the_first_block_is_found(monkeypatch) -> None:
    monkeypatch.setattr(features, "_BLOCK_ENTRIES", 6)  # two rows of 3 a block
    x = ring_x(np.nan, row=3, col=2)
    x[2, 0] = np.inf
    with pytest.raises(GraphError, match=r"found inf at row 2, column 0 \(2 non"):
        check_finite_features(x, None)
    check_finite_features(ring_x(1.0), None)  # finite: passes
    check_finite_features(np.full((2, 2), 7, dtype=np.int64), None)  # ints pass


def test_data_generate_refuses_nan_features(tmp_path: Path, capsys) -> None:
    path = tmp_path / "g.npz"
    np.savez(path, src=np.arange(4), dst=np.roll(np.arange(4), 1), x=ring_x(np.nan))
    out = tmp_path / "out"
    assert (
        main(["data", "generate", "--dataset", f"npz:{path}", "--out", str(out)]) == 2
    )
    assert message(np.nan) in capsys.readouterr().err
    assert not out.exists()
