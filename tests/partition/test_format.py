"""The partitioned folder: every node and edge exactly once, parts load alone.

Graphs here have ``x[i] = [i, -i]`` and ``y[i] = i``, so one comparison with the
original IDs checks that every part holds the right rows.
"""

from __future__ import annotations

import json
import tempfile
from collections import Counter
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

import graphwire.partition.format as fmt
from graphwire.fsutil import sha256_file
from graphwire.graph.errors import DatasetError
from graphwire.graph.graph import Graph
from graphwire.graph.order import NODE_ORDERS, locality_order
from graphwire.partition import (
    Partition,
    PartitionBook,
    PartitionStats,
    get_partitioner,
    load_part,
    load_partition_meta,
    write_partitioned,
)

SPLITS = ("train", "val", "test")


def make_graph(num_nodes: int, src: Any, dst: Any, rng: np.random.Generator) -> Graph:
    nid = torch.arange(num_nodes, dtype=torch.float32)
    draw = rng.random(num_nodes)  # one draw: the splits are disjoint
    return Graph.from_edge_index(
        src,
        dst,
        num_nodes=num_nodes,
        x=torch.stack([nid, -nid], 1),
        y=torch.arange(num_nodes),
        train_idx=np.flatnonzero(draw < 0.4),
        val_idx=np.flatnonzero((draw >= 0.4) & (draw < 0.6)),
        name="tiny",
    )


@st.composite
def graph_and_partition(draw: st.DrawFn) -> tuple[Graph, Partition]:
    """Up to 60 nodes and 300 edges; random, chunk, METIS or arbitrary parts."""
    num_nodes = draw(st.integers(1, 60))
    num_edges = draw(st.integers(0, 300))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    src = rng.integers(0, num_nodes, num_edges)
    dst = rng.integers(0, num_nodes, num_edges)
    graph = make_graph(num_nodes, src, dst, rng)
    method = draw(st.sampled_from(["random", "chunk", "metis", "arbitrary"]))
    if method == "arbitrary":  # may leave parts empty
        num_parts = draw(st.integers(1, 5))
        assignment = torch.from_numpy(rng.integers(0, num_parts, num_nodes))
        return graph, Partition(assignment, num_parts)
    num_parts = draw(st.integers(1, min(5, num_nodes)))
    return graph, get_partitioner(method).partition(graph, num_parts, seed=1)


def edge_multiset(src: torch.Tensor, dst: torch.Tensor) -> Counter[tuple[int, int]]:
    return Counter(zip(src.tolist(), dst.tolist(), strict=True))


def book_of(graph: Graph, partition: Partition, node_order: str) -> PartitionBook:
    """The relabelling ``write_partitioned`` makes with ``node_order``."""
    order = None
    if node_order == "rcm":
        order = locality_order(graph.indptr, graph.indices, partition.assignment)
    return PartitionBook.from_partition(partition, order)


