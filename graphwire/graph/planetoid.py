"""Planetoid citation graphs (Cora, CiteSeer, PubMed) from Kipf's ``ind.*`` files.

A dataset ``NAME`` is eight files in one folder::

    ind.NAME.x, .tx, .allx    features (scipy sparse or dense) of the labelled
                              training nodes, the test nodes, all non-test nodes
    ind.NAME.y, .ty, .ally    one-hot labels, row for row with the features
    ind.NAME.graph            dict {node: [neighbour, ...]}
    ind.NAME.test.index       text, one test node ID per line

Seven of them are Python pickles. They are never handed to plain ``pickle``: a
restricted unpickler admits only the numpy/scipy/container globals these files
use and refuses anything else (a pickle can name any callable and run it).

The result matches PyG's ``Planetoid(split="public")``: row ``j`` of ``tx``/``ty``
belongs to node ``test.index[j]``; test-range nodes with no row (CiteSeer's
isolated nodes) get zero features; edges are made symmetric, deduplicated and
stripped of self-loops; train = ``range(len(y))``, val = the next 500 nodes
(fewer if ``allx`` ends sooner), test = the sorted test index. One deliberate
difference: a node whose one-hot label row is all zero gets label ``-1``
(unlabelled), not class 0.

Shapes of the returned :class:`Graph` (N nodes, F features; Cora: 2708, 1433):
    x float32 [N, F] (rows sum to 1 with ``normalize_features``), y int64 [N],
    train_idx/val_idx/test_idx int64 (Cora: 140 / 500 / 1000).
"""

from __future__ import annotations

import codecs
import functools
import importlib
import io
import os
import pickle
from pathlib import Path
from typing import Any

import numpy as np

from graphwire.graph.errors import DatasetError
from graphwire.graph.features import check_finite_features
from graphwire.graph.graph import Graph

__all__ = ["load_planetoid"]

NUM_VAL = 500  # size of the public validation split (Kipf & Welling)
_PICKLED = ("x", "tx", "allx", "y", "ty", "ally", "graph")


