"""LocalPart: local <-> global ID maps of one loaded part."""

from __future__ import annotations

import tempfile
from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from graphwire.graph.graph import Graph
from graphwire.partition import LocalPart, Partition, load_part, write_partitioned


def load_all(graph: Graph, partition: Partition, folder: Path) -> list[LocalPart]:
    write_partitioned(graph, partition, folder)
    return [load_part(folder, i) for i in range(partition.num_parts)]


@given(
    num_nodes=st.integers(1, 60),
    num_edges=st.integers(0, 300),
    num_parts=st.integers(1, 5),
    seed=st.integers(0, 2**32 - 1),
)
def test_local_global_round_trip(
    num_nodes: int, num_edges: int, num_parts: int, seed: int
) -> None:
    rng = np.random.default_rng(seed)
    graph = Graph.from_edge_index(
        rng.integers(0, num_nodes, num_edges),
        rng.integers(0, num_nodes, num_edges),
        num_nodes=num_nodes,
    )
    partition = Partition(
        torch.from_numpy(rng.integers(0, num_parts, num_nodes)), num_parts
    )
    with tempfile.TemporaryDirectory() as tmp:
        for lp in load_all(graph, partition, Path(tmp) / "parts"):
            local = torch.arange(lp.num_local)
            global_nid = lp.local_to_global(local)
            assert torch.equal(lp.global_to_local(global_nid), local)
            # Everything else is absent (-1).
            every = torch.arange(num_nodes)
            found = lp.global_to_local(every)
            present = torch.zeros(num_nodes, dtype=torch.bool)
            present[global_nid] = True
            assert bool((found[~present] == -1).all())
            # Owned first, then halo owned by other parts.
            start, stop = lp.global_range
            assert global_nid[: lp.num_owned].tolist() == list(range(start, stop))
            assert bool((lp.halo_owner() != lp.part_id).all())
            assert torch.equal(lp.halo_owner(), lp.book.owner(lp.halo_nid))
            assert lp.in_degrees().sum() == lp.num_in_edges
            assert lp.dst_of_edges().numel() == lp.num_in_edges


def test_example_part(tmp_path: Path) -> None:
    # 0 -> 2, 1 -> 2, 3 -> 1, 2 -> 3; part 0 = {1, 2}, part 1 = {0, 3}.
    graph = Graph.from_edge_index([0, 1, 3, 2], [2, 2, 1, 3], num_nodes=4)
    partition = Partition(torch.tensor([1, 0, 0, 1]), num_parts=2)
    part0, part1 = load_all(graph, partition, tmp_path / "parts")
    # New IDs: 1 -> 0, 2 -> 1, 0 -> 2, 3 -> 3.
    assert part0.orig_nid.tolist() == [1, 2]
    assert part0.halo_nid.tolist() == [2, 3]  # original 0 and 3
    assert part0.indptr.tolist() == [0, 1, 3]
    assert part0.indices.tolist() == [3, 2, 0]  # 3->1; 0->2, 1->2
    assert part0.local_to_global(torch.tensor([0, 1, 2, 3])).tolist() == [0, 1, 2, 3]
    assert part0.orig_of_local(torch.tensor([1])).tolist() == [2]
    assert part1.global_range == (2, 4) and part1.num_owned == 2
    assert part1.global_to_local(torch.tensor([3, 1, 0])).tolist() == [1, 2, -1]
    assert part0.num_parts == 2 and part0.offsets.tolist() == [0, 2, 4]
    assert part0.meta["method"] == "custom" and "parts" not in part0.meta
    assert "global_range=[0, 2)" in repr(part0)
    with pytest.raises(ValueError, match="part 0 has 4 local nodes"):
        part0.local_to_global(torch.tensor([4]))


def test_orig_of_local_refuses_ids_out_of_range(tmp_path: Path) -> None:
    # Owned-local IDs only: a negative one wrapped around to the last owned
    # node, a halo one (>= num_owned) was a raw IndexError.
    graph = Graph.from_edge_index([0, 1, 3, 2], [2, 2, 1, 3], num_nodes=4)
    partition = Partition(torch.tensor([1, 0, 0, 1]), num_parts=2)
    part0, _ = load_all(graph, partition, tmp_path / "parts")
    for bad, found in (([-1, 0], r"\[-1, 0\]"), ([2], r"\[2, 2\]")):
        with pytest.raises(
            ValueError, match=rf"local_nid: part 0 owns 2 nodes, .*{found}"
        ):
            part0.orig_of_local(torch.tensor(bad))