@pytest.mark.parametrize("node_order", NODE_ORDERS)
@given(case=graph_and_partition())
def test_every_node_and_edge_stored_once(
    case: tuple[Graph, Partition], node_order: str
) -> None:
    """Every node and edge in exactly one part, relabelled as the book says;
    each part's rows and splits follow its nodes (one written folder for
    both checks: writing it is most of the cost)."""
    graph, partition = case
    book = book_of(graph, partition, node_order)
    with tempfile.TemporaryDirectory() as tmp:
        folder = write_partitioned(
            graph, partition, Path(tmp) / "parts", node_order=node_order
        )
        assert load_partition_meta(folder)["node_order"] == node_order
        parts = [load_part(folder, i, verify=True) for i in range(partition.num_parts)]

        owned = torch.cat([p.orig_nid for p in parts])
        # Concatenated in part order, the owned nodes are the relabelling itself.
        assert book.orig_from_new is not None
        assert torch.equal(owned, book.orig_from_new)

        all_src, all_dst = [], []
        orig_src, orig_dst = graph.edge_index()
        for lp in parts:
            # Loaded alone, unverified (as a worker loads it): its rows.
            _check_rows_and_splits(graph, partition, load_part(folder, lp.part_id))
            assert lp.global_range == book.part_range(lp.part_id)
            assert torch.equal(lp.offsets, book.offsets)
            # Each stored edge, in new global IDs.
            src_new = lp.local_to_global(lp.indices)
            dst_new = lp.local_to_global(lp.dst_of_edges())
            all_src.append(src_new)
            all_dst.append(dst_new)
            # The part holds exactly the in-edges of its nodes, in CSR row order.
            mine = partition.assignment[orig_dst] == lp.part_id
            assert edge_multiset(book.orig_of(src_new), book.orig_of(dst_new)) == (
                edge_multiset(orig_src[mine], orig_dst[mine])
            )
            _, row_sources = graph.subgraph_in_edges(lp.orig_nid)
            assert torch.equal(book.orig_of(src_new), row_sources)
            # Halo: exactly the sources owned elsewhere, sorted, in new IDs.
            outside = {
                int(s) for s in orig_src[mine] if partition.assignment[s] != lp.part_id
            }
            assert lp.halo_nid.tolist() == sorted(
                book.new_of(torch.tensor(sorted(outside), dtype=torch.int64)).tolist()
            )
            assert bool((book.owner(lp.halo_nid) != lp.part_id).all())
        # All parts together: the original edge multiset, relabelled.
        assert edge_multiset(torch.cat(all_src), torch.cat(all_dst)) == edge_multiset(
            book.new_of(orig_src), book.new_of(orig_dst)
        )


def _check_rows_and_splits(graph: Graph, partition: Partition, lp: Any) -> None:
    """Part ``lp``'s rows and splits follow its nodes (``x[i] = [i, -i]``,
    ``y[i] = i``)."""
    assert lp.x is not None and lp.y is not None
    assert torch.equal(lp.x[:, 0], lp.orig_nid.to(torch.float32))
    assert torch.equal(lp.x[:, 1], -lp.orig_nid.to(torch.float32))
    assert torch.equal(lp.y, lp.orig_nid)
    assert lp.test_local is None  # the graph has no test split
    for split in ("train", "val"):
        local = getattr(lp, f"{split}_local")
        idx = getattr(graph, f"{split}_idx")
        mine = idx[partition.assignment[idx] == lp.part_id]
        assert sorted(lp.orig_nid[local].tolist()) == sorted(mine.tolist())