def load_planetoid(
    folder: str | os.PathLike[str], name: str, normalize_features: bool = True
) -> Graph:
    """Load ``folder/ind.<name>.*`` as a symmetric graph with the public split.

    Args:
        folder: The folder holding the eight ``ind.<name>.*`` files (read in place).
        name: The dataset prefix, e.g. ``"cora"``, ``"citeseer"``, ``"pubmed"``.
        normalize_features: Divide each feature row by its sum (zero rows stay zero).

    Returns:
        A :class:`Graph` named ``name`` with ``x``, ``y`` and the three splits.

    Raises:
        DatasetError: A file is missing, not a safe pickle, truncated or corrupt,
            holds arrays of inconsistent shapes, or names node IDs out of range.
    """
    folder = Path(folder)
    paths = {part: folder / f"ind.{name}.{part}" for part in (*_PICKLED, "test.index")}
    for path in paths.values():
        if not path.is_file():
            raise DatasetError(path, f"missing (planetoid dataset {name!r} needs it)")
    raw = {part: _read_pickle(paths[part]) for part in _PICKLED}
    x, tx, allx = (_matrix(raw[p], paths[p], "features") for p in ("x", "tx", "allx"))
    y, ty, ally = (_matrix(raw[p], paths[p], "labels") for p in ("y", "ty", "ally"))
    test_index = _read_test_index(paths["test.index"])

    # Rows pair up file by file; columns agree across the three files of a kind.
    _same(paths["y"], y.shape[0], "rows", paths["x"], x.shape[0])
    _same(paths["ally"], ally.shape[0], "rows", paths["allx"], allx.shape[0])
    _same(paths["ty"], ty.shape[0], "rows", paths["tx"], tx.shape[0])
    _same(paths["test.index"], test_index.size, "lines", paths["tx"], tx.shape[0])
    for part, feats in (("x", x), ("tx", tx)):
        _same(paths[part], feats.shape[1], "columns", paths["allx"], allx.shape[1])
    for part, labels in (("y", y), ("ty", ty)):
        _same(paths[part], labels.shape[1], "columns", paths["ally"], ally.shape[1])
    # Densified only now that the shapes agree (a sparse header can claim any).
    x, tx, allx = (
        _dense(m, paths[p]) for m, p in ((x, "x"), (tx, "tx"), (allx, "allx"))
    )
    y, ty, ally = (
        _dense(m, paths[p]) for m, p in ((y, "y"), (ty, "ty"), (ally, "ally"))
    )
    for part, feats in (("x", x), ("tx", tx), ("allx", allx)):
        # Before row normalisation, which would spread one nan over its row.
        check_finite_features(feats, paths[part], "features")

    for part, labels in (("y", y), ("ty", ty), ("ally", ally)):
        _check_one_hot(labels, paths[part])
    if ally.shape[1] == 0:
        raise DatasetError(
            paths["ally"], "expected one-hot label rows, found 0 columns (no classes)"
        )

    graph_dict = raw["graph"]
    if not isinstance(graph_dict, dict):
        raise DatasetError(
            paths["graph"],
            f"expected a dict of lists, found {type(graph_dict).__name__}",
        )
    src, dst = _edges_from_dict(graph_dict, paths["graph"])
    known = max(len(graph_dict), int(max(src.max(initial=-1), dst.max(initial=-1))) + 1)

    num_train_pool = allx.shape[0]
    if test_index.size and (
        int(test_index.min()) < num_train_pool or int(test_index.max()) >= known
    ):
        raise DatasetError(
            paths["test.index"],
            f"node IDs must lie in [{num_train_pool}, {known}) (after the "
            f"{num_train_pool} rows of allx, within the {known} nodes of the graph), "
            f"found range [{int(test_index.min())}, {int(test_index.max())}]",
        )
    if np.unique(test_index).size != test_index.size:
        raise DatasetError(paths["test.index"], "lists a node ID more than once")
    num_nodes = max(num_train_pool, int(test_index.max(initial=-1)) + 1)
    if src.size and int(max(src.max(), dst.max())) >= num_nodes:
        raise DatasetError(
            paths["graph"],
            f"node IDs must lie in [0, {num_nodes}) (the nodes with features), "
            f"found up to {int(max(src.max(), dst.max()))}",
        )
    num_train = y.shape[0]
    if num_train > num_train_pool:
        raise DatasetError(
            paths["y"],
            f"{num_train} training rows, more than the {num_train_pool} rows of "
            f"{paths['allx'].name} they are taken from",
        )
    val_end = min(num_train + NUM_VAL, num_train_pool)  # never reaches test nodes

    # Row j of tx/ty belongs to node test_index[j]; unlisted test-range nodes
    # (CiteSeer's isolated ones) keep zero rows.
    features = np.zeros((num_nodes, allx.shape[1]), dtype=np.float32)
    features[:num_train_pool] = allx
    features[test_index] = tx
    onehot = np.zeros((num_nodes, ally.shape[1]), dtype=ally.dtype)
    onehot[:num_train_pool] = ally
    onehot[test_index] = ty
    labels = onehot.argmax(axis=1).astype(np.int64)
    unlabelled = np.logical_not(onehot.any(axis=1))
    labels[unlabelled] = -1
    for part, split, rows in (
        ("ally", "training", np.arange(num_train)),
        ("ally", "validation", np.arange(num_train, val_end)),
        ("ty", "test", test_index),
    ):
        if unlabelled[rows].any():
            raise DatasetError(
                paths[part],
                f"node {int(rows[unlabelled[rows]][0])} is in the {split} split but "
                "its label row is all zeros (unlabelled)",
            )
    if normalize_features:
        features = _row_normalize(features)

    src, dst = _symmetric_simple(src, dst, num_nodes)
    return Graph.from_edge_index(
        src,
        dst,
        num_nodes=num_nodes,
        x=features,
        y=labels,
        train_idx=np.arange(num_train, dtype=np.int64),
        val_idx=np.arange(num_train, val_end, dtype=np.int64),
        test_idx=np.sort(test_index),
        name=name,
    )


# ------------------------------------------------------------ restricted pickle
def _latin1_encode(text: str, encoding: str = "utf-8") -> bytes:
    # Protocol-2 pickles written by Python 3 store bytes as _codecs.encode(s, "latin1").
    if codecs.lookup(encoding).name != "iso8859-1":
        raise pickle.UnpicklingError(f"_codecs.encode with encoding {encoding!r}")
    return text.encode("latin1")


def _empty_bytes(*args: Any) -> bytes:
    # Protocol-2 pickles written by Python 3 store b"" (an empty array's data)
    # as bytes(); bytes(n) would allocate n bytes, so only the empty call passes.
    if args:
        raise pickle.UnpicklingError("builtins.bytes called with arguments")
    return b""


def _reconstruct(subtype: Any, shape: Any, dtype: Any) -> np.ndarray:
    # numpy pickles an array as _reconstruct(ndarray, (0,), b"b") + __setstate__;
    # refuse other subtypes and big shells (a cheap way to exhaust memory).
    if subtype is not np.ndarray or tuple(shape) != (0,):
        raise pickle.UnpicklingError("unexpected numpy _reconstruct arguments")
    return np.ndarray.__new__(np.ndarray, (0,), dtype)


