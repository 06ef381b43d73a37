"""PartitionBook: contiguous relabelling, owner lookup, ID round trips."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from graphwire.partition import Partition, PartitionBook


@st.composite
def partitions(draw: st.DrawFn) -> Partition:
    num_nodes = draw(st.integers(1, 60))
    num_parts = draw(st.integers(1, 5))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    return Partition(torch.from_numpy(rng.integers(0, num_parts, num_nodes)), num_parts)


@given(partitions())
def test_relabelling_is_contiguous_and_stable(partition: Partition) -> None:
    book = PartitionBook.from_partition(partition)
    assert book.num_parts == partition.num_parts
    assert book.num_nodes == partition.num_nodes
    assert book.part_sizes().tolist() == partition.part_sizes().tolist()
    for part_id in range(partition.num_parts):
        start, stop = book.part_range(part_id)
        # Part p's new IDs map back to its nodes, original IDs ascending.
        orig = book.orig_of(torch.arange(start, stop))
        assert orig.tolist() == partition.nodes_of(part_id).tolist()


@given(partitions())
def test_id_maps_round_trip(partition: Partition) -> None:
    book = PartitionBook.from_partition(partition)
    orig = torch.arange(partition.num_nodes)
    new = book.new_of(orig)
    assert sorted(new.tolist()) == orig.tolist()  # a permutation
    assert torch.equal(book.orig_of(new), orig)
    # The owner of a node's new ID is the part the partition gave it.
    assert torch.equal(book.owner(new), partition.assignment)
    local = book.to_local(new)
    for part_id in range(partition.num_parts):
        mine = partition.assignment == part_id
        assert torch.equal(book.to_global(part_id, local[mine]), new[mine])


def test_example() -> None:
    partition = Partition(torch.tensor([1, 0, 1, 2, 0]), num_parts=4)
    book = PartitionBook.from_partition(partition)
    assert book.offsets.tolist() == [0, 2, 4, 5, 5]  # part 3 is empty
    assert book.orig_from_new is not None and book.new_from_orig is not None
    assert book.orig_from_new.tolist() == [1, 4, 0, 2, 3]
    assert book.new_from_orig.tolist() == [2, 0, 3, 4, 1]
    assert book.owner(torch.tensor([0, 1, 2, 3, 4])).tolist() == [0, 0, 1, 1, 2]
    assert book.to_local(torch.tensor([3, 4])).tolist() == [1, 0]
    assert book.part_range(3) == (5, 5)


def test_owner_skips_empty_parts() -> None:
    book = PartitionBook(torch.tensor([0, 0, 3, 3, 4]))
    assert book.owner(torch.tensor([0, 2, 3])).tolist() == [1, 1, 3]


def test_worker_book_has_no_permutation() -> None:
    book = PartitionBook(torch.tensor([0, 2, 5]))
    assert book.owner(torch.tensor([4])).tolist() == [1]
    with pytest.raises(ValueError, match="only offsets"):
        book.orig_of(torch.tensor([0]))


@pytest.mark.parametrize(
    ("offsets", "message"),
    [
        ([0], "num_parts >= 1"),
        ([1, 3], "must start at 0"),
        ([0, 3, 2], "non-decreasing"),
    ],
)
def test_bad_offsets(offsets: list[int], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        PartitionBook(torch.tensor(offsets))


def test_bad_ids() -> None:
    book = PartitionBook(torch.tensor([0, 2, 5]))
    with pytest.raises(ValueError, match=r"global_nid: must lie in \[0, 5\)"):
        book.owner(torch.tensor([5]))
    with pytest.raises(ValueError, match=r"global_nid: .*\[-1, -1\]"):
        book.to_local(torch.tensor([-1]))
    with pytest.raises(ValueError, match="part 1 owns 3 nodes"):
        book.to_global(1, torch.tensor([3]))
    with pytest.raises(ValueError, match=r"part_id: must lie in \[0, 2\), found 2"):
        book.part_range(2)
    with pytest.raises(ValueError, match="new_from_orig: expected shape"):
        PartitionBook(torch.tensor([0, 2]), new_from_orig=torch.arange(3))


def test_relabelling_refuses_ids_out_of_range() -> None:
    # A negative ID wrapped around to the last node; one past the end was a raw
    # torch IndexError.
    book = PartitionBook.from_partition(Partition(torch.tensor([1, 0, 1]), 2))
    for lookup, name in ((book.new_of, "orig_nid"), (book.orig_of, "global_nid")):
        with pytest.raises(ValueError, match=rf"{name}: .*\[0, 3\), .*\[-1, 0\]"):
            lookup(torch.tensor([0, -1]))
        with pytest.raises(ValueError, match=rf"{name}: .*\[0, 3\), .*\[3, 3\]"):
            lookup(torch.tensor([3]))
        assert lookup(torch.tensor([], dtype=torch.int64)).tolist() == []


@given(partitions(), st.randoms(use_true_random=False))
def test_relabelling_follows_a_given_order_within_each_part(
    partition: Partition, rnd
) -> None:
    order = list(range(partition.num_nodes))
    rnd.shuffle(order)
    book = PartitionBook.from_partition(partition, torch.tensor(order))
    # The same parts and ranges as without an order; within a part, the
    # nodes in the order they have in ``order``.
    plain = PartitionBook.from_partition(partition)
    assert torch.equal(book.offsets, plain.offsets)
    for part_id in range(partition.num_parts):
        start, stop = book.part_range(part_id)
        mine = [v for v in order if int(partition.assignment[v]) == part_id]
        assert book.orig_of(torch.arange(start, stop)).tolist() == mine
    new = book.new_of(torch.arange(partition.num_nodes))
    assert torch.equal(book.orig_of(new), torch.arange(partition.num_nodes))


@pytest.mark.parametrize(
    "order", [[0, 1], [0, 1, 1], [2, 1, 3], [0, -1, 2], [0.0, 1.0, 2.0], [1, 0, 2]]
)
def test_relabelling_refuses_an_order_that_is_not_a_permutation(order) -> None:
    partition = Partition(torch.tensor([1, 0, 1]), 2)
    order_t = torch.tensor(order)
    if order == [1, 0, 2]:  # a permutation, as bools: not IDs
        order_t = order_t.to(torch.bool)
    with pytest.raises(ValueError, match="order: expected a permutation of the 3"):
        PartitionBook.from_partition(partition, order_t)