def test_meta_records_partition_and_stats(tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    graph = make_graph(30, rng.integers(0, 30, 90), rng.integers(0, 30, 90), rng)
    partition = get_partitioner("metis").partition(graph, 3, seed=4)
    folder = write_partitioned(graph, partition, tmp_path / "parts")
    meta = load_partition_meta(folder)
    assert meta["format"] == "graphwire.partitioned" and meta["version"] == 1
    assert (meta["name"], meta["num_nodes"], meta["num_edges"]) == ("tiny", 30, 90)
    assert (meta["num_features"], meta["num_classes"]) == (2, 30)
    assert meta["method"] == "metis" and meta["params"] == partition.params
    assert meta["num_parts"] == 3 and len(meta["parts"]) == 3
    book = PartitionBook.from_partition(partition)
    assert meta["offsets"] == book.offsets.tolist()
    assert meta["stats"] == json.loads(
        json.dumps(PartitionStats.compute(graph, partition).as_dict())
    )
    entry = meta["parts"][1]
    assert set(entry["arrays"]) == {
        "orig_nid", "indptr", "indices", "halo_nid", "x", "y",
        "train_local", "val_local",
    }  # fmt: skip
    for name, spec in entry["arrays"].items():
        path = folder / "part_1" / f"{name}.npy"
        assert sha256_file(path) == spec["sha256"]


def test_rcm_numbers_each_part_along_its_path(tmp_path: Path) -> None:
    # Part 0: a path of 8 nodes with shuffled IDs; part 1: a hub with an edge
    # to and from every node of the path. "rcm" numbers part 0 along its
    # path (neighbours one ID apart): only a part's own edges count, or the
    # hub would put every path node two hops from every other. "id" keeps
    # the shuffled order.
    rng = np.random.default_rng(3)
    path, hub = rng.permutation(8) + 1, 0
    src = np.concatenate([path[:-1], path[1:], path, np.full(8, hub)])
    dst = np.concatenate([path[1:], path[:-1], np.full(8, hub), path])
    graph = make_graph(9, src, dst, rng)
    partition = Partition(torch.tensor([1] + [0] * 8), 2)
    span = {}
    for node_order in NODE_ORDERS:
        folder = write_partitioned(
            graph, partition, tmp_path / node_order, node_order=node_order
        )
        lp = load_part(folder, 0)
        position = {int(v): i for i, v in enumerate(lp.orig_nid.tolist())}
        span[node_order] = max(
            abs(position[int(a)] - position[int(b)])
            for a, b in zip(path, path[1:], strict=False)
        )
    assert span == {"rcm": 1, "id": span["id"]} and span["id"] > 1


def test_write_refuses_an_unknown_node_order(tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    graph = make_graph(10, rng.integers(0, 10, 30), rng.integers(0, 10, 30), rng)
    partition = get_partitioner("chunk").partition(graph, 2)
    with pytest.raises(ValueError, match="node_order: expected one of"):
        write_partitioned(graph, partition, tmp_path / "parts", node_order="bfs")
    assert not (tmp_path / "parts").exists()


def test_graph_without_node_data(tmp_path: Path) -> None:
    graph = Graph.from_edge_index([0, 1], [1, 2], num_nodes=4)
    partition = Partition(torch.tensor([0, 1, 1, 0]), num_parts=2)
    write_partitioned(graph, partition, tmp_path / "parts")
    lp = load_part(tmp_path / "parts", 1)
    assert lp.x is None and lp.y is None and lp.train_local is None
    # Part 1 owns 1 and 2 (new IDs 2, 3); edge 0 -> 1 makes node 0 (new 0) halo.
    assert lp.halo_nid.tolist() == [0]
    assert lp.indptr.tolist() == [0, 1, 2]
    assert lp.indices.tolist() == [2, 0]  # halo 0 -> local 2; node 1 -> local 0


def test_arrays_are_memory_mapped(tmp_path: Path) -> None:
    graph = Graph.from_edge_index([0, 1, 2], [1, 2, 0], num_nodes=3)
    partition = Partition(torch.zeros(3, dtype=torch.int64), 1)
    folder = write_partitioned(graph, partition, tmp_path / "parts")
    mapped, read = load_part(folder, 0), load_part(folder, 0, mmap=False)
    path = folder / "part_0" / "orig_nid.npy"
    data = np.load(path)
    data[0] = 7
    with open(path, "r+b") as handle:  # rewrite the data in place
        handle.seek(path.stat().st_size - data.nbytes)
        handle.write(data.tobytes())
    assert mapped.orig_nid.tolist() == [7, 1, 2]  # sees the file
    assert read.orig_nid.tolist() == [0, 1, 2]  # a copy in memory


def test_a_numpy_part_id_is_taken(tmp_path: Path) -> None:
    """``for rank in np.arange(num_parts)`` was refused: expected an int."""
    graph = Graph.from_edge_index([0, 1, 2], [1, 2, 0], num_nodes=3)
    partition = Partition(torch.tensor([0, 1, 1]), 2)
    folder = write_partitioned(graph, partition, tmp_path / "parts")
    part = load_part(folder, np.int64(1))
    assert part.part_id == 1 and type(part.part_id) is int


def write_example(tmp_path: Path, num_parts: int = 3) -> Path:
    rng = np.random.default_rng(1)
    graph = make_graph(40, rng.integers(0, 40, 160), rng.integers(0, 40, 160), rng)
    partition = get_partitioner("random").partition(graph, num_parts, seed=0)
    return write_partitioned(graph, partition, tmp_path / "parts")


def test_part_loads_without_the_others(tmp_path: Path) -> None:
    folder = write_example(tmp_path)
    expected = load_part(folder, 1, mmap=False, verify=True)
    for name in ("indices", "x", "orig_nid"):
        (folder / "part_0" / f"{name}.npy").write_bytes(b"garbage")
    (folder / "part_2" / "indptr.npy").unlink()
    lp = load_part(folder, 1, verify=True)
    assert torch.equal(lp.indices, expected.indices)
    assert lp.x is not None and expected.x is not None
    assert torch.equal(lp.x, expected.x)
    with pytest.raises(DatasetError, match="part_2/indptr.npy: missing"):
        load_part(folder, 2)


def test_write_refuses_existing_folder_unless_overwrite(tmp_path: Path) -> None:
    folder = write_example(tmp_path)
    graph = Graph.from_edge_index([0], [1], num_nodes=2)
    partition = Partition(torch.tensor([0, 1]), num_parts=2)
    with pytest.raises(FileExistsError, match="already exists"):
        write_partitioned(graph, partition, folder)
    write_partitioned(graph, partition, folder, overwrite=True)
    assert load_partition_meta(folder)["num_nodes"] == 2


def test_interrupted_write_leaves_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls = []
    real_save = fmt.save_npy

    def failing_save(folder: Path, name: str, array: np.ndarray) -> str:
        calls.append(name)
        if len(calls) == 10:  # part 0 has 8 arrays: this is in part 1
            raise OSError("disk full")
        return real_save(folder, name, array)

    monkeypatch.setattr(fmt, "save_npy", failing_save)
    with pytest.raises(OSError, match="disk full"):
        write_example(tmp_path)
    assert len(calls) == 10
    assert list(tmp_path.iterdir()) == []  # no target, no temporary folder


def test_write_rejects_mismatched_partition(tmp_path: Path) -> None:
    graph = Graph.from_edge_index([0], [1], num_nodes=3)
    with pytest.raises(ValueError, match="has 2 entries but graph"):
        write_partitioned(graph, Partition(torch.tensor([0, 1]), 2), tmp_path / "p")
    partition = Partition(torch.tensor([0, 1, 1]), 2)
    other = PartitionStats.compute(graph, Partition(torch.zeros(3).long(), 1))
    with pytest.raises(ValueError, match="stats: computed for 1 parts"):
        write_partitioned(graph, partition, tmp_path / "p", stats=other)
    assert not (tmp_path / "p").exists()


def test_write_refuses_stats_of_another_partition(tmp_path: Path) -> None:
    """Only num_parts and num_edges were compared: stats of another partition
    of the graph went into meta.json, disagreeing with parts[*].num_halo."""
    rng = np.random.default_rng(1)
    graph = make_graph(40, rng.integers(0, 40, 160), rng.integers(0, 40, 160), rng)
    random = get_partitioner("random")
    partition = random.partition(graph, 3, seed=0)
    other = random.partition(graph, 3, seed=1)  # the same part sizes
    assert torch.equal(partition.part_sizes(), other.part_sizes())
    stats = PartitionStats.compute(graph, other)
    with pytest.raises(
        ValueError,
        match=r"stats: degree_sum of part 0 is \d+, but the partition gives \d+ "
        r"\(stats computed for another partition\?\)",
    ):
        write_partitioned(graph, partition, tmp_path / "p", stats=stats)
    own = PartitionStats.compute(graph, partition)
    halo = list(own.num_halo)
    halo[1] += 1
    with pytest.raises(ValueError, match=rf"stats: num_halo of part 1 is {halo[1]},"):
        write_partitioned(
            graph, partition, tmp_path / "p", stats=replace(own, num_halo=tuple(halo))
        )
    with pytest.raises(ValueError, match=rf"stats: edge_cut is {own.edge_cut + 1},"):
        write_partitioned(
            graph,
            partition,
            tmp_path / "p",
            stats=replace(own, edge_cut=own.edge_cut + 1),
        )
    assert list(tmp_path.iterdir()) == []
    # Its own stats, passed in, are stored as computed.
    folder = write_partitioned(graph, partition, tmp_path / "p", stats=own)
    assert load_partition_meta(folder)["stats"] == json.loads(json.dumps(own.as_dict()))


# ------------------------------------------------------------------ bad folders
def edit_meta(folder: Path, **changes: Any) -> None:
    meta = json.loads((folder / "meta.json").read_text())
    meta.update(changes)
    (folder / "meta.json").write_text(json.dumps(meta))


def test_missing_and_corrupt_meta(tmp_path: Path) -> None:
    folder = write_example(tmp_path)
    with pytest.raises(DatasetError, match="not a folder"):
        load_part(tmp_path / "nowhere", 0)
    (folder / "meta.json").write_text("{not json")
    with pytest.raises(DatasetError, match=r"meta.json: not valid JSON"):
        load_part(folder, 0)
    (folder / "meta.json").unlink()
    with pytest.raises(DatasetError, match=r"meta.json: missing"):
        load_partition_meta(folder)


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"format": "graphwire.graph"}, "format is 'graphwire.graph'"),
        ({"version": 2}, "unknown version 2"),
        ({"num_parts": "3"}, "field 'num_parts' must be a int"),
        ({"offsets": [0, 5, 3, 40]}, "offsets must be 4 non-decreasing ints"),
        ({"offsets": [0, 10, 20]}, "offsets must be 4"),
        ({"parts": []}, "parts lists 0 entries, num_parts is 3"),
        ({"num_parts": 0}, "field 'num_parts' must be >= 1, found 0"),
        ({"num_classes": "40"}, "field 'num_classes' must be a int"),
        ({"num_features": -1}, "field 'num_features' must be >= 0, found -1"),
        # JSON's true is 1 to Python, and 1.0 equals 1: both were taken
        ({"version": True}, "unknown version True"),
        ({"version": 1.0}, "unknown version 1.0"),
        ({"num_classes": True}, "field 'num_classes' must be a int, found True"),
        ({"offsets": [False, 10, 20, 40]}, "offsets must be 4 non-decreasing ints"),
        ({"node_order": "bfs"}, "field 'node_order' must be one of .* found 'bfs'"),
    ],
)
def test_bad_meta_fields(tmp_path: Path, changes: dict[str, Any], message: str) -> None:
    folder = write_example(tmp_path)
    edit_meta(folder, **changes)
    with pytest.raises(DatasetError, match=message) as info:
        load_part(folder, 0)
    assert info.value.path.endswith("meta.json")