@functools.cache
def _allowed_globals() -> dict[tuple[str, str], Any]:
    """``(module, name) -> object`` for every global a planetoid pickle may name."""
    import collections

    import scipy.sparse as sp

    numpy_core = importlib.import_module(
        "numpy._core" if hasattr(np, "_core") else "numpy.core"
    )
    multiarray = importlib.import_module(f"{numpy_core.__name__}.multiarray")
    numeric = importlib.import_module(f"{numpy_core.__name__}.numeric")
    allowed: dict[tuple[str, str], Any] = {
        ("numpy", "ndarray"): np.ndarray,
        ("numpy", "dtype"): np.dtype,
        ("collections", "defaultdict"): collections.defaultdict,
        ("collections", "OrderedDict"): collections.OrderedDict,
        ("_codecs", "encode"): _latin1_encode,
        ("__builtin__", "bytes"): _empty_bytes,
        ("builtins", "bytes"): _empty_bytes,
    }
    for core in ("numpy.core", "numpy._core"):
        allowed[(f"{core}.multiarray", "_reconstruct")] = _reconstruct
        allowed[(f"{core}.multiarray", "scalar")] = multiarray.scalar
        allowed[(f"{core}.numeric", "_frombuffer")] = numeric._frombuffer
    for module in ("scipy.sparse", "scipy.sparse.csr", "scipy.sparse._csr"):
        allowed[(module, "csr_matrix")] = sp.csr_matrix
    for builtins in ("builtins", "__builtin__"):
        for container in (list, dict, set, frozenset, tuple):
            allowed[(builtins, container.__name__)] = container
    return allowed


class _RestrictedUnpickler(pickle.Unpickler):
    """Resolves only allow-listed globals; anything else is a :class:`DatasetError`."""

    def __init__(self, data: bytes, path: Path) -> None:
        super().__init__(io.BytesIO(data), encoding="latin1")
        self._path = path

    def find_class(self, module: str, name: str) -> Any:
        found = _allowed_globals().get((module, name))
        if found is None:
            raise DatasetError(
                self._path,
                f"refusing to unpickle forbidden global {module}.{name} (planetoid "
                "files may only hold numpy arrays, scipy CSR matrices and dicts)",
            )
        return found


def _read_pickle(path: Path) -> Any:
    try:
        data = path.read_bytes()
    except OSError as error:
        raise DatasetError(path, f"cannot be read ({error.strerror})") from error
    if not data:
        raise DatasetError(path, "is empty")
    try:
        return _RestrictedUnpickler(data, path).load()
    except DatasetError:
        raise
    except EOFError as error:
        raise DatasetError(
            path, f"truncated pickle (ends early after {len(data)} bytes)"
        ) from error
    except Exception as error:  # a corrupt pickle can raise almost any type
        problem = "truncated" if "truncated" in str(error) else "corrupt"
        raise DatasetError(
            path, f"{problem} pickle ({type(error).__name__}: {error})"
        ) from error


# ---------------------------------------------------------------- conversions
# The most entries a matrix may densify to (16 GiB of float32; PubMed's allx
# has 9.1M): a larger shape in a sparse header is damage, not a dataset.
_MAX_DENSE_ENTRIES = 1 << 32


def _matrix(value: Any, path: Path, what: str) -> Any:
    """A 2-D ndarray, or a scipy CSR matrix checked but not yet densified.

    An unpickled CSR matrix is whatever the file says: an index past its row
    or an ``indptr`` past ``indices`` makes ``toarray()`` write out of bounds
    (a segfault), so its structure is checked in full here.
    """
    if hasattr(value, "toarray") and hasattr(value, "shape"):
        try:
            value.check_format(full_check=True)
            rows, cols = (int(n) for n in value.shape)
        except Exception as error:  # a damaged matrix raises various types
            raise DatasetError(
                path,
                f"corrupt sparse {what} matrix ({type(error).__name__}: {error})",
            ) from error
        if rows < 0 or cols < 0:
            raise DatasetError(
                path, f"corrupt sparse {what} matrix: shape {value.shape}"
            )
        if not (np.issubdtype(value.dtype, np.number) or value.dtype == np.bool_):
            raise DatasetError(
                path, f"expected numeric {what}, found dtype {value.dtype}"
            )
        return value
    if not isinstance(value, np.ndarray) or value.ndim != 2:
        found = getattr(value, "shape", type(value).__name__)
        raise DatasetError(path, f"expected a 2-D {what} matrix, found {found}")
    if not (np.issubdtype(value.dtype, np.number) or value.dtype == np.bool_):
        raise DatasetError(path, f"expected numeric {what}, found dtype {value.dtype}")
    return value


