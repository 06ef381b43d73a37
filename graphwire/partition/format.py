"""The on-disk partitioned graph: one folder per part, each loadable alone.

Layout of a partitioned folder (ARCHITECTURE §3)::

    meta.json       {"format": "graphwire.partitioned", "version": 1, "name",
                     "num_nodes", "num_edges", "num_features", "num_classes",
                     "num_parts", "method", "params", "node_order", "offsets",
                     "parts": [{"num_owned", "num_halo", "num_in_edges",
                                "arrays": {name: {"dtype", "shape", "sha256"}}}],
                     "stats": PartitionStats.as_dict()}
    part_<i>/       the arrays of part i (.npy, memory-mappable)

Nodes are relabelled (see :class:`~graphwire.partition.book.PartitionBook`): part
``i`` owns new global IDs ``offsets[i] .. offsets[i + 1] - 1``, numbered within
the part as ``node_order`` says (``id``: by original ID; ``rcm``: neighbours
close together). Per part, with
``n`` owned nodes, ``h`` halo nodes and ``e`` stored in-edges:

    orig_nid     int64 [n]       original ID of each owned node, in new-ID order
    indptr       int64 [n + 1]   local CSR of the owned nodes' in-edges
    indices      int64 [e]       source of each in-edge, in LOCAL numbering:
                                 ``0 .. n-1`` owned, ``n + k`` the k-th halo node
    halo_nid     int64 [h]       new global IDs of the halo nodes, ascending
    x            float32 [n, F]  owned features (if the graph has them)
    y            int64 [n]       owned labels (if the graph has them)
    train_local / val_local / test_local   int64 [*]  owned-local indices of the
                                 split's nodes, ascending (if the graph has it)

Every in-edge of the graph is stored exactly once, in its destination's part, in
the order it has in the graph's CSR row. The whole folder is written under a
temporary name and renamed into place; :func:`load_part` reads ``meta.json`` and
the one part's files, never another part's.
"""

from __future__ import annotations

import os
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import torch

from graphwire.fsutil import (
    atomic_dir,
    check_replaceable,
    save_npy,
    write_json,
)
from graphwire.graph.graph import Graph
from graphwire.graph.labels import check_labels
from graphwire.graph.links import HeldOut, save_held_out
from graphwire.graph.native import load_array
from graphwire.graph.order import NODE_ORDERS, locality_order
from graphwire.graph.seeds import is_int
from graphwire.partition.base import Partition, unique_sorted
from graphwire.partition.book import PartitionBook
from graphwire.partition.layout import (
    FORMAT,
    META,
    SPLIT_ARRAYS,
    SPLITS,
    VERSION,
    check_part,
    check_part_count,
    load_partition_meta,
    part_folder,
)
from graphwire.partition.local import LocalPart
from graphwire.partition.stats import PER_PART, PartitionStats

__all__ = [
    "FORMAT",
    "VERSION",
    "is_partitioned_folder",
    "load_part",
    "load_partition_meta",
    "part_folder",
    "write_partitioned",
]


