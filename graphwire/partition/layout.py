"""What a partitioned folder holds, and the checks that it holds it.

The layout is described in :mod:`graphwire.partition.format`, which writes
and loads such folders: :func:`load_partition_meta` checks ``meta.json``
alone (so every rank refuses a bad folder alike), :func:`check_part` one
part's arrays once loaded. Each failure is a
:class:`~graphwire.graph.errors.DatasetError` naming the file at fault.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import numpy as np

from graphwire.graph.errors import DatasetError
from graphwire.graph.native import is_array_entry, read_folder_meta
from graphwire.graph.order import NODE_ORDERS
from graphwire.graph.seeds import is_int

__all__ = [
    "FORMAT",
    "META",
    "SPLIT_ARRAYS",
    "SPLITS",
    "VERSION",
    "check_part",
    "check_part_count",
    "load_partition_meta",
    "part_folder",
]

FORMAT = "graphwire.partitioned"
VERSION = 1
META = "meta.json"
_REQUIRED = ("orig_nid", "indptr", "indices", "halo_nid")
_OPTIONAL = ("x", "y", "train_local", "val_local", "test_local")
SPLITS = ("train", "val", "test")
SPLIT_ARRAYS = tuple(f"{split}_local" for split in SPLITS)
#: dtype and number of dimensions of every array, as the layout fixes them.
_KINDS: dict[str, tuple[str, int]] = {
    "orig_nid": ("int64", 1),
    "indptr": ("int64", 1),
    "indices": ("int64", 1),
    "halo_nid": ("int64", 1),
    "x": ("float32", 2),
    "y": ("int64", 1),
    **{name: ("int64", 1) for name in SPLIT_ARRAYS},
}


def part_folder(folder: str | os.PathLike[str], part_id: int) -> Path:
    """``folder/part_<part_id>``."""
    return Path(folder) / f"part_{part_id}"


def load_partition_meta(folder: str | os.PathLike[str]) -> dict[str, Any]:
    """Read and check a partitioned folder's ``folder/meta.json``.

    Checked: format, version, field types, offsets, every part's counts and x
    width against the graph-wide fields, and every array's dtype and number of
    dimensions against the format's.

    Raises:
        DatasetError: naming ``meta.json`` and the field that is wrong, or the
            part's file that ``meta.json`` lists with a dtype or number of
            dimensions other than the format's.
    """
    folder = Path(folder)
    path = folder / META
    meta = read_folder_meta(
        folder,
        "partitioned graph folder",
        FORMAT,
        VERSION,
        (
            ("name", str),
            ("num_nodes", int),
            ("num_edges", int),
            ("num_features", int),
            ("num_classes", int),
            ("num_parts", int),
            ("method", str),
            ("params", dict),
            ("offsets", list),
            ("parts", list),
        ),
    )
    num_parts, offsets = meta["num_parts"], meta["offsets"]
    if num_parts < 1:
        raise DatasetError(path, f"field 'num_parts' must be >= 1, found {num_parts}")
    if len(offsets) != num_parts + 1 or len(meta["parts"]) != num_parts:
        check_part_count(folder, num_parts)  # num_parts edited, or parts lost?
    if (
        len(offsets) != num_parts + 1
        or not all(is_int(o) for o in offsets)
        or offsets[0] != 0
        or offsets[-1] != meta["num_nodes"]
        or any(b < a for a, b in zip(offsets, offsets[1:], strict=False))
    ):
        raise DatasetError(
            path,
            f"offsets must be {num_parts + 1} non-decreasing ints from 0 to "
            f"num_nodes={meta['num_nodes']}, found {offsets[:8]!r}",
        )
    if len(meta["parts"]) != num_parts:
        raise DatasetError(
            path, f"parts lists {len(meta['parts'])} entries, num_parts is {num_parts}"
        )
    # Folders written before the field existed number their parts by ID.
    order = meta.setdefault("node_order", "id")
    if order not in NODE_ORDERS:
        raise DatasetError(
            path, f"field 'node_order' must be one of {NODE_ORDERS}, found {order!r}"
        )
    for field in ("num_nodes", "num_edges", "num_features", "num_classes"):
        if meta[field] < 0:
            raise DatasetError(
                path, f"field {field!r} must be >= 0, found {meta[field]}"
            )
    if meta["num_classes"] > meta["num_nodes"]:  # the model is sized by it
        raise DatasetError(
            path,
            f"num_classes is {meta['num_classes']:,}, but a graph of "
            f"{meta['num_nodes']:,} nodes (num_nodes) has at most "
            f"{meta['num_nodes']:,} classes",
        )
    for part_id, entry in enumerate(meta["parts"]):
        _check_part_entry(path, part_id, entry)
        _check_part_counts(path, part_id, entry, meta)
    listed = [sorted(entry["arrays"]) for entry in meta["parts"]]
    for part_id, names in enumerate(listed[1:], start=1):
        if names != listed[0]:  # a part without labels or a split, say
            raise DatasetError(
                path,
                f"parts[{part_id}].arrays lists {names}, but parts[0].arrays "
                f"lists {listed[0]} (every part holds the same arrays)",
            )
    num_in_edges = sum(entry["num_in_edges"] for entry in meta["parts"])
    if num_in_edges != meta["num_edges"]:
        raise DatasetError(
            path,
            f"num_edges is {meta['num_edges']}, but the parts store "
            f"{num_in_edges} in-edges (the sum of parts[*].num_in_edges)",
        )
    return meta


def check_part_count(folder: str | os.PathLike[str], num_parts: int) -> None:
    """Refuse a ``folder`` that does not hold parts ``0 .. num_parts - 1``.

    Run where ``meta.json`` disagrees with itself or a part is missing, not
    on every load: a machine may hold a copy of its own parts only.

    Raises:
        DatasetError: naming ``meta.json``, the count it claims and the
            parts the folder holds.
    """
    folder = Path(folder)
    held = sorted(
        int(path.name.removeprefix("part_"))
        for path in folder.glob("part_*")
        if path.name.removeprefix("part_").isdecimal() and path.is_dir()
    )
    if held == list(range(num_parts)):
        return
    if held and held == list(range(len(held))) and len(held) > 2:
        shown = f"part_0..part_{held[-1]}"
    else:
        names = [f"part_{i}" for i in held[:4]]
        shown = ", ".join(names) + (f" and {len(held) - 4} more" if held[4:] else "")
    raise DatasetError(
        folder / META,
        f"claims {num_parts} parts, but the folder holds {len(held)} "
        f"({shown or 'none'})",
    )


def _check_part_entry(path: Path, part_id: int, entry: Any) -> None:
    where = f"parts[{part_id}]"
    if not isinstance(entry, dict) or not isinstance(entry.get("arrays"), dict):
        raise DatasetError(path, f"{where} must be an object with an 'arrays' object")
    for name in ("num_owned", "num_halo", "num_in_edges"):
        value = entry.get(name)
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise DatasetError(
                path, f"{where}.{name} must be an int >= 0, found {value!r}"
            )
    arrays = entry["arrays"]
    missing = [n for n in _REQUIRED if n not in arrays]
    unknown = sorted(set(arrays) - set(_REQUIRED) - set(_OPTIONAL))
    if missing or unknown:
        raise DatasetError(
            path, f"{where}.arrays: missing {missing}, unknown {unknown}"
        )
    for name, spec in arrays.items():
        if not is_array_entry(spec):
            raise DatasetError(
                path,
                f"{where}.arrays.{name} must be {{'dtype': str, 'shape': [int, "
                f"...], 'sha256': str}}, found {spec!r}",
            )
        # The file must match its entry (load_array checks that): an entry the
        # format does not allow names the file, for every rank alike.
        dtype, ndim = _KINDS[name]
        if spec["dtype"] != dtype or len(spec["shape"]) != ndim:
            raise DatasetError(
                part_folder(path.parent, part_id) / f"{name}.npy",
                f"expected {dtype} with {ndim} dimension{'s' if ndim > 1 else ''}, "
                f"found {spec['dtype']} of shape {spec['shape']} (as {path.name} "
                f"lists it)",
            )


def _check_part_counts(
    path: Path, part_id: int, entry: dict[str, Any], meta: dict[str, Any]
) -> None:
    """A part's counts and array shapes agree with the graph-wide fields.

    Checked from ``meta.json`` alone, for every part, so every rank refuses a
    folder with one bad part alike (a part whose x is narrower than the others'
    would otherwise abort the first collective); each file's own shape is then
    checked against its entry when the part loads.
    """
    where = f"parts[{part_id}]"
    arrays = entry["arrays"]
    owned = meta["offsets"][part_id + 1] - meta["offsets"][part_id]
    indices_shape = arrays["indices"]["shape"]
    halo_shape = arrays["halo_nid"]["shape"]
    for name, agrees, found in (
        ("num_owned", entry["num_owned"] == owned, f"the offsets give {owned}"),
        (
            "num_in_edges",
            [entry["num_in_edges"]] == indices_shape,
            f"arrays.indices has shape {indices_shape}",
        ),
        (
            "num_halo",
            [entry["num_halo"]] == halo_shape,
            f"arrays.halo_nid has shape {halo_shape}",
        ),
    ):
        if not agrees:
            raise DatasetError(path, f"{where}.{name} is {entry[name]}, but {found}")
    width = arrays["x"]["shape"][1:] if "x" in arrays else [0]
    if width != [meta["num_features"]]:
        raise DatasetError(
            path,
            f"{where}.arrays.x has shape {arrays['x']['shape']}, but num_features "
            f"is {meta['num_features']}"
            if "x" in arrays
            else f"{where} has no x, but num_features is {meta['num_features']}",
        )


def check_part(
    where: Path,
    arrays: dict[str, np.ndarray],
    start: int,
    num_owned: int,
    num_nodes: int,
) -> None:
    """Check one loaded part's arrays, naming the file at fault.

    Shapes, every ID in range, no halo node owned (``start`` is the
    part's first global ID) and no split with a node twice: a damaged file
    of the right size fails here, naming it, instead of deep in training."""

    def fail(name: str, problem: str) -> DatasetError:
        return DatasetError(where / f"{name}.npy", problem)

    rows = {"orig_nid": num_owned, "indptr": num_owned + 1, "x": num_owned}
    rows["y"] = num_owned
    for name, expected in rows.items():
        if name in arrays and arrays[name].shape[0] != expected:
            raise fail(
                name,
                f"expected {expected} rows (part owns {num_owned} nodes by the "
                f"meta.json offsets), found {arrays[name].shape[0]}",
            )
    indptr, indices = arrays["indptr"], arrays["indices"]
    if int(indptr[0]) != 0 or int(indptr[-1]) != indices.shape[0]:
        raise fail(
            "indptr",
            f"must run from 0 to len(indices)={indices.shape[0]}, found "
            f"{int(indptr[0])}..{int(indptr[-1])}",
        )
    num_local = num_owned + arrays["halo_nid"].shape[0]
    if not bool((np.diff(indptr) >= 0).all()):
        raise fail("indptr", "must be non-decreasing")
    if not _in_range(indices, num_local):
        raise fail("indices", f"local IDs must lie in [0, {num_local})")
    halo = arrays["halo_nid"]
    if not (_in_range(halo, num_nodes) and bool((np.diff(halo) > 0).all())):
        raise fail("halo_nid", f"must be ascending global IDs in [0, {num_nodes})")
    first, stop = np.searchsorted(halo, [start, start + num_owned])
    if first < stop:
        raise fail(
            "halo_nid",
            f"holds {int(stop - first)} nodes this part owns (global IDs "
            f"[{start}, {start + num_owned})), such as {int(halo[first])}",
        )
    if not _in_range(arrays["orig_nid"], num_nodes):
        raise fail("orig_nid", f"original IDs must lie in [0, {num_nodes})")
    for split in SPLITS:
        name = f"{split}_local"
        if name in arrays and not _in_range(arrays[name], num_owned):
            raise fail(name, f"owned-local IDs must lie in [0, {num_owned})")
        if name in arrays and np.unique(arrays[name]).size != arrays[name].size:
            raise fail(name, "holds a node twice (it would count twice in the loss)")


def _in_range(values: np.ndarray, high: int) -> bool:
    return values.size == 0 or (int(values.min()) >= 0 and int(values.max()) < high)
