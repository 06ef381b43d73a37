"""Planetoid loader: Cora's published numbers, Kipf's processing, hostile files."""

from __future__ import annotations

import os
import pickle
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import scipy.sparse as sp
import torch

from graphwire.graph.datasets import load_dataset
from graphwire.graph.errors import DatasetError
from graphwire.graph.graph import Graph, GraphError
from graphwire.graph.planetoid import _read_pickle, load_planetoid

PARTS = ("x", "tx", "allx", "y", "ty", "ally", "graph", "test.index")
PICKLED = PARTS[:-1]


@pytest.fixture(scope="module")
def cora(cora_dir: Path) -> Any:
    return load_planetoid(cora_dir, "cora")


def linked_cora(cora_dir: Path, tmp_path: Path) -> Path:
    """A folder of symlinks to the shared Cora files; tests replace single files."""
    folder = tmp_path / "planetoid"
    folder.mkdir()
    for part in PARTS:
        (folder / f"ind.cora.{part}").symlink_to(cora_dir / f"ind.cora.{part}")
    return folder


def replace(folder: Path, part: str, data: bytes, name: str = "cora") -> Path:
    path = folder / f"ind.{name}.{part}"
    path.unlink(missing_ok=True)
    path.write_bytes(data)
    return path


def write_planetoid(folder: Path, name: str, **parts: Any) -> None:
    """Write a dataset the way Kipf's files are made (pickle protocol 2)."""
    folder.mkdir(exist_ok=True)
    for part, value in parts.items():
        path = folder / f"ind.{name}.{part.replace('_', '.')}"
        if part == "test_index":
            path.write_text("".join(f"{i}\n" for i in value))
        else:
            path.write_bytes(pickle.dumps(value, protocol=2))


# ------------------------------------------------------------------ Cora
def test_cora_has_the_published_sizes(cora: Any) -> None:
    assert (cora.num_nodes, cora.num_edges) == (2708, 10556)
    assert (cora.num_features, cora.num_classes) == (1433, 7)
    assert torch.equal(cora.train_idx, torch.arange(140))
    assert torch.equal(cora.val_idx, torch.arange(140, 640))
    assert cora.test_idx.numel() == 1000
    assert torch.equal(cora.test_idx, cora.test_idx.sort().values)
    assert torch.bincount(cora.y).tolist() == [351, 217, 418, 818, 426, 298, 180]
    src, dst = cora.edge_index()
    assert not bool((src == dst).any())
    assert torch.equal(cora.symmetric.indices, cora.indices)  # symmetric, no dups
    torch.testing.assert_close(cora.x.sum(1), torch.ones(2708))  # no empty rows


def test_cora_matches_kipf_reference(cora_dir: Path) -> None:
    """Re-derive Cora as Kipf's ``load_data`` does (scipy + networkx) and compare."""
    nx = pytest.importorskip("networkx")
    raw = {p: _read_pickle(cora_dir / f"ind.cora.{p}") for p in PICKLED}
    reorder = np.loadtxt(cora_dir / "ind.cora.test.index", dtype=np.int64)
    ordered = np.sort(reorder)
    features = sp.vstack((raw["allx"], raw["tx"])).tolil()
    features[reorder, :] = features[ordered, :]
    labels = np.vstack((raw["ally"], raw["ty"]))
    labels[reorder, :] = labels[ordered, :]
    adj = nx.adjacency_matrix(
        nx.from_dict_of_lists(raw["graph"]), nodelist=range(2708)
    ).tocsr()
    adj.setdiag(0)
    adj.eliminate_zeros()

    graph = load_planetoid(cora_dir, "cora", normalize_features=False)
    assert graph.x is not None and graph.y is not None and graph.test_idx is not None
    assert torch.equal(graph.x, torch.from_numpy(features.toarray()))
    assert torch.equal(graph.y, torch.from_numpy(labels.argmax(1)))
    assert (graph.to_scipy() != (adj != 0)).nnz == 0
    assert torch.equal(graph.test_idx, torch.from_numpy(ordered))


