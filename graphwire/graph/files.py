"""Plain graph files: ``.npz`` archives and text edge lists (``.gz`` allowed).

An ``.npz`` graph holds (E edges, N nodes, F features)::

    src, dst    integer [E]    edge ``src[k] -> dst[k]``        (required)
    num_nodes   integer []     defaults to rows of x/y, else max ID + 1
    x           float [N, F]   y  integer [N]                    (optional)
    train_idx, val_idx, test_idx   integer [*]                   (optional)

An edge list has one ``src dst`` pair per line, split on whitespace or a given
delimiter; ``comment`` starts a comment; blank lines are skipped.

Text is parsed by ``np.loadtxt``, whose C reader (numpy >= 1.23) streams the
file, checks that every line has the same number of columns and names the row
of a bad token. ``np.fromstring`` plus a vectorised per-line column check was
no faster, so the simpler path is kept.
"""

from __future__ import annotations

import gzip
import os
import warnings
import zipfile
import zlib
from pathlib import Path
from typing import IO, Any

import numpy as np

from graphwire.fsutil import atomic_file
from graphwire.graph.errors import DatasetError
from graphwire.graph.features import check_finite_features
from graphwire.graph.graph import Graph, GraphError
from graphwire.graph.labels import check_class_count

__all__ = ["load_edgelist", "load_npz", "read_table", "save_npz"]

_NPZ_OPTIONAL = ("num_nodes", "x", "y", "train_idx", "val_idx", "test_idx")


def read_table(
    path: str | os.PathLike[str],
    dtype: type | np.dtype[Any],
    num_cols: int | None = None,
    delimiter: str | None = ",",
    comment: str | None = "#",
) -> np.ndarray:
    """Parse a text table of numbers (gzip-compressed when the name ends in .gz).

    Args:
        path: The file.
        dtype: The numpy dtype to parse into (e.g. ``np.int64``, ``np.float32``).
        num_cols: Columns every line must have; ``None`` accepts any number as
            long as all lines agree.
        delimiter: Column separator; ``None`` splits on runs of whitespace.
        comment: Text after this marker is ignored; ``None`` for no comments.

    Returns:
        ``dtype`` [rows, cols]; ``[0, num_cols or 0]`` for a file with no rows.

    Raises:
        DatasetError: Missing file, truncated or corrupt gzip, non-ASCII text,
            a token that is not a number, or lines with the wrong column count.
    """
    path = Path(path)
    try:
        with _open_text(path) as handle, warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)  # "input contained no data"
            table = np.loadtxt(
                handle, dtype=dtype, delimiter=delimiter, comments=comment, ndmin=2
            )
    except FileNotFoundError as error:
        raise DatasetError(path, "missing") from error
    except EOFError as error:
        raise DatasetError(path, f"truncated gzip ({error})") from error
    except (gzip.BadGzipFile, zlib.error) as error:
        raise DatasetError(path, f"corrupt gzip ({error})") from error
    except UnicodeDecodeError as error:
        raise DatasetError(path, f"not ASCII text ({error})") from error
    except (ValueError, OSError) as error:
        raise DatasetError(path, f"cannot parse as a table ({error})") from error
    if table.size == 0:
        return np.zeros((0, num_cols or 0), dtype=dtype)
    if num_cols is not None and table.shape[1] != num_cols:
        raise DatasetError(
            path, f"expected {num_cols} columns per line, found {table.shape[1]}"
        )
    return table


def _open_text(path: Path) -> IO[str]:
    if path.name.endswith(".gz"):
        return gzip.open(path, "rt", encoding="ascii")
    return open(path, encoding="ascii")


def load_edgelist(
    path: str | os.PathLike[str],
    num_nodes: int | None = None,
    comment: str | None = "#",
    delimiter: str | None = None,
) -> Graph:
    """Load a directed graph from lines ``src dst`` (kept as listed, no dedup).

    Args:
        path: Text file, optionally ``.gz``.
        num_nodes: Number of nodes; default: largest ID + 1.
        comment: Comment marker (``None``: no comments).
        delimiter: Column separator (``None``: whitespace; e.g. ``","`` for CSV).

    Returns:
        A :class:`Graph` without node data, named after the file.

    Raises:
        DatasetError: Unreadable text, not two integer columns, or IDs outside
            ``[0, num_nodes)``.
    """
    path = Path(path)
    table = read_table(path, np.int64, 2, delimiter=delimiter, comment=comment)
    src, dst = table[:, 0], table[:, 1]
    num_nodes = _check_ids(path, "edge", src, dst, num_nodes)
    return Graph.from_edge_index(src, dst, num_nodes=num_nodes, name=_stem(path))


def load_npz(path: str | os.PathLike[str]) -> Graph:
    """Load a graph from an ``.npz`` archive (see module doc; no pickles).

    Labels span ``max(y) + 1`` classes; ``-1`` marks an unlabelled node, allowed
    only outside the train/val/test splits.

    Raises:
        DatasetError: Missing, truncated or corrupt archive; missing or unknown
            arrays; wrong dtypes or shapes; node IDs out of range; a label below
            ``-1``, ``-1`` on a node in a split, or as large as the node count
            (more classes than nodes).
    """
    path = Path(path)
    arrays = _read_npz(path)
    for name in ("src", "dst"):
        if name not in arrays:
            raise DatasetError(path, f"lacks the required array {name!r}")
    unknown = sorted(set(arrays) - {"src", "dst", *_NPZ_OPTIONAL})
    if unknown:
        raise DatasetError(
            path,
            f"unknown arrays {unknown}; known: src, dst, {', '.join(_NPZ_OPTIONAL)}",
        )
    src, dst = arrays.pop("src"), arrays.pop("dst")
    for name, array in (("src", src), ("dst", dst)):
        if array.ndim != 1 or not np.issubdtype(array.dtype, np.integer):
            raise DatasetError(
                path,
                f"array {name!r}: expected integer [E], found {array.dtype} "
                f"{list(array.shape)}",
            )
    if src.shape != dst.shape:
        raise DatasetError(
            path, f"src and dst differ in length ({src.shape[0]} vs {dst.shape[0]})"
        )
    if "x" in arrays:
        check_finite_features(arrays["x"], path, "array 'x'")
    num_nodes = _npz_num_nodes(path, arrays)
    num_nodes = _check_ids(path, "edge", src, dst, num_nodes)
    try:
        graph = Graph.from_edge_index(
            src, dst, num_nodes=num_nodes, name=_stem(path), **arrays
        )
    except GraphError as error:  # labels too: -1 is allowed only off the splits
        raise DatasetError(path, f"array {error}") from error
    if graph.y is not None:
        check_class_count(path, "array 'y'", graph.y.numpy(), graph.num_nodes)
    return graph


