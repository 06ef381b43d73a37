"""Full-graph training on Cora: accuracy, determinism, early stopping, records."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import pytest
import torch

from graphwire.fullgraph.trainer import train_fullgraph
from graphwire.graph.graph import Graph
from graphwire.graph.planetoid import load_planetoid
from graphwire.nn.models import LAYER_KINDS
from graphwire.run.config import TrainConfig
from graphwire.run.training import (
    EpochRecord,
    TrainResult,
    make_model,
    split_metrics,
)


@pytest.fixture(scope="module")
def cora(cora_dir: Path) -> Graph:
    return load_planetoid(cora_dir, "cora")


def _short(model: str, seed: int = 3) -> TrainConfig:
    """4 epochs of a small ``model``: the runs the determinism and node-order
    tests compare."""
    return TrainConfig(model=model, epochs=4, seed=seed, hidden=4, heads=2)


@pytest.fixture(scope="module")
def short_run(cora: Graph) -> Callable[[str], TrainResult]:
    """``model -> train_fullgraph(cora, _short(model))``, trained once for the
    module: the first run of the determinism test, the plain one of the
    node-order test."""
    runs: dict[str, TrainResult] = {}

    def run(model: str) -> TrainResult:
        if model not in runs:
            runs[model] = train_fullgraph(cora, _short(model))
        return runs[model]

    return run


def test_gcn_reaches_kipf_accuracy_on_cora(cora: Graph) -> None:
    """Kipf & Welling report 81.5%; 5 seeds of ours average about 82% over
    their 200 epochs, and over 125 reach 80.5-82.1% (seed 0: 80.5%)."""
    result = train_fullgraph(cora, TrainConfig(model="gcn", seed=0, epochs=125))
    assert result.epochs_run == 125  # no patience: every epoch runs
    assert result.test_acc >= 0.79
    best = result.records[result.best_epoch]
    assert (best.test_acc, best.val_acc) == (result.test_acc, result.val_acc)
    assert result.val_acc == max(r.val_acc for r in result.records)


@pytest.mark.slow
def test_gat_reaches_paper_accuracy_on_cora(cora: Graph) -> None:
    """The GAT paper reports 83.0%; seeds 0-4 of ours average 82.4% over the
    default 200 epochs (80.1% at least). Their best epochs come early: over
    100 epochs they reach 80.9-82.3% (seed 0: 81.5%)."""
    result = train_fullgraph(cora, TrainConfig(model="gat", seed=0, epochs=100))
    assert result.test_acc >= 0.80


@pytest.mark.parametrize("model", ["gcn", "sage", "gat"])
def test_same_seed_gives_identical_runs(
    cora: Graph, short_run: Callable[[str], TrainResult], model: str
) -> None:
    one = short_run(model)
    two = train_fullgraph(cora, _short(model))
    for a, b in zip(one.records, two.records, strict=True):
        assert (a.loss, a.train_acc, a.val_acc, a.test_acc) == (
            b.loss,
            b.train_acc,
            b.val_acc,
            b.test_acc,
        )
    for name, tensor in one.state_dict.items():
        assert torch.equal(tensor, two.state_dict[name]), name
    # Another seed: another first epoch already.
    other = train_fullgraph(cora, replace(_short(model, seed=4), epochs=1))
    assert other.records[0].loss != one.records[0].loss


def test_early_stopping_and_epoch_callback(cora: Graph) -> None:
    seen: list[EpochRecord] = []
    # lr so small that validation accuracy stops improving within a few epochs.
    config = TrainConfig(model="gcn", epochs=200, patience=3, lr=1e-7)
    result = train_fullgraph(cora, config, on_epoch=seen.append)
    assert result.epochs_run < 200
    assert result.epochs_run == len(result.records) == len(seen)
    assert result.epochs_run - 1 - result.best_epoch == 3
    record = seen[-1]
    assert set(record.times) == {"sample_s", "forward_s", "backward_s", "eval_s"}
    assert record.times["sample_s"] == 0.0
    assert record.peak_rss_mb > 0
    assert record.extra["cpu_s"] > 0  # the process's CPU time over the step
    assert record.as_dict()["epoch"] == result.epochs_run - 1
    # The best weights reproduce the best epoch's accuracies.
    model = make_model(cora, config).eval()
    model.load_state_dict(result.best_state_dict)
    mg = LAYER_KINDS["gcn"].full_graph(cora)
    assert cora.x is not None
    with torch.no_grad():
        metrics = split_metrics(model([mg, mg], cora.x), cora)
    assert (metrics["val_acc"], metrics["test_acc"]) == (
        result.val_acc,
        result.test_acc,
    )


def test_graph_without_labels_is_rejected() -> None:
    graph = Graph.from_edge_index([0, 1], [1, 0], x=torch.ones(2, 3))
    with pytest.raises(ValueError, match="y, train_idx, val_idx, test_idx"):
        train_fullgraph(graph, TrainConfig(model="gcn", epochs=1))


def test_gnn_clearly_beats_mlp_on_the_synthetic_default() -> None:
    """The generator's promise: features alone are weak, neighbourhoods strong.
    (It holds at any size: at 2,000 nodes, generator seeds 0-3, the margin is
    0.60-0.68, as at 6,000.)"""
    from graphwire.graph.synthetic import ProductsConfig, products_graph

    graph = products_graph(
        ProductsConfig(nodes=2000, degree=20, features=100, classes=10, seed=0)
    )
    config = TrainConfig(model="sage", epochs=40, seed=0, hidden=64)
    gnn = train_fullgraph(graph, config).test_acc
    # The same model without edges: SAGE's self term alone is an MLP.
    empty = torch.empty(0, dtype=torch.int64)
    no_edges = Graph.from_edge_index(
        empty,
        empty,
        graph.num_nodes,
        x=graph.x,
        y=graph.y,
        train_idx=graph.train_idx,
        val_idx=graph.val_idx,
        test_idx=graph.test_idx,
    )
    mlp = train_fullgraph(no_edges, config).test_acc
    assert gnn > mlp + 0.2, (gnn, mlp)


def test_eval_every_evaluates_only_the_named_epochs(cora: Graph) -> None:
    """``eval_every=3`` over 7 epochs: accuracies after epochs 2, 5 and 6 (the
    last), equal to an every-epoch run's; training is untouched; the other
    records carry NaN, logged as null; the best epoch is an evaluated one."""
    every = TrainConfig(model="gcn", epochs=7, seed=2)
    sparse = TrainConfig(model="gcn", epochs=7, seed=2, eval_every=3)
    assert [e for e in range(7) if sparse.evaluates(e)] == [2, 5, 6]
    one, three = train_fullgraph(cora, every), train_fullgraph(cora, sparse)
    for a, b in zip(one.records, three.records, strict=True):
        assert a.loss == b.loss
        if sparse.evaluates(a.epoch):
            assert (a.train_acc, a.val_acc, a.test_acc) == (
                b.train_acc,
                b.val_acc,
                b.test_acc,
            )
        else:
            logged = b.as_dict()
            assert [logged[k] for k in ("train_acc", "val_acc", "test_acc")] == [
                None
            ] * 3
    assert three.best_epoch in (2, 5, 6)
    best = max((2, 5, 6), key=lambda e: one.records[e].val_acc)
    assert three.val_acc == one.records[best].val_acc
    with pytest.raises(ValueError, match="eval_every"):
        TrainConfig(eval_every=0)


@pytest.mark.parametrize("model", ["gcn", "sage", "gat"])
def test_rcm_node_order_trains_the_same_model(
    cora: Graph, short_run: Callable[[str], TrainResult], model: str, monkeypatch
) -> None:
    # Rows laid out in reverse Cuthill-McKee order: the same dropout masks
    # (drawn by the graph's node IDs) and the same sums in another order, so
    # the same losses and weights up to float rounding (float32, a few ulps
    # over 4 epochs of Adam).
    config = _short(model)
    plain = short_run(model)
    permuted: list[torch.Tensor] = []

    def spy(graph: Graph, order: torch.Tensor) -> Graph:
        permuted.append(order)
        return permute(graph, order)

    permute = Graph.permute
    monkeypatch.setattr(Graph, "permute", spy)
    ordered = train_fullgraph(cora, config, node_order="rcm")
    (order,) = permuted  # the run trained on the reordered rows
    assert not torch.equal(order, torch.arange(cora.num_nodes))
    for a, b in zip(plain.records, ordered.records, strict=True):
        assert b.loss == pytest.approx(a.loss, rel=1e-5)
        assert (a.train_acc, a.val_acc, a.test_acc) == (
            b.train_acc,
            b.val_acc,
            b.test_acc,
        )
    for name, tensor in plain.state_dict.items():
        got = ordered.state_dict[name]
        torch.testing.assert_close(got, tensor, rtol=1e-4, atol=1e-5)
    with pytest.raises(ValueError, match="node_order: expected one of"):
        train_fullgraph(cora, config, node_order="bfs")
