"""The request/response service: answers, concurrency, errors, exact ledger.

In-process ranks and gloo processes run the same probe
(:func:`tests.comm.service_probes.service_suite`): each rank asks every
peer for rows from two threads at once, so answers to one caller's threads
must not cross.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch

from graphwire.comm.local import run_local
from graphwire.comm.service import HEADER_BYTES
from graphwire.comm.wire import pack, unpack
from graphwire.testing import run_workers
from tests.comm.service_probes import service_suite

CASES = [("local", 2), ("local", 3), ("torch", 2), ("torch", 3)]


@pytest.fixture(scope="module", params=CASES, ids=[f"{k}-{w}" for k, w in CASES])
def outcomes(request: pytest.FixtureRequest) -> tuple[int, list[dict[str, Any]]]:
    kind, world = request.param
    if kind == "local":
        return world, run_local(service_suite, world, timeout=30)
    return world, run_workers(service_suite, world, timeout_s=90)


def test_every_answer_is_the_callers(
    outcomes: tuple[int, list[dict[str, Any]]],
) -> None:
    _, results = outcomes
    for rank, result in enumerate(results):
        assert result["wrong"] == [], f"rank {rank}"


def test_handler_error_reaches_caller(
    outcomes: tuple[int, list[dict[str, Any]]],
) -> None:
    _, results = outcomes
    for rank, result in enumerate(results):
        assert "its handler raised: ValueError" in result["error"]
        assert f"bad request from rank {rank}" in result["error"]


def _expected_request_bytes(rank: int, peer: int, offset: int, calls: int) -> int:
    total = 0
    for i in range(calls):
        ids = torch.arange(i + peer + offset, dtype=torch.int64)
        total += HEADER_BYTES + pack([ids]).numel()
    return total


def test_ledger_counts_every_request_and_answer(
    outcomes: tuple[int, list[dict[str, Any]]],
) -> None:
    world, results = outcomes
    for rank, result in enumerate(results):
        sent = {(r[1], r[2]): r[3:] for r in result["ledger"]["sent"] if r[0] == rank}
        recv = {(r[0], r[2]): r[3:] for r in result["ledger"]["recv"]}
        for peer in range(world):
            if peer == rank:
                continue
            want = _expected_request_bytes(rank, peer, 7, 20)
            assert sent[(peer, "kv.other.req")] == [want, 20]
            # What this rank received as a server equals what the peer sent.
            peer_want = _expected_request_bytes(peer, rank, 7, 20)
            assert recv[(peer, "kv.other.req")] == [peer_want, 20]
            # Answers: rows [n, 2] float32 plus the caller's rank, packed.
            rows = sum(
                HEADER_BYTES
                + pack([torch.zeros(i + peer + 7, 2), torch.tensor([0])]).numel()
                for i in range(20)
            )
            assert recv[(peer, "kv.other")] == [rows, 20]


def test_pack_round_trip_and_truncation() -> None:
    tensors = [
        torch.arange(5),
        torch.rand(3, 4),
        torch.zeros(0, 7),
        torch.tensor([True, False]),
    ]
    message = pack(tensors)
    back = unpack(message)
    assert len(back) == 4
    for a, b in zip(tensors, back, strict=True):
        assert a.dtype == b.dtype and torch.equal(a, b)
    with pytest.raises(ValueError, match="needs"):
        unpack(message[:-1])
    with pytest.raises(ValueError, match="left over"):
        unpack(torch.cat([message, torch.zeros(1, dtype=torch.uint8)]))
    with pytest.raises(ValueError, match="float64"):
        pack([torch.zeros(2, dtype=torch.float64)])


@pytest.mark.parametrize("offset", range(1, 8))
def test_unpack_reads_a_message_at_any_byte_offset(offset: int) -> None:
    """A message sliced out of a larger buffer at an offset that is not a
    multiple of 8 failed in torch ("storage_offset() must be divisible by
    8") when its int64 count was viewed in place."""
    tensors = [torch.arange(5), torch.rand(3, 4), torch.tensor([True])]
    padded = torch.cat([torch.zeros(offset, dtype=torch.uint8), pack(tensors)])
    back = unpack(padded[offset:])
    for a, b in zip(tensors, back, strict=True):
        assert a.dtype == b.dtype and torch.equal(a, b)