def test_cora_equals_pygs_planetoid(cora_dir: Path, tmp_path: Path) -> None:
    """PyG's own Planetoid reader, over the same files (linked, not copied),
    gives the graph graphwire reads, bit for bit, through Graph.from_pyg."""
    from torch_geometric.datasets import Planetoid
    from torch_geometric.transforms import NormalizeFeatures

    (tmp_path / "Cora").mkdir()
    (tmp_path / "Cora" / "raw").symlink_to(linked_cora(cora_dir, tmp_path))
    data = Planetoid(str(tmp_path), "Cora", transform=NormalizeFeatures())[0]
    ours = load_dataset(f"planetoid:{cora_dir}/cora")
    theirs = Graph.from_pyg(data)
    for name in ("indptr", "indices", "x", "y", "train_idx", "val_idx", "test_idx"):
        assert torch.equal(getattr(ours, name), getattr(theirs, name)), name
    assert (ours.num_nodes, ours.num_classes) == (theirs.num_nodes, 7)


# ---------------------------------------------------- general (CiteSeer) case
TOY_TEST = [11, 8, 6, 9]  # 7 and 10 have no rows (isolated, as in CiteSeer)


def toy_parts() -> dict[str, Any]:
    """A 12-node dataset with 6 non-test nodes (2 of them training) and gaps."""
    rng = np.random.default_rng(0)
    allx = rng.integers(0, 2, (6, 4)).astype(np.float32)
    allx[5] = 0  # an empty feature row stays zero after normalising
    ally = np.eye(3, dtype=np.int32)[[0, 1, 2, 0, 1, 2]]
    return {
        "x": sp.csr_matrix(allx[:2]),
        "y": ally[:2],
        "allx": sp.csr_matrix(allx),
        "ally": ally,
        "tx": sp.csr_matrix(np.arange(1, 17, dtype=np.float32).reshape(4, 4)),
        "ty": np.eye(3, dtype=np.int32)[[2, 2, 1, 0]],
        "graph": {0: [1, 1, 0], 1: [2], 6: [11], 11: [6], 8: [3]},  # dup, self-loop
        "test_index": TOY_TEST,
    }


def test_isolated_test_nodes_are_padded_and_edges_cleaned(tmp_path: Path) -> None:
    parts = toy_parts()
    allx, tx, test_index = parts["allx"].toarray(), parts["tx"].toarray(), TOY_TEST
    write_planetoid(tmp_path, "toy", **parts)
    g = load_planetoid(tmp_path, "toy", normalize_features=False)
    assert g.num_nodes == 12 and g.name == "toy"
    assert g.x is not None and g.y is not None
    assert g.train_idx is not None and g.val_idx is not None and g.test_idx is not None
    expected_x = np.zeros((12, 4), np.float32)
    expected_x[:6] = allx
    expected_x[test_index] = tx
    assert torch.equal(g.x, torch.from_numpy(expected_x))
    expected_y = [0, 1, 2, 0, 1, 2, 1, -1, 2, 0, -1, 2]
    assert g.y.tolist() == expected_y
    assert g.test_idx.tolist() == [6, 8, 9, 11]
    assert g.train_idx.tolist() == [0, 1] and g.val_idx.tolist() == list(range(2, 6))
    src, dst = g.edge_index()
    pairs = sorted(zip(src.tolist(), dst.tolist(), strict=True))
    assert pairs == [(0, 1), (1, 0), (1, 2), (2, 1), (3, 8), (6, 11), (8, 3), (11, 6)]

    normalized = load_planetoid(tmp_path, "toy").x
    assert normalized is not None
    sums = expected_x.sum(1, keepdims=True)
    expected = np.divide(
        expected_x, sums, out=np.zeros_like(expected_x), where=sums > 0
    )
    torch.testing.assert_close(normalized, torch.from_numpy(expected))
    assert not bool(normalized[[5, 7, 10]].any())


def test_normalize_features_spec_option_is_a_strict_flag(tmp_path: Path) -> None:
    """``?normalize_features=no`` (or ``off``, ``maybe``) normalised silently:
    only ``0``/``false``/``False`` turned it off. It reads like ``symmetrize=``
    of an OGB spec now: true/false, yes/no or 1/0, anything else refused."""
    write_planetoid(tmp_path, "toy", **toy_parts())
    raw = load_planetoid(tmp_path, "toy", normalize_features=False).x
    normalized = load_planetoid(tmp_path, "toy").x
    assert raw is not None and normalized is not None
    spec = f"planetoid:{tmp_path}/toy"
    for value in ("no", "No", "false", "0"):
        x = load_dataset(f"{spec}?normalize_features={value}").x
        assert x is not None and torch.equal(x, raw), value
    for value in ("yes", "TRUE", "1"):
        x = load_dataset(f"{spec}?normalize_features={value}").x
        assert x is not None and torch.equal(x, normalized), value
    x = load_dataset(spec).x  # normalised by default
    assert x is not None and torch.equal(x, normalized)
    for value in ("off", "maybe", ""):
        with pytest.raises(
            ValueError,
            match=(
                "^normalize_features: expected true/false, yes/no or 1/0, "
                f"found '{value}'$"
            ),
        ):
            load_dataset(f"{spec}?normalize_features={value}")


