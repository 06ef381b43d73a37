"""Worker functions for the service tests (run in-process and on gloo ranks).

A child process imports these by name (see :mod:`graphwire.testing.workers`).
"""

from __future__ import annotations

import threading
from typing import Any

import torch

from graphwire.comm.base import Transport, TransportError


def _rows(src: int, request: list[torch.Tensor]) -> list[torch.Tensor]:
    """Answers ``ids`` with float rows ``[id, id + 0.5]`` and the caller's rank."""
    (ids,) = request
    rows = torch.stack([ids.float(), ids.float() + 0.5], 1)
    return [rows, torch.tensor([src])]


def _fail(src: int, request: list[torch.Tensor]) -> list[torch.Tensor]:
    raise ValueError(f"bad request from rank {src}")


def service_suite(
    transport: Transport, calls: int = 20, threaded: bool = True
) -> dict[str, Any]:
    """Each rank asks every peer for rows from two threads at once, then
    checks that a failing handler's error reaches the caller."""
    service = transport.open_service(
        "kv", {"rows": _rows, "other": _rows, "fail": _fail}
    )
    rank, world = transport.rank, transport.world_size
    peers = [p for p in range(world) if p != rank]
    wrong: list[str] = []

    def ask(offset: int, kind: str) -> None:
        for i in range(calls):
            requests = {
                p: [torch.arange(i + p + offset, dtype=torch.int64) + 1000 * rank]
                for p in peers
            }
            answers = service.call(requests, kind)
            for p in peers:
                rows, caller = answers[p]
                ids = requests[p][0].float()
                if not torch.equal(rows, torch.stack([ids, ids + 0.5], 1)):
                    wrong.append(f"rows from {p} call {i}")
                if int(caller) != rank:
                    wrong.append(f"caller seen by {p}")

    other = threading.Thread(target=ask, args=(7, "other"))
    if threaded:
        other.start()
    ask(0, "rows")
    if threaded:
        other.join()
    error = ""
    if peers:
        try:
            service.call({peers[0]: [torch.zeros(1)]}, "fail")
        except TransportError as caught:
            error = str(caught)
        service.call({p: [torch.arange(3)] for p in peers}, "rows")  # still serving
    service.close()
    return {"wrong": wrong, "error": error, "ledger": transport.ledger.snapshot()}