def write_partitioned(
    graph: Graph,
    partition: Partition,
    folder: str | os.PathLike[str],
    overwrite: bool = False,
    *,
    stats: PartitionStats | None = None,
    node_order: str = "id",
    held_out: tuple[HeldOut, HeldOut] | None = None,
) -> Path:
    """Write ``graph`` split by ``partition`` to ``folder``, atomically.

    Args:
        graph: The whole graph (its arrays may be memory-mapped).
        partition: One part ID per node of ``graph``.
        folder: The folder to create.
        overwrite: Replace ``folder`` if it exists (otherwise that is an error).
        stats: Precomputed :class:`PartitionStats` of ``partition`` to store
            (computed if None); checked against the counts the writing finds.
        node_order: How each part numbers its nodes (one of
            :data:`~graphwire.graph.order.NODE_ORDERS`): ``id`` in the order
            of their original IDs, ``rcm`` in
            :func:`~graphwire.graph.order.locality_order` over the part's own
            edges, so that a part's sparse products read their source rows
            close together (recorded in ``meta.json`` as ``node_order``).
        held_out: link prediction's ``(val, test)`` pairs (original IDs),
            written in new IDs beside the parts
            (:func:`~graphwire.graph.links.save_held_out`; ``meta.json``'s
            ``task`` is then ``link``).

    Returns:
        ``folder`` as a :class:`~pathlib.Path`.

    Raises:
        ValueError: ``partition`` does not match ``graph``; ``stats`` are
            not this partition's (nothing is written); or ``folder`` exists
            and is not a graphwire folder (never replaced).
        FileExistsError: ``folder`` exists and ``overwrite`` is false.
    """
    partition.check_graph(graph)
    if node_order not in NODE_ORDERS:
        raise ValueError(
            f"node_order: expected one of {NODE_ORDERS}, got {node_order!r}"
        )
    folder = Path(folder)
    check_replaceable(folder, overwrite)  # before the work, not after it
    if stats is None:
        stats = PartitionStats.compute(graph, partition)
    elif stats.num_parts != partition.num_parts or stats.num_edges != graph.num_edges:
        raise ValueError(
            f"stats: computed for {stats.num_parts} parts and {stats.num_edges} "
            f"edges, but the partition has {partition.num_parts} parts and the "
            f"graph {graph.num_edges} edges"
        )
    order = None
    if node_order == "rcm":
        order = locality_order(graph.indptr, graph.indices, partition.assignment)
    book = PartitionBook.from_partition(partition, order)
    assert book.new_from_orig is not None and book.orig_from_new is not None
    new_from_orig = book.new_from_orig.numpy()
    orig_from_new = book.orig_from_new.numpy()
    offsets = book.offsets.numpy()
    # The whole CSR with rows in new-ID order and sources in new IDs: part p's
    # rows are offsets[p]:offsets[p+1], so each part is a slice of it.
    indptr_t, src_orig = graph.subgraph_in_edges(book.orig_from_new)
    indptr_new = indptr_t.numpy()
    src_new = new_from_orig[src_orig.numpy()]
    split_new = {
        split: np.sort(new_from_orig[idx.numpy()])
        for split in SPLITS
        if (idx := getattr(graph, f"{split}_idx")) is not None
    }
    x = None if graph.x is None else graph.x.detach().cpu().numpy()
    y = None if graph.y is None else graph.y.cpu().numpy()

    parts_meta: list[dict[str, Any]] = []
    # What this partition's stats must say, counted as the parts are cut.
    found: dict[str, list[int]] = {name: [] for name in PER_PART}
    found["edge_cut"] = [0]
    with atomic_dir(folder, overwrite=overwrite) as tmp:
        for part_id in range(partition.num_parts):
            start, stop = int(offsets[part_id]), int(offsets[part_id + 1])
            first, last = int(indptr_new[start]), int(indptr_new[stop])
            src = src_new[first:last]
            owned = (src >= start) & (src < stop)
            halo_nid = unique_sorted(src[~owned])
            num_owned = stop - start
            local = np.where(
                owned, src - start, num_owned + np.searchsorted(halo_nid, src)
            )
            orig_nid = orig_from_new[start:stop]
            arrays: dict[str, np.ndarray] = {
                "orig_nid": orig_nid,
                "indptr": indptr_new[start : stop + 1] - first,
                "indices": local.astype(np.int64, copy=False),
                "halo_nid": halo_nid,
            }
            if x is not None:
                arrays["x"] = x[orig_nid]
            if y is not None:
                arrays["y"] = y[orig_nid]
            for split in SPLITS:
                ids = split_new.get(split, np.empty(0, dtype=np.int64))
                low, high = np.searchsorted(ids, [start, stop])
                if split in split_new:
                    arrays[f"{split}_local"] = ids[low:high] - start
                found[f"num_{split}"].append(int(high - low))
            for name, count in (
                ("num_nodes", num_owned),
                ("degree_sum", last - first),
                ("num_in_edges", last - first),
                ("num_halo", int(halo_nid.shape[0])),
            ):
                found[name].append(count)
            found["edge_cut"][0] += int(np.count_nonzero(~owned))
            out = part_folder(tmp, part_id)
            out.mkdir()
            parts_meta.append(
                {
                    "num_owned": num_owned,
                    "num_halo": int(halo_nid.shape[0]),
                    "num_in_edges": last - first,
                    "arrays": {
                        name: {
                            "dtype": array.dtype.name,
                            "shape": list(array.shape),
                            "sha256": save_npy(out, name, array),
                        }
                        for name, array in arrays.items()
                    },
                }
            )
        _check_stats(stats, found)  # raised in atomic_dir: nothing is written
        if held_out is not None:
            new = book.new_from_orig
            save_held_out(tmp, *(split.renumbered(new) for split in held_out))
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
                "num_parts": partition.num_parts,
                "method": partition.method,
                "params": partition.params,
                "node_order": node_order,
                "task": "node" if held_out is None else "link",
                "offsets": [int(o) for o in offsets],
                "parts": parts_meta,
                "stats": stats.as_dict(),
            },
        )
    return folder


