"""ExchangePlan's backward: the blocking and the non-blocking gradient return."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from graphwire.comm.local import run_local
from graphwire.comm.plan import ExchangePlan
from graphwire.partition import load_part
from tests.fullgraph.dist_helpers import small_graph, write_parts


def _both(transport: Any, folder: str) -> dict[str, Any]:
    plan = ExchangePlan.build(load_part(folder, transport.rank), transport)
    # Values that make the float sum order visible.
    gen = torch.Generator().manual_seed(transport.rank)
    grad_halo = torch.randn((plan.num_halo, 5), generator=gen) * 1e3
    blocking = plan.scatter_grad(grad_halo, transport, "bwd.block")
    own = torch.randn((plan.num_owned, 5), generator=gen)
    pending = plan.start_scatter_grad(grad_halo, transport, "bwd.start")
    into = pending.wait(own.clone())
    ledger = transport.ledger.snapshot()
    return {"blocking": blocking, "own": own, "into": into, "ledger": ledger}


def test_started_gradient_return_equals_the_blocking_one(tmp_path: Path) -> None:
    folder = str(write_parts(small_graph(), 3, tmp_path, "random"))
    for out in run_local(lambda t: _both(t, folder), 3):
        # The returned rows added to ``own`` (one peer at a time, so equal up to
        # float rounding to own + the blocking sum).
        expected = out["own"].clone()
        for row, value in enumerate(out["blocking"]):
            expected[row] += value
        torch.testing.assert_close(out["into"], expected, rtol=1e-6, atol=1e-3)
        assert not torch.equal(out["blocking"], torch.zeros_like(out["blocking"]))
        sent = {(r[1], r[2]): r[3] for r in out["ledger"]["sent"]}
        for (peer, tag), size in sent.items():
            if tag == "bwd.start":
                assert sent[(peer, "bwd.block")] == size  # the same bytes per peer
