"""graphwire's own on-disk graph format: one ``.npy`` per array plus ``meta.json``.

A graph folder holds::

    indptr.npy   int64 [N + 1]     in-edge CSR (row = destination)
    indices.npy  int64 [E]         source of each in-edge
    x.npy        float32 [N, F]    only if the graph has features
    y.npy        int64 [N]         only if it has labels
    train_idx.npy, val_idx.npy, test_idx.npy   int64 [*], those present
    meta.json    {"format": "graphwire.graph", "version": 1, "name", "num_nodes",
                  "num_edges", "num_features", "num_classes",
                  "arrays": {name: {"dtype", "shape", "sha256"}}}

``num_features`` must match x's width and ``num_classes`` the largest label + 1;
a label of ``-1`` (unlabelled) is allowed only on a node in no split (see
:mod:`graphwire.graph.labels`).

The folder is written under a temporary name and renamed into place, so a reader
never sees half of one. Loading memory-maps every array (no parsing, no copy):
the returned tensors share the page cache, so several workers on one machine
load a large graph once.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
from pathlib import Path
from typing import Any

import numpy as np
import torch

from graphwire.fsutil import (
    atomic_dir,
    load_npy,
    save_npy,
    sha256_file,
    write_json,
)
from graphwire.graph.errors import DatasetError
from graphwire.graph.features import check_finite_features
from graphwire.graph.graph import Graph, GraphError
from graphwire.graph.labels import check_labels
from graphwire.graph.seeds import is_int

__all__ = [
    "FORMAT",
    "VERSION",
    "is_array_entry",
    "is_graph_folder",
    "load_array",
    "load_graph",
    "save_graph",
]

FORMAT = "graphwire.graph"
VERSION = 1
META = "meta.json"
_ARRAYS = ("indptr", "indices", "x", "y", "train_idx", "val_idx", "test_idx")
_REQUIRED = ("indptr", "indices")
_HASH_BLOCK_BYTES = 1 << 22  # rows hashed (and checked finite) at a time


def save_graph(
    graph: Graph, folder: str | os.PathLike[str], overwrite: bool = False
) -> Path:
    """Write ``graph`` to ``folder`` atomically (all files appear at once or none).

    Args:
        graph: The graph to save; absent node arrays (``None``) are not written.
        folder: The folder to create.
        overwrite: Replace ``folder`` if it exists (otherwise that is an error).

    Returns:
        ``folder`` as a :class:`~pathlib.Path`.

    Raises:
        FileExistsError: ``folder`` exists and ``overwrite`` is false.
        ValueError: ``folder`` exists and is not a graphwire folder (a file, or
            a folder without a graphwire ``meta.json``): it is never replaced.
    """
    folder = Path(folder)
    with atomic_dir(folder, overwrite=overwrite) as tmp:
        arrays: dict[str, dict[str, Any]] = {}
        for name in _ARRAYS:
            tensor = getattr(graph, name)
            if tensor is None:
                continue
            array = np.ascontiguousarray(tensor.detach().cpu().numpy())
            arrays[name] = {
                "dtype": array.dtype.name,
                "shape": list(array.shape),
                "sha256": save_npy(tmp, name, array),
            }
        write_json(
            tmp / META,
            {
                "format": FORMAT,
                "version": VERSION,
                "name": graph.name,
                "num_nodes": graph.num_nodes,
                "num_edges": graph.num_edges,
                "num_features": graph.num_features,
                "num_classes": graph.num_classes,
                "arrays": arrays,
            },
        )
    return folder


def load_graph(
    folder: str | os.PathLike[str], mmap: bool = True, verify: bool = False
) -> Graph:
    """Load a folder written by :func:`save_graph`.

    Args:
        folder: The graph folder.
        mmap: Memory-map the arrays copy-on-write (shared page cache; an
            in-place op on a tensor writes a private copy, never the file)
            instead of reading them into memory.
        verify: Also check every array's SHA-256 against ``meta.json`` (reads
            every byte once).

    Returns:
        The :class:`Graph`; with ``mmap`` its tensors are views of the files.

    Raises:
        DatasetError: ``meta.json`` is missing, not JSON, of another format or
            version, or malformed; an array file is missing, truncated, corrupt,
            of another dtype/shape than ``meta.json`` says, or (with ``verify``)
            fails its checksum; ``meta.json``'s counts disagree with the arrays
            (``num_classes`` must be the largest label + 1); a label lies
            outside ``[0, num_classes)`` (``-1``, unlabelled, is allowed on a
            node in no split); or the arrays do not form a valid graph.
    """
    folder = Path(folder)
    meta = read_meta(folder)
    arrays: dict[str, np.ndarray] = {}
    for name, entry in meta["arrays"].items():
        path = folder / f"{name}.npy"
        arrays[name] = load_array(path, entry, mmap, verify, finite=name == "x")
    meta_path = folder / META
    for name in _REQUIRED:  # (their shapes agree with meta.json's, not with 1-D)
        if arrays[name].ndim != 1:
            raise DatasetError(
                folder / f"{name}.npy",
                f"expected a 1-D array, found shape {list(arrays[name].shape)}",
            )
    for field, found in (
        ("num_nodes", arrays["indptr"].shape[0] - 1),
        ("num_edges", arrays["indices"].shape[0]),
    ):
        if meta[field] != found:
            raise DatasetError(
                meta_path, f"{field} is {meta[field]} but the arrays hold {found}"
            )
    try:
        graph = Graph(**_as_tensors(arrays), name=str(meta["name"]))
    except GraphError as error:
        raise DatasetError(folder, f"arrays do not form a graph: {error}") from error
    if meta.get("num_features", graph.num_features) != graph.num_features:
        raise DatasetError(
            meta_path,
            f"num_features is {meta['num_features']} but the arrays hold "
            f"{graph.num_features} feature columns",
        )
    spanned = 0
    if "y" in arrays:  # shapes, split IDs and split labels: Graph checked them
        spanned = check_labels(
            folder / "y.npy",
            arrays["y"],
            {},
            meta.get("num_classes"),
            num_nodes=graph.num_nodes,
        )
    if meta.get("num_classes", spanned) != spanned:
        raise DatasetError(
            meta_path,
            f"num_classes is {meta['num_classes']} but the labels span {spanned} "
            "(num_classes must be the largest label + 1)",
        )
    return graph


def is_graph_folder(path: str | os.PathLike[str]) -> bool:
    """True when ``path`` is a folder whose ``meta.json`` names this format."""
    try:
        with open(Path(path) / META) as handle:
            meta = json.load(handle)
    except (OSError, ValueError, RecursionError):
        return False
    return isinstance(meta, dict) and meta.get("format") == FORMAT


def read_folder_meta(
    folder: Path,
    what: str,
    form: str,
    version: int,
    fields: tuple[tuple[str, type], ...],
) -> dict[str, Any]:
    """``folder/meta.json``, read and checked as far as every graphwire folder shares.

    A JSON object naming format ``form`` and ``version``, with ``fields`` of
    their types (an int is not a bool: JSON's true is 1 to Python, and 1.0
    equals 1).

    Args:
        what: what ``folder`` should be, for the errors (``"graphwire graph
            folder"``).

    Raises:
        DatasetError: naming the folder, or ``meta.json`` and what is wrong.
    """
    path = folder / META
    if not folder.is_dir():
        raise DatasetError(folder, f"not a folder (expected a {what})")
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError as error:
        raise DatasetError(path, f"missing (not a {what})") from error
    except (OSError, UnicodeDecodeError) as error:
        raise DatasetError(path, f"cannot be read ({error})") from error
    try:
        meta = json.loads(text)
    except (json.JSONDecodeError, RecursionError) as error:
        raise DatasetError(path, f"not valid JSON ({error})") from error
    if not isinstance(meta, dict):
        raise DatasetError(path, f"expected a JSON object, found {type(meta).__name__}")
    if meta.get("format") != form:
        raise DatasetError(path, f"format is {meta.get('format')!r}, expected {form!r}")
    if not is_int(meta.get("version")) or meta.get("version") != version:
        raise DatasetError(
            path,
            f"unknown version {meta.get('version')!r} (this graphwire reads "
            f"version {version}; a newer graphwire may have written it)",
        )
    for field, kind in fields:
        value = meta.get(field)
        if not (is_int(value) if kind is int else isinstance(value, kind)):
            raise DatasetError(
                path, f"field {field!r} must be a {kind.__name__}, found {value!r}"
            )
    return meta


def read_meta(folder: Path) -> dict[str, Any]:
    """Read and check ``folder/meta.json`` (format, version, field types)."""
    path = folder / META
    meta = read_folder_meta(
        folder,
        "graphwire graph folder",
        FORMAT,
        VERSION,
        (("name", str), ("num_nodes", int), ("num_edges", int), ("arrays", dict)),
    )
    for field in ("num_features", "num_classes"):
        value = meta.get(field, 0)
        if not is_int(value) or value < 0:  # (JSON: a plain int, not a bool)
            raise DatasetError(
                path, f"field {field!r} must be an int >= 0, found {value!r}"
            )
    arrays = meta["arrays"]
    unknown = sorted(set(arrays) - set(_ARRAYS))
    if unknown:
        raise DatasetError(path, f"unknown arrays {unknown}; known: {list(_ARRAYS)}")
    for name in _REQUIRED:
        if name not in arrays:
            raise DatasetError(path, f"arrays lacks the required {name!r}")
    for name, entry in arrays.items():
        if not is_array_entry(entry):
            raise DatasetError(
                path,
                f"arrays.{name} must be {{'dtype': str, 'shape': [int, ...], "
                f"'sha256': str}}, found {entry!r}",
            )
    return meta


def is_array_entry(entry: Any) -> bool:
    """Whether ``entry`` is an array's ``meta.json`` entry, as :func:`load_array` reads.

    That is ``{"dtype": str, "shape": [int, ...], "sha256": str}``. Graph and
    partitioned folders list their arrays alike."""
    return (
        isinstance(entry, dict)
        and isinstance(entry.get("dtype"), str)
        and isinstance(entry.get("shape"), list)
        and all(is_int(n) for n in entry["shape"])
        and isinstance(entry.get("sha256"), str)
    )


def load_array(
    path: Path,
    entry: dict[str, Any],
    mmap: bool,
    verify: bool,
    *,
    finite: bool = False,
) -> np.ndarray:
    """The array of ``path``, as its ``meta.json`` ``entry`` describes it.

    ``entry`` gives ``dtype``, ``shape`` and ``sha256``; the checksum is read
    only with ``verify``. Graph and partitioned folders store arrays alike.

    With ``finite``, a float array [N, F] holding nan or inf is refused
    (:func:`~graphwire.graph.features.check_finite_features`); with
    ``verify`` too, in the same read of the file as the checksum.

    Raises:
        DatasetError: naming ``path``: missing, changed (``verify``), cut
            short or corrupt, other than ``entry`` says, or not finite.
    """
    if not path.is_file():
        raise DatasetError(path, "missing (listed in meta.json)")
    try:
        # Copy-on-write ("c", MAP_PRIVATE): pages stay shared until written, and
        # a write (g.x.sub_(...)) lands in a private copy. A read-only map
        # ("r") would make any in-place op on the tensors a segfault.
        array = load_npy(path, mmap_mode="c" if mmap else None)
    except (ValueError, OSError, EOFError) as error:
        if verify:  # a file cut short changed after it was written: say so
            _check_digest(path, sha256_file(path), entry)
        raise DatasetError(path, f"truncated or corrupt .npy ({error})") from error
    if not isinstance(array, np.ndarray):  # an .npz archive, open
        array.close()
        if verify:
            _check_digest(path, sha256_file(path), entry)
        raise DatasetError(path, "expected one array, found an archive")
    finite_seen = False
    if verify:
        digest, finite_seen = _digest_as_loaded(path, array, finite)
        _check_digest(path, digest, entry)
    if array.dtype.name != entry["dtype"] or list(array.shape) != entry["shape"]:
        raise DatasetError(
            path,
            f"holds {array.dtype.name} {list(array.shape)}, but meta.json says "
            f"{entry['dtype']} {entry['shape']}",
        )
    if not array.dtype.isnative:
        order = "big" if array.dtype.byteorder == ">" else "little"
        raise DatasetError(
            path,
            f"{order}-endian, not in this machine's byte order (convert it: "
            "a.astype(a.dtype.newbyteorder('=')))",
        )
    if finite and not finite_seen:  # (on a failure, for the first bad entry)
        check_finite_features(array, path)
    return array


def _check_digest(path: Path, digest: str, entry: dict[str, Any]) -> None:
    if digest != entry["sha256"]:
        raise DatasetError(
            path,
            f"checksum mismatch: sha256 is {digest}, meta.json says "
            f"{entry['sha256']} (the file changed after it was written)",
        )


def _digest_as_loaded(path: Path, array: np.ndarray, finite: bool) -> tuple[str, bool]:
    """The SHA-256 of ``path`` from its header's bytes and ``array``'s, the
    file's data as loaded (memory-mapped or read): one read of the file, not
    one for the checksum and another for the data. With ``finite``, also
    whether a float [N, F] ``array`` is all finite, block by block as it is
    hashed (True: checked and finite).

    An ``.npy`` file is its header and then the data to its end, so the
    header is the file's first ``size - nbytes`` bytes; any other file (bytes
    after the data) hashes differently from the file written. An array not
    in C order is hashed from the file instead.
    """
    size = path.stat().st_size
    if not array.flags.c_contiguous or array.nbytes > size:
        return sha256_file(path), False
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        digest.update(handle.read(size - array.nbytes))
    check = finite and array.ndim == 2 and np.issubdtype(array.dtype, np.floating)
    rows = array.reshape(-1, 1) if array.ndim < 2 else array
    row_bytes = max(1, rows.itemsize * math.prod(rows.shape[1:]))
    step = max(1, _HASH_BLOCK_BYTES // row_bytes)
    clean = True
    for start in range(0, rows.shape[0], step):
        block = rows[start : start + step]
        digest.update(block.data)
        if check and clean:
            clean = bool(np.isfinite(block).all())
    return digest.hexdigest(), check and clean


def _as_tensors(arrays: dict[str, np.ndarray]) -> dict[str, torch.Tensor]:
    """Share each array's memory with a tensor (no copy, mmap stays mmap)."""
    return {name: torch.from_numpy(array) for name, array in arrays.items()}
