"""G3's schedule: the order in which bins run and gradients leave (in-process),
and what the first step still has to do (in a fresh interpreter)."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest
import torch

from graphwire.comm.local import run_local
from graphwire.fullgraph.distributed import (
    build_engine,
    forward_loss,
    train_distributed,
)
from graphwire.fullgraph.g3.config import G3Config
from graphwire.fullgraph.g3.engine import G3Engine
from graphwire.fullgraph.g3.stack import SumGraph
from graphwire.partition import load_part
from graphwire.run.collective import seeded_model
from tests.fullgraph.dist_helpers import (
    DROPOUT_SEED,
    config_for,
    small_graph,
    write_parts,
)
from tests.multiprocess.fullgraph_probes import engine_args

Event = tuple[str, int, bool]  # (what, layer or peer, whether the bin reads halo rows)


class _TracedWork:
    """A receive whose wait is recorded (the transport's Work, wrapped)."""

    def __init__(self, work: Any, events: list[Event], tag: str) -> None:
        self._work, self._events, self._tag = work, events, tag

    def wait(self) -> Any:
        self._events.append(("wait " + self._tag, -1, False))
        return self._work.wait()


def _traced_step(
    transport: Any, folder: str, last: str, model_name: str = "gcn"
) -> tuple[list[Event], list[int], set[int], G3Engine]:
    """One G3 training step (16-row bins, 2 layers, the last layer as
    ``last`` says): what ran, in order; the forward order of layer 0's bins;
    the layer-0 bins whose rows peers read at layer 1; the engine. For SAGE,
    the event ``root grad`` marks its last layer's root-term weight gradient."""
    config = config_for(model_name)
    part = load_part(folder, transport.rank)
    options = {"bin_rows": 16, "last": last}
    engine = build_engine(part, transport, config, *engine_args("g3", options))
    assert isinstance(engine, G3Engine)
    events: list[Event] = []
    forward_layer, isend, irecv = (
        engine.forward.layer,
        transport.isend,
        transport.irecv,
    )

    def traced_forward(index: int, *args: Any) -> Any:
        out = forward_layer(index, *args)
        if isinstance(out[2], SumGraph):
            events.append(("forward sums", index, True))
            # Fires when its backward starts (the sum's gradient; the rest of
            # finish's backward passes through the output again).
            started = ("backward sums", index, True)
            out[2].out.register_hook(
                lambda _, e=started: None if e in events else events.append(e)
            )
            return out
        for g in out[2]:
            reads_halo = bool(g.bin.src_halo.numel())
            events.append(("forward", index, reads_halo))
            # Fires when this bin's backward starts (its outputs' gradient).
            g.outs[0].register_hook(
                lambda _, i=index, r=reads_halo, b=g.index: events.append(
                    (f"backward {b}", i, r)
                )
            )
        return out

    def traced_isend(tensor: torch.Tensor, dst: int, tag: str) -> Any:
        events.append((tag, dst, False))
        return isend(tensor, dst, tag)

    def traced_irecv(tensor: torch.Tensor, src: int, tag: str) -> Any:
        return _TracedWork(irecv(tensor, src, tag), events, tag)

    engine.forward.layer = traced_forward  # type: ignore[method-assign]
    transport.isend = traced_isend  # type: ignore[method-assign]
    transport.irecv = traced_irecv  # type: ignore[method-assign]
    model = seeded_model(part.x.shape[1], int(part.meta["num_classes"]), config)
    if model_name == "sage":
        model.layers[-1].lin_self.weight.register_hook(
            lambda _: events.append(("root grad", 1, False))
        )
    model.train()
    _, loss = forward_loss(engine, model, 100, DROPOUT_SEED)
    loss.backward()
    order = [b for b, _ in engine.bin_order(0)]
    return events, order, engine.backward.returning[0], engine


def _layer0_backward(
    events: list[Event],
    walked_events: list[Event],
    order: list[int],
    returning: set[int],
    engine: Any,
) -> None:
    """Layer 0's backward (one bin per event, after layer 1's): the bins whose
    rows no peer read first, at once, those of them that read halo rows
    before the others; then the others in reverse forward order, each once
    the gradients of its rows have come back."""
    walked = [int(e[0].split()[1]) for e in walked_events]
    reads_halo = {i for i, b in enumerate(engine.layers[0].bins) if b.src_halo.numel()}
    interior = [b for b in reversed(order) if b not in returning]
    interior.sort(key=lambda b: b not in reads_halo)  # stable: halo readers first
    boundary = [b for b in reversed(order) if b in returning]
    assert interior and boundary
    assert walked == interior + boundary
    first_wait = events.index(("wait bwd.L1", -1, False))
    assert events.index(walked_events[len(interior) - 1]) < first_wait
    assert events.index(walked_events[len(interior)]) > first_wait
    # The input layer sends no gradients (the features need none).
    assert not [e for e in events if e[0] == "bwd.L0"]


def test_bins_run_in_g3_order_and_gradients_leave_before_local_bins(
    tmp_path,
) -> None:
    folder = str(write_parts(small_graph(), 2, tmp_path, "metis"))
    steps = run_local(lambda t: _traced_step(t, folder, "bins"), 2)
    for events, order, returning, engine in steps:
        layer0 = [e for e in events if e[:2] == ("forward", 0)]
        layer1 = [e for e in events if e[:2] == ("forward", 1)]
        # Input layer (halo rows cached): many bins, rows peers need first.
        assert len(layer0) > 4 and layer0[0][2] and not layer0[-1][2]
        # Last layer: two bins, the one without halo inputs first (eager).
        assert [e[2] for e in layer1] == [False, True]
        backward = [e for e in events if e[0].startswith("backward")]
        # Layer 1's backward: the halo bin, then its gradients leave, then
        # the local bin computes while they are in flight.
        assert [e[1:] for e in backward[:2]] == [(1, True), (1, False)]
        tail = events[events.index(backward[0]) :]
        assert tail[1][0] == "bwd.L1"
        assert tail.index(backward[1]) > 1
        _layer0_backward(events, backward[2:], order, returning, engine)
        # Its bins read layer 1's halo rows from one buffer, a row for each.
        assert engine.wire.halo[1].shape[0] == engine.plan.num_halo > 0


def test_a_summing_last_layer_adds_each_message_and_returns_each_at_once(
    tmp_path,
) -> None:
    folder = str(write_parts(small_graph(), 2, tmp_path, "metis"))
    steps = run_local(lambda t: _traced_step(t, folder, "sums"), 2)
    for events, order, returning, engine in steps:
        # Layer 1 (GCN: Â m + b) runs no bins: it sums every message as it
        # comes, each waited for on its own, in send order.
        assert ("forward sums", 1, True) in events
        assert not [e for e in events if e[:2] == ("forward", 1)]
        keys = engine.messages[1].keys
        assert engine.counters["sums.messages"] == len(keys) > 1
        waits = [e for e in events if e[0] == "wait fwd.L1"]
        assert len(waits) == len(keys)
        assert events.index(waits[-1]) < events.index(("forward sums", 1, True))
        # So its halo buffer, which nothing writes, holds no rows.
        assert engine.wire.halo[1].shape[0] == 0 < engine.plan.num_halo
        # Backward: every message's gradients leave at once, one per message
        # that returns rows, before any bin of layer 0 runs its backward.
        backward = [e for e in events if e[0].startswith("backward")]
        assert backward[0] == ("backward sums", 1, True)
        tail = events[events.index(backward[0]) + 1 :]
        returned = len(engine.backward.return_pos[1])
        assert returned and [e[0] for e in tail[:returned]] == ["bwd.L1"] * returned
        _layer0_backward(events, backward[1:], order, returning, engine)


def test_a_summed_sage_layer_returns_gradients_before_its_root_term(
    tmp_path,
) -> None:
    # SAGE's finish adds the root term h_dst W_self to the neighbour sum: the
    # returns need only the sum's gradient, so they leave before the root
    # term's backward runs.
    folder = str(write_parts(small_graph(), 2, tmp_path, "metis"))
    steps = run_local(lambda t: _traced_step(t, folder, "sums", "sage"), 2)
    for events, _, _, engine in steps:
        assert engine.counters["sums.messages"] > 0
        returns = [i for i, e in enumerate(events) if e[0] == "bwd.L1"]
        root = events.index(("root grad", 1, False))
        assert returns and returns[-1] < root


def _summed_step(transport: Any, folder: str) -> tuple[torch.Tensor, list[Any]]:
    """One G3 step with a summed last layer: the logits ``forward_loss``
    hands back, and the summed layer's sum leaf after its backward."""
    config = config_for("gcn")
    part = load_part(folder, transport.rank)
    options = {"bin_rows": 16, "last": "sums"}
    engine = build_engine(part, transport, config, *engine_args("g3", options))
    assert isinstance(engine, G3Engine)
    walked: list[Any] = []
    walk_sums = engine.backward.walk_sums

    def traced(index: int, summed: SumGraph, grad_out: torch.Tensor) -> Any:
        out = walk_sums(index, summed, grad_out)
        walked.append(summed.agg)
        return out

    engine.backward.walk_sums = traced  # type: ignore[method-assign]
    model = seeded_model(part.x.shape[1], int(part.meta["num_classes"]), config)
    model.train()
    logits, loss = forward_loss(engine, model, 100, DROPOUT_SEED)
    loss.backward()
    return logits, walked


def test_no_copy_of_the_logits_gradient_or_the_summed_layers(tmp_path) -> None:
    folder = str(write_parts(small_graph(), 2, tmp_path, "metis"))
    for logits, walked in run_local(lambda t: _summed_step(t, folder), 2):
        # The engine hands on the owned rows only: forward_loss takes them as
        # they are (a slice of all of them backwards into a zero-filled copy).
        assert type(logits.grad_fn).__name__ == "G3StackBackward"
        # The sum's gradient is taken as a result, not accumulated into .grad
        # (for GCN, a copy of the logits' gradient).
        assert len(walked) == 1 and walked[0].grad is None


def _prepared(
    transport: Any, folder: str, config: Any, options: dict[str, Any]
) -> tuple[str, int]:
    """Build G3 with ``options`` and prepare it for ``config``'s model: the
    error it raised ('' for none), and whether its last layer sums."""
    part = load_part(folder, transport.rank)
    engine = build_engine(part, transport, config, *engine_args("g3", options))
    assert isinstance(engine, G3Engine)
    model = seeded_model(part.x.shape[1], int(part.meta["num_classes"]), config)
    try:
        engine.prepare(model)
    except ValueError as error:
        return str(error), 0
    return "", int(engine.summed(config.num_layers - 1, model.layers[-1]) is not None)


@pytest.mark.parametrize(
    ("model", "changes", "options", "why"),
    [
        ("gat", {}, {}, "the last layer (GATConv) does not sum its sources"),
        ("gcn", {"num_layers": 1}, {}, "a one-layer model's last layer is its input"),
        ("gcn", {}, {"mode": "inter"}, "mode 'inter' computes no layer eagerly"),
        ("sage", {}, {"mode": "sequential"}, "mode 'sequential' computes no"),
        # 4 hidden columns into 5 classes: the rows cross unprojected.
        ("gcn", {"hidden": 4}, {}, "(GCNConv) does not exchange projected rows"),
    ],
)
def test_sums_asked_for_where_they_cannot_apply_are_refused(
    tmp_path, model: str, changes: dict[str, Any], options: dict[str, Any], why: str
) -> None:
    """``last='sums'`` (``--g3-last sums``) where the last layer cannot be
    summed message by message names why; it ran in bins without a word.
    Unset, the same run takes bins; where sums apply, it takes them."""
    folder = str(write_parts(small_graph(), 2, tmp_path, "metis"))
    config = dataclasses.replace(config_for(model), fanouts=None, **changes)
    for error, _ in run_local(
        lambda t: _prepared(t, folder, config, {**options, "last": "sums"}), 2
    ):
        assert error.startswith("g3 last='sums' (--g3-last sums): ")
        assert why in error
    assert (
        run_local(lambda t: _prepared(t, folder, config, options), 2) == [("", 0)] * 2
    )
    fits = config_for("gcn")
    for last in ({}, {"last": "sums"}):
        summed = run_local(lambda t, last=last: _prepared(t, folder, fits, last), 2)
        assert summed == [("", 1)] * 2


def _synced_step(transport: Any, folder: str, sync: str) -> dict[str, Any]:
    """One 3-layer G3 step with ``sync``: events in order, grads, ledger."""
    config = dataclasses.replace(config_for("gcn"), num_layers=3, fanouts=None)
    part = load_part(folder, transport.rank)
    engine = build_engine(part, transport, config, G3Config(bin_rows=16, sync=sync))
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
        # Layers 2 and 1 are complete once layer 1's bins have run their
        # backward (layer 2 exchanges projected rows: its projection runs in
        # layer 1's bins); both sums leave before layer 0's backward starts.
        assert first["sync.grad.L2"] < events.index(("weight", 0))
        assert first["sync.grad.L1"] < events.index(("weight", 0))


def _misuse(transport: Any, folder: str) -> list[str]:
    """The errors g3 gives for inputs it cannot run."""
    config = config_for("gcn")
    part = load_part(folder, transport.rank)
    engine = build_engine(part, transport, config, G3Config(bin_rows=16))
    model = seeded_model(part.x.shape[1], int(part.meta["num_classes"]), config)
    model.train()
    errors = []
    try:  # dropout between layers runs bin by bin: masks must be hashed
        engine.begin(model, None)
    except ValueError as error:
        errors.append(str(error))
    engine.begin(model, DROPOUT_SEED)
    try:  # the cached halo input rows are constants: no input gradient
        engine.run_layers(part.x.clone().requires_grad_())
    except ValueError as error:
        errors.append(str(error))
    return errors


def test_g3_rejects_unhashed_dropout_and_input_gradients_with_cached_input(
    tmp_path,
) -> None:
    folder = str(write_parts(small_graph(), 2, tmp_path, "metis"))
    for errors in run_local(lambda t: _misuse(t, folder), 2):
        assert len(errors) == 2
        assert "dropout_seed" in errors[0]
        assert "cache_input=False" in errors[1]


_FIRST_STEP = textwrap.dedent(
    """
    import json, sys
    from tests.fullgraph import dist_helpers as helpers

    # dist_step's ranks have all built their engines (and met in a sum) when
    # the first of them starts its forward: the modules there are the set-up's.
    before = []
    forward_loss = helpers.forward_loss

    def first_forward(*args):
        before.append(before[0] if before else set(sys.modules))
        return forward_loss(*args)

    helpers.forward_loss = first_forward
    helpers.run_dist_steps(sys.argv[1], 2, helpers.config_for("gcn"), "g3")
    print(json.dumps(sorted(set(sys.modules) - before[0])))
    """
)


def test_the_first_g3_step_imports_no_module(tmp_path) -> None:
    # autograd.backward with explicit gradients (the bins' backward) imports
    # torch.fx's symbolic shapes and sympy on its first call: the engine does
    # that at set-up, not in epoch 0 while the link idles. A fresh interpreter,
    # since this one has imported them already.
    folder = str(write_parts(small_graph(), 2, tmp_path, "metis"))
    root = Path(__file__).resolve().parents[3]
    done = subprocess.run(
        [sys.executable, "-c", _FIRST_STEP, folder],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=root,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    imported = json.loads(done.stdout.strip().splitlines()[-1])
    assert imported == [], imported[:10]


def _prepared_step(transport: Any, folder: str, prepare: bool) -> dict[str, Any]:
    """One G3 step (GCN, summed last layer), with or without ``prepare``
    before it; whether the plans ``prepare`` built are the ones the step ran."""
    # Hidden 16 > 12 features: the input layer aggregates first, in place.
    config = dataclasses.replace(config_for("gcn"), hidden=16)
    part = load_part(folder, transport.rank)
    engine = build_engine(part, transport, config, G3Config(bin_rows=16))
    assert isinstance(engine, G3Engine)
    model = seeded_model(part.x.shape[1], int(part.meta["num_classes"]), config)
    model.train()
    built = None
    if prepare:
        engine.prepare(model)
        built = (engine.sums.get(1), engine.table._graphs)
        assert built[0] is not None and built[1] is not None
    logits, loss = forward_loss(engine, model, 100, DROPOUT_SEED)
    loss.backward()
    engine.sync_gradients(model)
    reused = built is not None and (
        built[0] is engine.sums[1] and built[1] is engine.table._graphs
    )
    return {
        "logits": logits.detach(),
        "grads": [p.grad.clone() for p in model.parameters()],
        "reused": reused,
        "counters": dict(engine.counters),
    }


def test_prepare_builds_the_plans_in_set_up_and_the_step_runs_them(tmp_path) -> None:
    # The summed layer's split and the input layer's table graphs are built by
    # prepare (set-up), not by the first forward, which runs them unchanged.
    folder = str(write_parts(small_graph(), 2, tmp_path, "metis"))
    prepared = run_local(lambda t: _prepared_step(t, folder, True), 2)
    lazy = run_local(lambda t: _prepared_step(t, folder, False), 2)
    for a, b in zip(prepared, lazy, strict=True):
        assert a["reused"]
        assert a["counters"]["sums.messages"] > 0 and a["counters"]["bins.in_place"]
        torch.testing.assert_close(a["logits"], b["logits"], rtol=0, atol=0)
        for ga, gb in zip(a["grads"], b["grads"], strict=True):
            torch.testing.assert_close(ga, gb, rtol=0, atol=0)


def test_train_distributed_prepares_the_engine_before_epoch_0(
    tmp_path, monkeypatch
) -> None:
    folder = str(write_parts(small_graph(), 2, tmp_path, "metis"))
    calls: list[tuple[str, int]] = []
    prepare, begin = G3Engine.prepare, G3Engine.begin

    def traced_prepare(self: G3Engine, model: Any) -> None:
        calls.append(("prepare", self.transport.rank))
        prepare(self, model)

    def traced_begin(self: G3Engine, model: Any, seed: Any) -> None:
        calls.append(("begin", self.transport.rank))
        begin(self, model, seed)

    monkeypatch.setattr(G3Engine, "prepare", traced_prepare)
    monkeypatch.setattr(G3Engine, "begin", traced_begin)
    config = dataclasses.replace(config_for("gcn"), epochs=1)

    def train(transport: Any) -> None:
        part = load_part(folder, transport.rank)
        train_distributed(part, transport, config, "g3")

    run_local(train, 2)
    for rank in range(2):
        mine = [what for what, r in calls if r == rank]
        assert mine[0] == "prepare" and mine.count("prepare") == 1
        assert "begin" in mine


def test_prepare_names_a_model_of_another_depth(tmp_path) -> None:
    folder = str(write_parts(small_graph(), 2, tmp_path, "metis"))
    config = config_for("gcn")

    def prepare(transport: Any) -> None:
        part = load_part(folder, transport.rank)
        engine = build_engine(part, transport, config, "g3")
        deeper = dataclasses.replace(config, num_layers=3, fanouts=None)
        model = seeded_model(part.x.shape[1], int(part.meta["num_classes"]), deeper)
        with pytest.raises(ValueError, match="the model has 3 layers, the engine was"):
            engine.prepare(model)

    run_local(prepare, 2)


def _projections(transport: Any, folder: str, model_name: str) -> dict[str, Any]:
    """One G3 step (16-row bins, cached input): the rows of every call of the
    input layer's ``project``, and how many rows the table has."""
    config = config_for(model_name)
    part = load_part(folder, transport.rank)
    engine = build_engine(part, transport, config, G3Config(bin_rows=16))
    assert isinstance(engine, G3Engine) and engine.cache_input
    model = seeded_model(part.x.shape[1], int(part.meta["num_classes"]), config)
    model.train()
    layer = model.layers[0]
    calls: list[int] = []
    project = layer.project

    def counted(h: torch.Tensor) -> torch.Tensor:
        calls.append(h.shape[0])
        return project(h)

    layer.project = counted
    _, loss = forward_loss(engine, model, 100, DROPOUT_SEED)
    loss.backward()
    engine.sync_gradients(model)
    return {
        "calls": calls,
        "table": part.num_owned + engine.plan.num_halo,
        "bins": engine.counters["bins.L0"],
        "grad": layer.lin.weight.grad if model_name == "gat" else None,
    }


@pytest.mark.parametrize("model_name", ["gat", "gcn", "sage"])
def test_the_cached_input_layer_projects_its_table_once(tmp_path, model_name) -> None:
    """GAT widens its rows (12 features to 2 heads of 8) and so never
    exchanges projected rows, and the cached input layer's halo rows are here
    already; its bins used to project their own source rows, so rows read by
    several bins were projected again by each (with its weight gradient
    again in the backward). Now the owned and halo rows are projected once
    per forward, and the bins run ``propagate`` on their rows of that."""
    folder = str(write_parts(small_graph(), 2, tmp_path, "metis"))
    ranks = run_local(lambda t: _projections(t, folder, model_name), 2)
    for rank in ranks:
        assert rank["bins"] > 1
        assert rank["calls"] == [rank["table"]]
        if rank["grad"] is not None:
            assert rank["grad"].abs().sum() > 0