def test_more_training_rows_than_allx_is_named(tmp_path: Path) -> None:
    parts = toy_parts()
    parts["x"] = sp.vstack([parts["allx"], parts["allx"][:1]])
    parts["y"] = np.vstack([parts["ally"], parts["ally"][:1]])
    write_planetoid(tmp_path, "toy", **parts)
    with pytest.raises(DatasetError, match="ind.toy.y: 7 training rows, more than"):
        load_planetoid(tmp_path, "toy")


@pytest.mark.parametrize(
    "part, row, message",
    [
        ("ally", 1, "ind.toy.ally: node 1 is in the training split"),
        ("ally", 4, "ind.toy.ally: node 4 is in the validation split"),
        ("ty", 2, "ind.toy.ty: node 6 is in the test split"),  # TOY_TEST[2]
    ],
)
def test_an_unlabelled_split_node_is_named(
    tmp_path: Path, part: str, row: int, message: str
) -> None:
    parts = toy_parts()
    parts[part] = parts[part].copy()
    parts[part][row] = 0
    write_planetoid(tmp_path, "toy", **parts)
    with pytest.raises(DatasetError, match=message):
        load_planetoid(tmp_path, "toy")


# ------------------------------------------------------------ hostile input
class _RunsCommand:
    def __init__(self, func: Any, arg: str) -> None:
        self.func, self.arg = func, arg

    def __reduce__(self) -> tuple[Any, ...]:
        return (self.func, (self.arg,))


@pytest.mark.parametrize("part", ["x", "graph"])
@pytest.mark.parametrize("how", ["os.system", "builtins.exec"])
@pytest.mark.parametrize("protocol", [2, 5])  # GLOBAL and STACK_GLOBAL opcodes
def test_code_running_pickle_is_refused(
    cora_dir: Path, tmp_path: Path, part: str, how: str, protocol: int
) -> None:
    marker = tmp_path / "pwned"
    if how == "os.system":
        payload = _RunsCommand(os.system, f"touch {marker}")
    else:
        payload = _RunsCommand(exec, f"open({str(marker)!r}, 'w').close()")
    folder = linked_cora(cora_dir, tmp_path)
    for p in PARTS:
        (folder / f"ind.evil.{p}").symlink_to(cora_dir / f"ind.cora.{p}")
    path = replace(folder, part, pickle.dumps(payload, protocol=protocol), name="evil")
    with pytest.raises(DatasetError, match="forbidden global") as info:
        load_planetoid(folder, "evil")
    assert info.value.path == str(path) and str(path) in str(info.value)
    assert ("system" if how == "os.system" else "exec") in str(info.value)
    assert not marker.exists()


@pytest.mark.parametrize("part", PARTS)
def test_missing_file_is_named(cora_dir: Path, tmp_path: Path, part: str) -> None:
    folder = linked_cora(cora_dir, tmp_path)
    (folder / f"ind.cora.{part}").unlink()
    with pytest.raises(DatasetError, match=f"ind.cora.{part}: missing"):
        load_planetoid(folder, "cora")


