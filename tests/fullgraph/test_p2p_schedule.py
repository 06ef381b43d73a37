"""G3's schedule: the order in which bins run and gradients leave (in-process)."""

from __future__ import annotations

import dataclasses
from typing import Any

import torch

from graphwire.comm.local import run_local
from graphwire.fullgraph.distributed import build_engine, forward_loss, seeded_model
from graphwire.fullgraph.p2p import P2PEngine
from graphwire.partition import load_part
from tests.fullgraph.dist_helpers import (
    DROPOUT_SEED,
    config_for,
    small_graph,
    write_parts,
)

Event = tuple[str, int, bool]  # (what, layer, whether the bin reads halo rows)


def _traced_step(transport: Any, folder: str) -> list[Event]:
    """One G3 training step (16-row bins, GCN, 2 layers): what ran, in order."""
    config = config_for("gcn")
    part = load_part(folder, transport.rank)
    engine = build_engine(part, transport, config, "g3", {"bin_rows": 16})
    assert isinstance(engine, P2PEngine)
    events: list[Event] = []
    forward_bins, isend = engine._forward_bins, transport.isend

    def traced_forward(index: int, *args: Any) -> Any:
        out, graph = forward_bins(index, *args)
        for g in graph.bins:
            reads_halo = bool(g.bin.src_halo.numel())
            events.append(("forward", index, reads_halo))
            if g.src.requires_grad:  # fires when this bin's backward runs
                g.src.register_hook(
                    lambda _, i=index, r=reads_halo: events.append(("backward", i, r))
                )
        return out, graph

    def traced_isend(tensor: torch.Tensor, dst: int, tag: str) -> Any:
        events.append((tag, dst, False))
        return isend(tensor, dst, tag)

    engine._forward_bins = traced_forward  # type: ignore[method-assign]
    transport.isend = traced_isend  # type: ignore[method-assign]
    model = seeded_model(part.x.shape[1], int(part.meta["num_classes"]), config)
    model.train()
    _, loss = forward_loss(engine, model, 100, DROPOUT_SEED)
    loss.backward()
    return events


def test_bins_run_in_g3_order_and_gradients_leave_before_local_bins(
    tmp_path,
) -> None:
    folder = str(write_parts(small_graph(), 2, tmp_path, "metis"))
    for events in run_local(lambda t: _traced_step(t, folder), 2):
        layer0 = [e for e in events if e[:2] == ("forward", 0)]
        layer1 = [e for e in events if e[:2] == ("forward", 1)]
        # Input layer (halo rows cached): many bins, rows peers need first.
        assert len(layer0) > 4 and layer0[0][2] and not layer0[-1][2]
        # Last layer: two bins, the one without halo inputs first (eager).
        assert [e[2] for e in layer1] == [False, True]
        # Backward of layer 1: the halo bin, then its gradients leave, then
        # the local bin computes while they are in flight.
        tail = events[events.index(("backward", 1, True)) :]
        assert tail[1][0] == "bwd.L1"
        assert tail.index(("backward", 1, False)) > 1
        # The input layer sends no gradients (the features need none).
        assert not [e for e in events if e[0] == "bwd.L0"]


def _synced_step(transport: Any, folder: str, sync: str) -> dict[str, Any]:
    """One 3-layer G3 step with ``sync``: events in order, grads, ledger."""
    config = dataclasses.replace(config_for("gcn"), num_layers=3, fanouts=None)
    part = load_part(folder, transport.rank)
    engine = build_engine(part, transport, config, "g3", {"bin_rows": 16, "sync": sync})
    events: list[Event] = []
    isend = transport.isend

    def traced_isend(tensor: torch.Tensor, dst: int, tag: str) -> Any:
        events.append((tag, dst, False))
        return isend(tensor, dst, tag)

    transport.isend = traced_isend  # type: ignore[method-assign]
    model = seeded_model(part.x.shape[1], int(part.meta["num_classes"]), config)
    model.train()
    _, loss = forward_loss(engine, model, 100, DROPOUT_SEED)
    for index, layer in enumerate(model.layers):  # marks each layer's backward
        layer.weight.register_hook(
            lambda grad, i=index: events.append(("weight", i, False)) or grad
        )
    loss.backward()
    engine.sync_gradients(model)
    return {
        "events": events,
        "grads": [p.grad.clone() for p in model.parameters()],
        "tags": {row[2] for row in transport.ledger.snapshot()["sent"]},
    }


def test_layer_wise_sync_starts_each_layer_before_the_layers_below(tmp_path) -> None:
    folder = str(write_parts(small_graph(), 3, tmp_path, "metis"))
    layer = run_local(lambda t: _synced_step(t, folder, "layer"), 3)
    epoch = run_local(lambda t: _synced_step(t, folder, "epoch"), 3)
    for by_layer, flat in zip(layer, epoch, strict=True):
        # Bitwise the same sums: same chunks, same rank order per element.
        for a, b in zip(by_layer["grads"], flat["grads"], strict=True):
            assert torch.equal(a, b)
        assert {"sync.grad.L2", "sync.grad.L1", "sync.grad.L0"} <= by_layer["tags"]
        assert "sync.grad" not in by_layer["tags"]
        assert "sync.grad" in flat["tags"] and "sync.grad.L2" not in flat["tags"]
        events = [e[:2] for e in by_layer["events"]]
        first = {tag: events.index((tag, dst)) for tag, dst in events[::-1]}
        # Layer 2's sum leaves before layer 1's backward is done, and layer
        # 1's before layer 0's.
        assert first["sync.grad.L2"] < events.index(("weight", 1))
        assert first["sync.grad.L1"] < events.index(("weight", 0))
