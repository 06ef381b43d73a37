"""Partition validation, the partitioner registry, canonical part IDs."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from graphwire.graph.graph import Graph
from graphwire.partition import PARTITIONERS, Partition, get_partitioner
from graphwire.partition.base import (
    canonical_part_ids,
    check_num_parts,
    unique_sorted,
)


def path_graph(num_nodes: int) -> Graph:
    src = torch.arange(num_nodes - 1)
    return Graph.from_edge_index(src, src + 1, num_nodes=num_nodes, name="path")


def test_partition_converts_and_counts() -> None:
    part = Partition(np.array([0, 2, 2, 1], dtype=np.int32), num_parts=3)
    assert part.assignment.dtype == torch.int64
    assert part.num_nodes == 4
    assert part.part_sizes().tolist() == [1, 1, 2]
    assert part.nodes_of(2).tolist() == [1, 2]
    assert "num_parts=3" in repr(part)


def test_partition_allows_empty_parts() -> None:
    part = Partition(torch.tensor([0, 0, 3]), num_parts=4)
    assert part.part_sizes().tolist() == [2, 0, 0, 1]


@pytest.mark.parametrize(
    ("assignment", "num_parts", "message"),
    [
        (
            [0, 1, 2],
            2,
            r"part IDs must lie in \[0, num_parts=2\), found range \[0, 2\]",
        ),
        ([0, -1], 2, r"found range \[-1, 0\]"),
        ([[0, 1]], 2, "expected a 1-D array"),
        ([0.0, 1.0], 2, "expected integer part IDs"),
        ([0, 1], 0, "num_parts: must be >= 1, found 0"),
        ([0, 1], 2.0, "num_parts: expected an int"),
    ],
)
def test_partition_rejects_bad_assignment(
    assignment: list[int], num_parts: int, message: str
) -> None:
    with pytest.raises(ValueError, match=message):
        Partition(torch.tensor(assignment), num_parts=num_parts)


def test_partition_params_must_be_json() -> None:
    with pytest.raises(ValueError, match="params: must be JSON-serialisable"):
        Partition(torch.zeros(2, dtype=torch.int64), 1, params={"f": object()})


@pytest.mark.parametrize(
    ("params", "where"),
    [
        ({"x": float("nan")}, "params.x"),
        ({"limits": {"cut": [0.1, float("inf")]}}, r"params.limits.cut\[1\]"),
    ],
)
def test_partition_params_must_be_finite(params: dict, where: str) -> None:
    """json.dumps writes NaN and Infinity, which are not JSON: meta.json got
    them, and strict readers refuse the file."""
    with pytest.raises(ValueError, match=rf"{where}: must be a finite number"):
        Partition(torch.tensor([0, 1]), 2, params=params)


def test_partition_length_must_match_graph() -> None:
    part = Partition(torch.zeros(3, dtype=torch.int64), num_parts=1)
    with pytest.raises(ValueError, match="has 3 entries but graph 'path' has 4"):
        part.check_graph(path_graph(4))


def test_registry_lists_builtin_methods() -> None:
    assert {"random", "chunk", "metis"} <= set(PARTITIONERS)
    for name, cls in PARTITIONERS.items():
        assert cls.name == name
        assert get_partitioner(name).name == name


def test_unknown_method_names_the_known_ones() -> None:
    with pytest.raises(ValueError, match="unknown partition method 'spectral'") as info:
        get_partitioner("spectral")
    assert "chunk, locality, metis, random" in str(info.value)


def test_unknown_parameter_is_a_value_error() -> None:
    with pytest.raises(ValueError, match="partition method 'random'.*colour"):
        get_partitioner("random", colour="red")


@pytest.mark.parametrize("method", ["random", "chunk", "metis"])
@pytest.mark.parametrize("num_parts", [0, -1, 6])
def test_num_parts_out_of_range(method: str, num_parts: int) -> None:
    with pytest.raises(ValueError, match="num_parts: must be"):
        get_partitioner(method).partition(path_graph(5), num_parts, seed=0)


def test_num_parts_must_be_int() -> None:
    with pytest.raises(ValueError, match="num_parts: expected an int"):
        check_num_parts(path_graph(5), True)


def test_numpy_counts_and_seeds_are_taken() -> None:
    """``for k in np.arange(...)`` was refused: expected an int, found np.int64."""
    part = get_partitioner("random").partition(
        path_graph(6), np.int64(3), seed=np.int64(2)
    )
    assert part.num_parts == 3 and type(part.num_parts) is int
    assert part.params["seed"] == 2 and type(part.params["seed"]) is int
    explicit = Partition(assignment=[0, 1], num_parts=np.int64(2))
    assert type(explicit.num_parts) is int


@pytest.mark.parametrize("method", ["random", "metis"])
@pytest.mark.parametrize("seed", [-1, 2**64, None])
def test_a_bad_seed_is_named_before_partitioning(method: str, seed) -> None:
    """random failed inside numpy on -1, metis took it; None failed after the
    work in int(seed); 2**64 was recorded in meta.json as it was."""
    with pytest.raises(ValueError, match=r"seed: expected an int in \[0, 2\*\*63\)"):
        get_partitioner(method).partition(path_graph(5), 2, seed=seed)


@pytest.mark.parametrize("method", ["random", "chunk", "metis"])
def test_partition_records_method_and_seed(method: str) -> None:
    part = get_partitioner(method).partition(path_graph(10), 3, seed=7)
    assert part.method == method
    assert part.params["seed"] == 7
    assert part.num_parts == 3 and part.num_nodes == 10


def test_canonical_part_ids_order_by_first_node() -> None:
    assignment = np.array([2, 2, 0, 1, 0, 2])
    assert canonical_part_ids(assignment, 4).tolist() == [0, 0, 1, 2, 1, 0]
    # An empty label (3) gets the last ID; the grouping never changes.
    assert canonical_part_ids(np.array([3, 1, 1]), 4).tolist() == [0, 1, 1]


def test_unique_sorted_matches_numpy() -> None:
    values = np.random.default_rng(0).integers(-5, 50, 300)
    assert unique_sorted(values).tolist() == np.unique(values).tolist()
    assert unique_sorted(np.empty(0, dtype=np.int64)).size == 0