def test_bad_part_entry(tmp_path: Path) -> None:
    folder = write_example(tmp_path)
    meta = json.loads((folder / "meta.json").read_text())
    del meta["parts"][2]["arrays"]["halo_nid"]
    (folder / "meta.json").write_text(json.dumps(meta))
    with pytest.raises(
        DatasetError, match=r"parts\[2\].arrays: missing \['halo_nid'\]"
    ):
        load_part(folder, 0)


def test_part_id_out_of_range(tmp_path: Path) -> None:
    folder = write_example(tmp_path)
    with pytest.raises(ValueError, match="has 3 parts, found part_id=3"):
        load_part(folder, 3)


def test_truncated_array(tmp_path: Path) -> None:
    folder = write_example(tmp_path)
    path = folder / "part_1" / "indices.npy"
    path.write_bytes(path.read_bytes()[:-8])
    for mmap in (True, False):
        with pytest.raises(DatasetError, match="part_1/indices.npy: truncated"):
            load_part(folder, 1, mmap=mmap)


def test_checksum_mismatch_needs_verify(tmp_path: Path) -> None:
    folder = write_example(tmp_path)
    path = folder / "part_0" / "x.npy"
    data = np.load(path)
    data[0, 0] += 1  # same shape, different bytes
    np.save(path, data)
    load_part(folder, 0)  # shapes are fine: no checksum read without verify
    with pytest.raises(DatasetError, match="part_0/x.npy: checksum mismatch"):
        load_part(folder, 0, verify=True)