def _check_stats(stats: PartitionStats, found: dict[str, list[int]]) -> None:
    """Raise ``ValueError`` unless ``stats`` has the counts ``found`` (per part,
    and ``edge_cut``): stats passed for another partition of the same graph."""
    for name, counts in found.items():
        given = [stats.edge_cut] if name == "edge_cut" else list(getattr(stats, name))
        if given == counts:
            continue
        if len(given) != len(counts):
            raise ValueError(
                f"stats: {name} has {len(given)} entries, but the partition has "
                f"{len(counts)} parts"
            )
        part = int(np.flatnonzero(np.array(given) != np.array(counts))[0])
        what = name if name == "edge_cut" else f"{name} of part {part}"
        raise ValueError(
            f"stats: {what} is {given[part]}, but the partition gives "
            f"{counts[part]} (stats computed for another partition?)"
        )


def load_part(
    folder: str | os.PathLike[str],
    part_id: int,
    mmap: bool = True,
    verify: bool = False,
) -> LocalPart:
    """Load part ``part_id`` of a partitioned folder, touching no other part.

    Args:
        folder: A folder written by :func:`write_partitioned`.
        part_id: Which part, in ``[0, num_parts)``.
        mmap: Memory-map the arrays (read-only, shared page cache).
        verify: Check the part's SHA-256 checksums (reads every byte of the
            part once). The IDs are always checked (one pass over the CSR and
            the ID arrays, not over the features).

    Returns:
        The :class:`LocalPart`.

    Raises:
        ValueError: ``part_id`` is out of range.
        DatasetError: ``meta.json`` is missing, malformed, of another format or
            version, or its counts disagree (``num_edges`` with the parts'
            in-edges, ``num_features`` with any part's x width); one of the
            part's files is missing (its folder gone: the error counts the
            parts the folder holds), truncated, of another dtype or shape than
            ``meta.json`` says, holds out-of-range IDs or labels (a label must
            lie in ``[0, num_classes)`` and below ``num_nodes``; ``-1``,
            unlabelled, only on a node in no split), or (with ``verify``)
            fails its checksum; ``meta.json``
            lists any part's array with another dtype or number of dimensions
            than the format's (int64 IDs and labels, float32 [n, F] x).
    """
    folder = Path(folder)
    meta = load_partition_meta(folder)
    num_parts = meta["num_parts"]
    if not is_int(part_id):
        raise ValueError(f"part_id: expected an int, found {part_id!r}")
    part_id = int(part_id)
    if not 0 <= part_id < num_parts:
        raise ValueError(
            f"part_id: {folder} has {num_parts} parts, found part_id={part_id}"
        )
    entry = meta["parts"][part_id]
    where = part_folder(folder, part_id)
    if not where.is_dir():
        check_part_count(folder, num_parts)
    arrays = {
        name: load_array(where / f"{name}.npy", spec, mmap, verify)
        for name, spec in entry["arrays"].items()
    }
    offsets = torch.tensor(meta["offsets"], dtype=torch.int64)
    num_owned = int(offsets[part_id + 1] - offsets[part_id])
    check_part(where, arrays, int(offsets[part_id]), num_owned, meta["num_nodes"])
    if "y" in arrays:  # after check_part: the split rows are in range
        splits = {n: arrays[n] for n in SPLIT_ARRAYS if n in arrays}
        check_labels(
            where / "y.npy",
            arrays["y"],
            splits,
            meta["num_classes"],
            num_nodes=meta["num_nodes"],
        )
    tensors = _as_tensors(arrays)
    return LocalPart(
        part_id=part_id,
        book=PartitionBook(offsets),
        orig_nid=tensors["orig_nid"],
        indptr=tensors["indptr"],
        indices=tensors["indices"],
        halo_nid=tensors["halo_nid"],
        x=tensors.get("x"),
        y=tensors.get("y"),
        train_local=tensors.get("train_local"),
        val_local=tensors.get("val_local"),
        test_local=tensors.get("test_local"),
        meta={k: v for k, v in meta.items() if k != "parts"},
    )


def is_partitioned_folder(path: str | os.PathLike[str]) -> bool:
    """True when ``path`` is laid out as :func:`write_partitioned` writes.

    That is ``meta.json`` beside ``part_0/``, whatever its ``meta.json`` holds
    (:func:`load_partition_meta` checks that)."""
    return (Path(path) / META).is_file() and part_folder(path, 0).is_dir()


def _as_tensors(arrays: dict[str, np.ndarray]) -> dict[str, torch.Tensor]:
    """Share each array's memory with a tensor (no copy, mmap stays mmap)."""
    with warnings.catch_warnings():
        # Memory-mapped arrays are read-only; nothing writes through these tensors.
        warnings.simplefilter("ignore", UserWarning)
        return {name: torch.from_numpy(array) for name, array in arrays.items()}