def _dense(value: Any, path: Path) -> np.ndarray:
    """``value`` (from :func:`_matrix`) as a dense ndarray."""
    if isinstance(value, np.ndarray):
        return value
    rows, cols = value.shape
    if rows * cols > _MAX_DENSE_ENTRIES:
        raise DatasetError(
            path,
            f"sparse matrix of shape ({rows}, {cols}) has {rows * cols:,} entries "
            f"when dense, more than {_MAX_DENSE_ENTRIES:,} (a damaged header?)",
        )
    try:
        return np.asarray(value.toarray())
    except MemoryError as error:
        raise DatasetError(
            path, f"sparse matrix of shape ({rows}, {cols}) does not fit in memory"
        ) from error


def _check_one_hot(labels: np.ndarray, path: Path) -> None:
    """Refuse a label row that is not one 1 among zeros (all zeros: unlabelled).

    argmax would make a multi-hot row, or one of -1s, class 0 without a word.
    """
    zeros = np.count_nonzero(labels == 0, axis=1)
    ones = np.count_nonzero(labels == 1, axis=1)
    width = labels.shape[1]
    bad = ~((zeros == width) | ((ones == 1) & (zeros == width - 1)))
    if bad.any():
        row = int(np.flatnonzero(bad)[0])
        cols = np.flatnonzero(labels[row])
        values = {int(c): labels[row, c].item() for c in cols[:5]}
        more = ", ..." if cols.size > 5 else ""
        raise DatasetError(
            path,
            f"row {row}: expected a one-hot label row (one 1, zeros elsewhere) or "
            f"all zeros, found nonzero entries {{column: value}} {values}{more} "
            f"({int(bad.sum())} such rows)",
        )


def _read_test_index(path: Path) -> np.ndarray:
    try:
        tokens = path.read_text(encoding="ascii").split()
        return np.array(tokens, dtype=np.int64) if tokens else np.zeros(0, np.int64)
    except (OSError, UnicodeDecodeError, ValueError, OverflowError) as error:
        raise DatasetError(
            path, f"expected one integer node ID per line ({error})"
        ) from error


def _edges_from_dict(
    graph: dict[Any, Any], path: Path
) -> tuple[np.ndarray, np.ndarray]:
    """``(src, dst)`` int64 [E] from ``{node: [neighbour, ...]}``, as listed."""
    try:
        keys = np.asarray(list(graph.keys()))
        counts = np.fromiter(map(len, graph.values()), np.int64, count=len(graph))
        neighbours = np.asarray([n for values in graph.values() for n in values])
    except TypeError as error:
        raise DatasetError(path, f"expected a dict of lists ({error})") from error
    except ValueError:  # numpy cannot make one flat array of nested sequences
        keys = neighbours = np.zeros((0, 0))
    if keys.ndim != 1 or neighbours.ndim != 1:
        nested = next(  # a Python loop over the nodes, only to name one
            (k for k, v in graph.items() if np.ndim(k) or any(map(np.ndim, v))), None
        )
        raise DatasetError(
            path,
            "expected a dict of lists of integer node IDs, found a nested sequence "
            f"(at node {nested!r})",
        )
    for label, ids in (("keys", keys), ("neighbour IDs", neighbours)):
        if ids.size and not np.issubdtype(ids.dtype, np.integer):
            raise DatasetError(path, f"{label} must be integers, found {ids.dtype}")
        if ids.size and int(ids.min()) < 0:
            raise DatasetError(path, f"{label} must be >= 0, found {int(ids.min())}")
    src = np.repeat(keys.astype(np.int64), counts)
    return src, neighbours.astype(np.int64).reshape(-1)


def _symmetric_simple(
    src: np.ndarray, dst: np.ndarray, num_nodes: int
) -> tuple[np.ndarray, np.ndarray]:
    """Both directions of every edge, once each, no self-loops; sorted by dst, src."""
    both_src = np.concatenate([src, dst])
    both_dst = np.concatenate([dst, src])
    keep = both_src != both_dst
    key = np.unique(both_dst[keep] * np.int64(num_nodes) + both_src[keep])
    return key % num_nodes, key // num_nodes


def _row_normalize(features: np.ndarray) -> np.ndarray:
    """Divide each row by its sum; all-zero rows stay zero. float32 [N, F]."""
    sums = features.sum(axis=1, keepdims=True)
    return np.divide(
        features, sums, out=np.zeros_like(features), where=sums != 0
    ).astype(np.float32, copy=False)


def _same(path: Path, found: int, what: str, other: Path, expected: int) -> None:
    if found != expected:
        raise DatasetError(
            path, f"expected {expected} {what} (as many as {other.name}), found {found}"
        )