def test_wrong_shape_against_meta(tmp_path: Path) -> None:
    folder = write_example(tmp_path)
    np.save(folder / "part_0" / "y.npy", np.zeros(3, dtype=np.int64))
    with pytest.raises(DatasetError, match=r"part_0/y.npy: holds int64 \[3\]"):
        load_part(folder, 0)


@pytest.mark.parametrize(
    ("name", "damage", "error"),
    [
        ("indices", lambda a: a.__setitem__(0, 10_000), r"local IDs must lie in"),
        ("indices", lambda a: a.__setitem__(0, -1), r"local IDs must lie in"),
        ("orig_nid", lambda a: a.__setitem__(0, 10**9), r"original IDs must lie"),
        ("train_local", lambda a: a.__setitem__(0, 10**6), r"owned-local IDs must"),
    ],
    ids=["indices-high", "indices-negative", "orig_nid", "train_local"],
)
def test_out_of_range_ids_are_refused_at_load(
    tmp_path: Path, name: str, damage: Any, error: str
) -> None:
    """A damaged file of the right size (its checksum updated, as a tool
    rewriting it would leave it) fails at load, naming the file, without
    ``verify``: not deep in training as an IndexError."""
    folder = write_example(tmp_path)
    values = np.load(folder / "part_0" / f"{name}.npy")
    damage(values)
    replace_array(folder, 0, name, values)
    with pytest.raises(DatasetError, match=rf"part_0/{name}.npy: {error}"):
        load_part(folder, 0)


