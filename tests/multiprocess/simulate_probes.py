"""Worker function of tests/simulate/test_traffic.py: an engine's epoch ledger.

Runs in worker processes started by :func:`~graphwire.comm.launch.launch_local`
as ``fn(ctx, *args)``, over gloo: the emulated run the simulator's traffic
must equal.
"""

from __future__ import annotations

from typing import Any

from graphwire.comm.context import WorkerContext
from graphwire.comm.dist import TorchTransport
from graphwire.comm.ledger import recv_between, sent_between
from graphwire.fullgraph.distributed import build_engine, forward_loss
from graphwire.partition import load_part
from graphwire.run.collective import seeded_model, split_sizes
from graphwire.run.config import TrainConfig

Key = tuple[int, int, str]


def epoch_bytes(
    ctx: WorkerContext, folder: str, config: TrainConfig, exchanges: list[Any]
) -> list[dict[Key, int]]:
    """Per exchange: the bytes of the second of two training steps, per
    (src, dst, tag), as this rank's ledger has them: what it sent, and what it
    received from the switch (peer ``world_size``, which keeps no ledger)."""
    transport = TorchTransport.open(ctx)
    try:
        return [_epoch(transport, folder, config, exchange) for exchange in exchanges]
    finally:
        transport.close()


def _epoch(
    transport: TorchTransport, folder: str, config: TrainConfig, exchange: Any
) -> dict[Key, int]:
    rank, world = transport.rank, transport.world_size
    part = load_part(folder, rank)
    assert part.x is not None
    engine = build_engine(part, transport, config, exchange)
    model = seeded_model(part.x.shape[1], int(part.meta["num_classes"]), config)
    model.train()
    engine.prepare(model)
    num_train = split_sizes(part, transport)["train"]
    for epoch in (0, 1):
        transport.barrier()
        before = transport.ledger.snapshot()
        engine.begin_epoch(epoch)
        _, loss = forward_loss(engine, model, num_train, 0)
        model.zero_grad(set_to_none=True)
        loss.backward()
        engine.sync_gradients(model)
        engine.end_epoch()
    after = transport.ledger.snapshot()
    engine.close()
    out = {(rank, dst, tag): n for dst, tag, n in sent_between(before, after)}
    for src, tag, n in recv_between(before, after):
        if src == world:
            out[(src, rank, tag)] = n
    transport.barrier()
    return out