def save_npz(graph: Graph, path: str | os.PathLike[str]) -> Path:
    """Write ``graph`` as an ``.npz`` archive :func:`load_npz` reads back exactly.

    The file appears complete or not at all (temporary file, then rename).
    """
    path = Path(path)
    src, dst = graph.edge_index()
    arrays: dict[str, np.ndarray] = {
        "src": src.numpy(),
        "dst": dst.numpy(),
        "num_nodes": np.asarray(graph.num_nodes, dtype=np.int64),
    }
    for name in _NPZ_OPTIONAL[1:]:
        tensor = getattr(graph, name)
        if tensor is not None:
            arrays[name] = tensor.detach().cpu().numpy()
    with atomic_file(path, "wb") as handle:
        np.savez(handle, **arrays)  # type: ignore[arg-type]
    return path


# --------------------------------------------------------------------- helpers
def _read_npz(path: Path) -> dict[str, np.ndarray]:
    """Every array of the archive, read now so damage is reported here."""
    if not path.is_file():
        raise DatasetError(path, "missing")
    arrays: dict[str, np.ndarray] = {}
    try:
        # Our own handle: np.load leaks its file when the zip directory is bad.
        with open(path, "rb") as handle:
            magic = np.lib.format.MAGIC_PREFIX  # how a single .npy array starts
            start = handle.read(len(magic))
            if start == magic:
                raise DatasetError(path, "expected an .npz archive, found one array")
            if not start.startswith(b"PK"):  # numpy would suggest allow_pickle
                raise DatasetError(
                    path, "not an .npz archive (it does not start as a zip file does)"
                )
            handle.seek(0)
            archive = np.load(handle, allow_pickle=False)
            if not isinstance(archive, np.lib.npyio.NpzFile):
                raise DatasetError(path, "expected an .npz archive, found one array")
            with archive:
                for name in archive.files:
                    arrays[name] = archive[name]
                    if not isinstance(arrays[name], np.ndarray):
                        # np.load hands back the raw bytes of such a member
                        raise DatasetError(
                            path,
                            f"array {name!r}: not an .npy array (its member does "
                            "not start with the .npy header)",
                        )
    except DatasetError:
        raise
    except (zipfile.BadZipFile, EOFError, zlib.error) as error:
        raise DatasetError(path, f"truncated or corrupt archive ({error})") from error
    except (ValueError, OSError) as error:
        raise DatasetError(path, f"not a readable .npz archive ({error})") from error
    return arrays


def _npz_num_nodes(path: Path, arrays: dict[str, np.ndarray]) -> int | None:
    if "num_nodes" in arrays:
        value = arrays.pop("num_nodes")
        if value.shape != () or not np.issubdtype(value.dtype, np.integer):
            raise DatasetError(
                path,
                f"array 'num_nodes': expected one integer, found {value.dtype} "
                f"{list(value.shape)}",
            )
        return int(value)
    for name in ("x", "y"):
        if name in arrays and arrays[name].ndim >= 1:
            return int(arrays[name].shape[0])
    return None


# The most nodes a largest ID may imply (N + 1 int64 row offsets alone take
# 16 GiB there): a larger ID is most likely a label never mapped to a row.
_MAX_INFERRED_NODES = 1 << 31


def _check_ids(
    path: Path, what: str, src: np.ndarray, dst: np.ndarray, num_nodes: int | None
) -> int:
    """Check ``src``/``dst`` lie in ``[0, num_nodes)``; return ``num_nodes``."""
    high = int(max(src.max(initial=-1), dst.max(initial=-1)))
    low = int(min(src.min(initial=0), dst.min(initial=0)))
    if num_nodes is None:
        num_nodes = high + 1
        if num_nodes > _MAX_INFERRED_NODES:
            raise DatasetError(
                path,
                f"{what} node ID {high} would make {num_nodes:,} nodes (IDs are "
                f"rows 0..N-1, N at most 2**31): relabel the IDs to 0..N-1",
            )
    elif num_nodes > _MAX_INFERRED_NODES:  # given (npz array, spec option): as capped
        raise DatasetError(
            path,
            f"num_nodes is {num_nodes:,}, more than 2**31 (N + 1 int64 row "
            "offsets alone would take over 16 GiB); expected the node count",
        )
    if num_nodes < 0 or low < 0 or high >= num_nodes:
        raise DatasetError(
            path,
            f"{what} node IDs must lie in [0, {num_nodes}), found range "
            f"[{low}, {high}]",
        )
    return num_nodes


def _stem(path: Path) -> str:
    name = path.name
    for suffix in (".gz", ".npz", ".txt", ".csv", ".tsv", ".edges", ".el"):
        name = name.removesuffix(suffix)
    return name or path.name
