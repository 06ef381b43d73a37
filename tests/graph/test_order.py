"""`stable_order` is torch's stable sort, by counting where the keys are dense;
`index_dtype` is int32 exactly while every bound fits."""

from __future__ import annotations

import pytest
import torch

from graphwire.graph import order
from graphwire.graph.order import index_dtype, stable_order


@pytest.mark.parametrize(
    "n, high, dtype",
    [
        (1, 0, torch.int64),
        (7, 2, torch.int32),
        (5000, 40, torch.int64),  # many ties: stability decides the order
        (5000, 5000, torch.int32),
        (3000, 10_000_000, torch.int64),  # sparse keys: the comparison sort
        (200, 300, torch.int16),
    ],
)
def test_stable_order_is_torchs_stable_sort(n: int, high: int, dtype) -> None:
    generator = torch.Generator().manual_seed(n + high)
    keys = torch.randint(0, high + 1, (n,), generator=generator).to(dtype)
    assert torch.equal(stable_order(keys), torch.sort(keys, stable=True).indices)


def test_stable_order_counts_dense_keys(monkeypatch) -> None:
    # The counting path, not torch.sort, orders dense keys: if it were not
    # stable, the ties here (every key 10 times) would come out shuffled.
    def no_sort(*args, **kwargs):
        raise AssertionError("torch.sort was called for dense keys")

    monkeypatch.setattr(order.torch, "sort", no_sort)
    keys = torch.arange(1000).flip(0) % 100
    expected = torch.cat([torch.nonzero(keys == k).view(-1) for k in range(100)])
    assert torch.equal(stable_order(keys), expected)
    assert stable_order(keys).dtype == torch.int64
    assert stable_order(torch.empty(0, dtype=torch.int64)).numel() == 0


@pytest.mark.parametrize(
    "keys, message",
    [
        (torch.tensor([3, -1, 2]), "keys must be >= 0, found -1"),
        (torch.tensor([1.0, 2.0]), "expected 1-D integer keys, got torch.float32"),
        (
            torch.zeros(2, 2, dtype=torch.int64),
            r"integer keys, got torch.int64 \[2, 2\]",
        ),
    ],
)
def test_stable_order_names_bad_keys(keys: torch.Tensor, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        stable_order(keys)


def test_index_dtype_is_int32_exactly_while_every_bound_fits() -> None:
    top = torch.iinfo(torch.int32).max
    assert index_dtype() == torch.int32
    assert index_dtype(0, 5) == torch.int32
    assert index_dtype(top, top) == torch.int32
    assert index_dtype(top + 1) == torch.int64
    assert index_dtype(3, top + 1, 7) == torch.int64  # any one bound decides
