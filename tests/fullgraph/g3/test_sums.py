"""`plan_sums`: a layer's weighted sum split by where its source rows come
from adds up to the whole product, forward and backward."""

from __future__ import annotations

import pytest
import torch

from graphwire.fullgraph.g3.messages import Messages
from graphwire.fullgraph.g3.sums import plan_sums
from graphwire.nn.aggregate import spmm_sum
from graphwire.nn.base import MessageGraph

# 3 owned rows (sources 0-2), 4 halo rows (sources 3-6) in two messages of
# peer 1: bin 0 carries halo positions 2 then 0, bin 1 positions 1 then 3.
SRC = [0, 3, 5, 1, 2, 4, 6, 5, 2, 0, 3]
INDPTR = [0, 3, 7, 11]
KEYS = [(1, 0), (1, 1)]
RECV_POS = {KEYS[0]: torch.tensor([2, 0]), KEYS[1]: torch.tensor([1, 3])}


def _setup(returned: dict[tuple[int, int], list[int]]):
    mg = MessageGraph(
        indptr=torch.tensor(INDPTR),
        indices=torch.tensor(SRC),
        num_src=7,
        num_dst=3,
    )
    weight = torch.rand(len(SRC), generator=torch.Generator().manual_seed(0))
    messages = Messages(
        send_rows=[],
        recv_pos=RECV_POS,
        keys=KEYS,
        bins_sent=frozenset(),
        halo_message=torch.tensor([0, 1, 0, 1]),
    )
    return_pos = {k: torch.tensor(p) for k, p in returned.items()}
    return mg, weight, plan_sums(mg, weight, messages, return_pos), return_pos


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_the_pieces_add_up_to_the_whole_product(dtype) -> None:
    returned = {KEYS[0]: [2], KEYS[1]: [1, 3]}  # halo position 0 returns nothing
    mg, weight, sums, return_pos = _setup(returned)
    sums = sums.matrices(dtype)
    m = torch.randn(7, 5, dtype=dtype, generator=torch.Generator().manual_seed(1))
    whole = spmm_sum(mg, m, weight.to(dtype))
    agg = sums.sum_owned(m[:3])
    for key in KEYS:  # each message's rows as they arrive, in message order
        sums.add_message(agg, key, m[3 + RECV_POS[key]])
    torch.testing.assert_close(agg, whole)  # float rounding: other grouping

    grad = torch.randn(3, 5, dtype=dtype, generator=torch.Generator().manual_seed(2))
    m_leaf = m.clone().requires_grad_()
    spmm_sum(mg, m_leaf, weight.to(dtype)).backward(grad)
    expected = m_leaf.grad
    assert expected is not None
    torch.testing.assert_close(sums.owned_grad(grad), expected[:3])
    for key in KEYS:
        got = sums.returned_grad(key, grad)
        assert got is not None
        torch.testing.assert_close(got, expected[3 + return_pos[key]])


def test_a_message_that_returns_nothing_has_no_returned_gradient() -> None:
    _, _, sums, _ = _setup({KEYS[1]: [3]})
    grad = torch.ones(3, 2)
    assert sums.returned_grad(KEYS[0], grad) is None
    got = sums.returned_grad(KEYS[1], grad)
    assert got is not None and got.shape == (1, 2)