def replace_array(folder: Path, part_id: int, name: str, values: np.ndarray) -> None:
    """Rewrite one array of a part with its meta.json entry to match, as a tool
    rewriting it would leave it: only the graph-wide checks can object."""
    path = folder / f"part_{part_id}" / f"{name}.npy"
    np.save(path, values)
    meta = json.loads((folder / "meta.json").read_text())
    meta["parts"][part_id]["arrays"][name].update(
        dtype=values.dtype.name, shape=list(values.shape), sha256=sha256_file(path)
    )
    (folder / "meta.json").write_text(json.dumps(meta))


@pytest.mark.parametrize(
    ("name", "change", "found"),
    [
        ("indices", lambda a: a.astype(np.float64), r"float64 of shape \[\d+\]"),
        ("indptr", lambda a: a.astype(np.float32), r"float32 of shape \[\d+\]"),
        ("halo_nid", lambda a: a.astype(np.uint64), r"uint64 of shape \[\d+\]"),
        ("orig_nid", lambda a: np.stack([a, a], 1), r"int64 of shape \[\d+, 2\]"),
        ("y", lambda a: a.astype(np.float32), r"float32 of shape \[\d+\]"),
        ("y", lambda a: a[:, None].copy(), r"int64 of shape \[\d+, 1\]"),
        ("x", lambda a: a.astype(np.float64), r"float64 of shape \[\d+, 2\]"),
        ("train_local", lambda a: np.ones_like(a, bool), r"bool of shape \[\d+\]"),
        ("indptr", lambda a: np.array(0), r"int64 of shape \[\]"),
        ("orig_nid", lambda a: np.array(0), r"int64 of shape \[\]"),
        ("x", lambda a: np.array(0, np.float32), r"float32 of shape \[\]"),
    ],
    ids=[
        "indices-float",
        "indptr-float",
        "halo-unsigned",
        "orig_nid-2d",
        "y-float",
        "y-2d",
        "x-float64",
        "train-bool",
        "indptr-0d",
        "orig_nid-0d",
        "x-0d",
    ],
)
def test_arrays_of_another_dtype_or_ndim_are_refused_at_load(
    tmp_path: Path, name: str, change: Any, found: str
) -> None:
    """A rewritten array whose meta.json entry matches it loaded, and failed
    later naming no file (float indices: IndexError; bool train_local: "holds
    a node twice"; 0-d indptr: a bare IndexError). Every rank refuses alike."""
    folder = write_example(tmp_path)
    replace_array(folder, 0, name, change(np.load(folder / "part_0" / f"{name}.npy")))
    dtype, ndim = (
        ("float32", "2 dimensions") if name == "x" else ("int64", "1 dimension")
    )
    for part_id in (0, 1):
        with pytest.raises(
            DatasetError,
            match=rf"part_0/{name}.npy: expected {dtype} with {ndim}, found {found}",
        ):
            load_part(folder, part_id)