@pytest.mark.parametrize("part", PICKLED)
def test_truncated_pickle_is_named(cora_dir: Path, tmp_path: Path, part: str) -> None:
    folder = linked_cora(cora_dir, tmp_path)
    data = (cora_dir / f"ind.cora.{part}").read_bytes()
    replace(folder, part, data[: len(data) // 2])
    with pytest.raises(DatasetError, match=f"ind.cora.{part}: truncated"):
        load_planetoid(folder, "cora")


@pytest.mark.parametrize("part", PICKLED)
def test_corrupt_pickle_is_named(cora_dir: Path, tmp_path: Path, part: str) -> None:
    folder = linked_cora(cora_dir, tmp_path)
    data = (cora_dir / f"ind.cora.{part}").read_bytes()
    replace(folder, part, data[:2] + b"\xff" * 16 + data[18:])
    with pytest.raises(DatasetError, match=f"ind.cora.{part}: corrupt"):
        load_planetoid(folder, "cora")


@pytest.mark.parametrize(
    "text, message",
    [
        ("1708\nabc\n", "expected one integer node ID per line"),
        ("\n".join(map(str, range(1708, 2708))) + "\n99999\n", "expected 1000 lines"),
    ],
)
def test_bad_test_index_is_named(
    cora_dir: Path, tmp_path: Path, text: str, message: str
) -> None:
    folder = linked_cora(cora_dir, tmp_path)
    replace(folder, "test.index", text.encode())
    with pytest.raises(DatasetError, match=f"ind.cora.test.index: {message}"):
        load_planetoid(folder, "cora")


@pytest.mark.parametrize(
    "change, message",
    [
        (lambda ids: ["99999", *ids[1:]], r"must lie in \[1708, 2708\).*99999\]"),
        (lambda ids: ["0", *ids[1:]], r"must lie in \[1708, 2708\).*\[0, "),
        (lambda ids: ["-5", *ids[1:]], r"must lie in \[1708, 2708\).*\[-5, "),
        (lambda ids: [ids[1], *ids[1:]], "more than once"),
    ],
)
def test_test_index_out_of_range_is_named(
    cora_dir: Path, tmp_path: Path, change: Any, message: str
) -> None:
    folder = linked_cora(cora_dir, tmp_path)
    ids = (cora_dir / "ind.cora.test.index").read_text().split()
    replace(folder, "test.index", "\n".join(change(ids)).encode())
    with pytest.raises(DatasetError, match=f"ind.cora.test.index: .*{message}"):
        load_planetoid(folder, "cora")


def _repickle(cora_dir: Path, folder: Path, part: str, change: Any) -> None:
    value = change(_read_pickle(cora_dir / f"ind.cora.{part}"))
    replace(folder, part, pickle.dumps(value, protocol=2))


def _set_row(
    labels: np.ndarray, row: int, fill: int, at: dict[int, int] | None = None
) -> np.ndarray:
    """``labels`` with one row set to ``fill`` (then ``at``'s column: value)."""
    labels = labels.copy()
    labels[row] = fill
    for col, value in (at or {}).items():
        labels[row, col] = value
    return labels


@pytest.mark.parametrize(
    "part, change, message",
    [
        ("y", lambda y: y[:-1], "ind.cora.y: expected 140 rows .*ind.cora.x.*139"),
        ("ty", lambda y: y[:-1], "ind.cora.ty: expected 1000 rows"),
        ("ally", lambda y: y[:, :6], "ind.cora.y: expected 6 columns"),
        ("tx", lambda x: x[:, :-1], "ind.cora.tx: expected 1433 columns"),
        ("allx", lambda x: x[:-1], "ind.cora.ally: expected 1707 rows"),
        ("y", lambda y: y[0], r"ind.cora.y: expected a 2-D labels matrix.*\(7,\)"),
        (
            "x",
            lambda x: "text",
            "ind.cora.x: expected a 2-D features matrix, found str",
        ),
        ("graph", lambda g: list(g.values()), "ind.cora.graph: expected a dict of"),
        ("graph", lambda g: {**g, 0: [5000]}, r"ind.cora.graph: node IDs.*5000"),
        ("graph", lambda g: {**g, 0: [-3]}, "ind.cora.graph: neighbour IDs must be"),
        ("graph", lambda g: {**g, 0: [1.5]}, "ind.cora.graph: neighbour IDs must be"),
        ("graph", lambda g: {**g, 0: 7}, "ind.cora.graph: expected a dict of lists"),
        ("ally", lambda y: _set_row(y, 3, 1), r"ind.cora.ally: row 3: expected a one"),
        ("ty", lambda y: _set_row(y, 8, -1), r"ind.cora.ty: row 8: .*\{0: -1, 1: -1"),
        ("y", lambda y: _set_row(y, 2, 0, {4: 2}), r"ind.cora.y: row 2: .*\{4: 2\}"),
        ("graph", lambda g: {**g, 9: [[633, 1862]]}, r"nested sequence \(at node 9\)"),
        ("graph", lambda g: {**g, 9: [[1, 2], 3]}, r"nested sequence \(at node 9\)"),
        (
            "graph",
            lambda g: {k: [list(v)] for k, v in g.items() if len(v) == 1},
            "ind.cora.graph: expected a dict of lists of integer node IDs, found a",
        ),
    ],
)
def test_inconsistent_contents_are_named(
    cora_dir: Path, tmp_path: Path, part: str, change: Any, message: str
) -> None:
    folder = linked_cora(cora_dir, tmp_path)
    _repickle(cora_dir, folder, part, change)
    with pytest.raises(DatasetError, match=message):
        load_planetoid(folder, "cora")


def test_dataset_error_is_a_value_error_and_pickles() -> None:
    error = DatasetError("/data/ind.cora.x", "truncated pickle")
    assert isinstance(error, GraphError) and isinstance(error, ValueError)
    again = pickle.loads(pickle.dumps(error))
    assert (again.path, again.problem, str(again)) == (
        "/data/ind.cora.x",
        "truncated pickle",
        "/data/ind.cora.x: truncated pickle",
    )


def _damaged_csr(matrix: Any, damage: str) -> Any:
    """A copy of ``matrix`` with one structural field broken, as a flipped byte
    in the file would leave it (scipy does not check an unpickled matrix)."""
    broken = matrix.copy()
    if damage == "index":
        broken.indices[0] = 1 << 30
    elif damage == "negative index":
        broken.indices[0] = -5
    elif damage == "indptr":
        broken.indptr[-1] = broken.indices.size + 10_000_000
    return broken


def test_corrupt_sparse_structure_is_named_not_a_crash(
    cora_dir: Path, tmp_path: Path
) -> None:
    # Without the check, toarray() writes out of bounds (a segfault, or a
    # silently wrong matrix), so this runs in a child process: one child
    # loads a copy of Cora damaged each way.
    folders = []
    for damage in ("index", "negative index", "indptr"):
        where = tmp_path / damage.replace(" ", "-")
        where.mkdir()
        folder = linked_cora(cora_dir, where)
        _repickle(cora_dir, folder, "tx", lambda tx, d=damage: _damaged_csr(tx, d))
        folders.append(str(folder))
    script = (
        "import sys\n"
        "from graphwire.graph.planetoid import load_planetoid\n"
        "from graphwire.graph.errors import DatasetError\n"
        "for folder in sys.argv[1:]:\n"
        "    try:\n"
        "        load_planetoid(folder, 'cora')\n"
        "        print('loaded')\n"
        "    except DatasetError as error:\n"
        "        print(str(error).replace(chr(10), ' '))\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", script, *folders],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    lines = result.stdout.splitlines()
    assert len(lines) == 3, result.stdout
    for line in lines:
        assert "ind.cora.tx: corrupt sparse features matrix" in line, line


def test_sparse_shape_too_large_to_densify_is_named(
    cora_dir: Path, tmp_path: Path
) -> None:
    folder = linked_cora(cora_dir, tmp_path)
    for part in ("x", "tx", "allx"):  # consistent columns, so only the cap catches it

        def widen(matrix: Any) -> Any:
            matrix._shape = (matrix.shape[0], 10**12)
            return matrix

        _repickle(cora_dir, folder, part, widen)
    with pytest.raises(DatasetError, match=r"ind.cora.x: sparse matrix of shape "):
        load_planetoid(folder, "cora")


@pytest.mark.parametrize("protocol", [2, 4])  # 2 pickles b"" as bytes()
def test_labels_without_columns_are_named(
    cora_dir: Path, tmp_path: Path, protocol: int
) -> None:
    # It was numpy's "attempt to get argmax of an empty sequence" (protocol 4)
    # and "forbidden global __builtin__.bytes" (protocol 2).
    folder = linked_cora(cora_dir, tmp_path)
    for part in ("y", "ty", "ally"):
        empty = _read_pickle(cora_dir / f"ind.cora.{part}")[:, :0]
        replace(folder, part, pickle.dumps(empty, protocol=protocol))
    with pytest.raises(DatasetError, match="ind.cora.ally: expected one-hot .*0 col"):
        load_planetoid(folder, "cora")


def test_bytes_with_an_argument_is_refused(tmp_path: Path) -> None:
    # bytes() is allowed for empty arrays; bytes(n) would allocate n bytes.
    path = tmp_path / "ind.cora.x"
    path.write_bytes(b"\x80\x02c__builtin__\nbytes\nJ\x00\x00\x00\x40\x85R.")
    with pytest.raises(DatasetError, match="ind.cora.x: corrupt pickle .*argument"):
        _read_pickle(path)