def test_labels_are_checked_against_num_classes_and_splits(tmp_path: Path) -> None:
    """Labels past num_classes, or -1 on a split node, fail at load naming the
    part's y.npy: not as torch's "Target 9 is out of bounds" in training."""
    folder = write_example(tmp_path)  # y[i] = i over 40 nodes: num_classes 40
    y = np.load(folder / "part_0" / "y.npy")
    train_local = np.load(folder / "part_0" / "train_local.npy")
    unlabelled = y.copy()
    unlabelled[train_local[0]] = -1
    replace_array(folder, 0, "y", unlabelled)
    with pytest.raises(
        DatasetError, match=rf"part_0/y.npy: row {train_local[0]} is in train_local"
    ):
        load_part(folder, 0)
    too_high = y.copy()
    too_high[1] = 40
    replace_array(folder, 0, "y", too_high)
    with pytest.raises(
        DatasetError, match=r"part_0/y.npy: label 40 at row 1 is out of range"
    ):
        load_part(folder, 0)
    replace_array(folder, 0, "y", y)
    edit_meta(folder, num_classes=int(y.max()))
    with pytest.raises(DatasetError, match=rf"meta.json says num_classes={y.max()}"):
        load_part(folder, 0)


def test_unlabelled_nodes_outside_the_splits_load(tmp_path: Path) -> None:
    folder = write_example(tmp_path)
    y = np.load(folder / "part_0" / "y.npy")
    in_split = np.zeros(y.shape[0], dtype=bool)
    for split in ("train", "val"):  # the example graph has no test split
        in_split[np.load(folder / "part_0" / f"{split}_local.npy")] = True
    assert not in_split.all()
    y[~in_split] = -1
    replace_array(folder, 0, "y", y)
    assert torch.equal(load_part(folder, 0).y, torch.from_numpy(y))


def test_a_part_narrower_than_num_features_is_refused_by_every_part(
    tmp_path: Path,
) -> None:
    """One part's x with fewer columns would abort the first collective (gloo
    SIGABRT); meta.json names it, and every rank refuses alike."""
    folder = write_example(tmp_path)
    x = np.load(folder / "part_1" / "x.npy")
    replace_array(folder, 1, "x", x[:, :1].copy())
    for part_id in range(3):
        with pytest.raises(
            DatasetError,
            match=r"meta.json: parts\[1\].arrays.x has shape \[\d+, 1\], but "
            r"num_features is 2",
        ):
            load_part(folder, part_id)


def test_edge_counts_must_agree(tmp_path: Path) -> None:
    folder = write_example(tmp_path)
    edit_meta(folder, num_edges=159)
    with pytest.raises(
        DatasetError, match="num_edges is 159, but the parts store 160 in-edges"
    ):
        load_part(folder, 0)
    edit_meta(folder, num_edges=160)
    meta = json.loads((folder / "meta.json").read_text())
    meta["parts"][2]["num_in_edges"] += 1
    (folder / "meta.json").write_text(json.dumps(meta))
    with pytest.raises(DatasetError, match=r"parts\[2\].num_in_edges is \d+, but"):
        load_part(folder, 0)


def test_an_array_in_the_other_byte_order_is_named(tmp_path: Path) -> None:
    """torch refused it deep inside, naming no file."""
    folder = write_example(tmp_path)
    path = folder / "part_1" / "x.npy"
    data = np.load(path)
    np.save(path, data.astype(data.dtype.newbyteorder(">")))
    with pytest.raises(DatasetError, match=r"part_1/x.npy: big-endian, not in this"):
        load_part(folder, 1)
