"""Distributed full-graph engines equal single-process training (the oracle).

Ranks run as threads over the in-process transport; the multi-process path is
covered in tests/multiprocess. Dropout is on: its masks are hashed from global node IDs
(GAT's attention masks from the edge's global endpoints and the head), so
distributed and single-process runs drop the same entries.

Tolerance: 1e-5 relative / 1e-6 absolute. Each rank sums a node's in-edges in
its local CSR order and gradients are summed over ranks, so float32 additions
happen in a different order than in one process; nothing else differs.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch

from graphwire.comm.local import run_local
from graphwire.nn.aggregate import spmm_sum
from graphwire.nn.models import GNN
from graphwire.partition import (
    Partition,
    get_partitioner,
    load_part,
    write_partitioned,
)
from graphwire.run.config import TrainConfig
from tests.fullgraph.dist_helpers import (
    config_for,
    run_dist_steps,
    single_step,
    small_graph,
    write_parts,
)

TOL = {"rtol": 1e-5, "atol": 1e-6}
# (exchange, options): G3 with small bins, so that a layer runs in many bins
# and pipelined sends and eager computation really interleave.
ENGINES = [
    ("halo", {}),
    ("halo", {"cache_input": False}),
    ("replicate", {}),
    ("g3", {"bin_rows": 16, "cache_input": False}),
    ("g3", {"bin_rows": 16}),
    ("g3", {"bin_rows": 16, "mode": "inter"}),
    ("g3", {"bin_rows": 16, "mode": "intra"}),
    ("g3", {"bin_rows": 16, "last": "bins"}),  # GCN's last layer in bins too
    ("g3", {"bin_rows": 16, "mode": "sequential"}),
    ("g3", {"bin_rows": 16, "order": "priority", "sync": "epoch"}),
    ("g3", {"bin_mb": 0.02}),  # bins cut by the memory budget, per layer
    ("g3", {}),
    ("broadcast", {}),
    ("broadcast", {"cache_input": False}),
]


@pytest.fixture(scope="module")
def graph():
    return small_graph()


@pytest.fixture(scope="module")
def oracle(graph) -> Callable[[TrainConfig], dict[str, Any]]:
    """``config -> single_step(graph, config)``, computed once per config for
    the module (the tests only read it)."""
    steps: dict[str, dict[str, Any]] = {}

    def step(config: TrainConfig) -> dict[str, Any]:
        if repr(config) not in steps:
            steps[repr(config)] = single_step(graph, config)
        return steps[repr(config)]

    return step


@pytest.fixture(scope="module")
def parts(graph, tmp_path_factory) -> Callable[..., Path]:
    """``(num_parts, method, node_order="id") -> write_parts(graph, ...)``,
    written once per split for the module (the ranks only read them)."""
    root = tmp_path_factory.mktemp("parts")
    folders: dict[tuple[int, str, str], Path] = {}

    def folder(num_parts: int, method: str, node_order: str = "id") -> Path:
        key = (num_parts, method, node_order)
        if key not in folders:
            folders[key] = write_parts(graph, num_parts, root, method, node_order)
        return folders[key]

    return folder


# One part has no halo: what shapes the exchange (modes, orders, syncs) has
# nothing to act on, so one of each engine runs there.
ONE_PART = [
    ("halo", {}),
    ("replicate", {}),
    ("g3", {"bin_rows": 16}),
    ("g3", {}),
    ("broadcast", {}),
]


@pytest.mark.parametrize(
    ("exchange", "options", "num_parts"),
    [(e, o, 1) for e, o in ONE_PART]
    + [(e, o, n) for n in (2, 3, 4) for e, o in ENGINES],
    ids=repr,
)
@pytest.mark.parametrize("model", ["gcn", "sage", "gat"])
def test_engine_matches_single_process(
    oracle, parts, exchange, options, model, num_parts
):
    config = config_for(model)
    single = oracle(config)
    method = "random" if num_parts == 3 else "metis"  # 3: uneven, many halo rows
    # 3 parts number their nodes in reverse Cuthill-McKee order (the CLI's
    # default), the others by ID: the oracle's order is the graph's.
    order = "rcm" if num_parts == 3 else "id"
    folder = parts(num_parts, method, order)
    ranks = run_dist_steps(folder, num_parts, config, exchange, options)
    _assert_matches(ranks, single)
    if exchange == "g3" and num_parts > 1:
        # GCN's and SAGE's last layers sum message by message unless told or
        # unable to (GAT's softmax needs every source row first).
        summing = model != "gat" and options.get("last", "sums") == "sums"
        summing = summing and options.get("mode", "full") in ("full", "intra")
        summed = [rank["counters"]["sums.messages"] for rank in ranks]
        assert all(summed) if summing else not any(summed)
    if exchange == "g3":
        # The cached input layer transforms every source row (GAT's lin; GCN
        # and SAGE project 12 features to 8 first): its owned and halo rows
        # are projected once per forward, as one table.
        tables = [rank["counters"]["proj.table"] for rank in ranks]
        assert tables == [int(options.get("cache_input", True))] * num_parts


@pytest.mark.parametrize(
    ("exchange", "options"),
    [
        ("halo", {}),
        ("halo", {"cache_input": False}),
        ("replicate", {}),
        ("g3", {"bin_rows": 16}),
        ("g3", {"bin_rows": 16, "cache_input": False, "mode": "sequential"}),
        ("broadcast", {"cache_input": False}),
    ],
    ids=repr,
)
@pytest.mark.parametrize("num_parts", [2, 3])
def test_gat_attention_dropout_matches_single_process(
    oracle, parts, exchange, options, num_parts
):
    """GAT with attention dropout 0.6 (and feature dropout 0.6): the engines
    hash each edge's mask from its global endpoints, as the single process
    does, so the parity holds at the same tolerance (only sums reorder)."""
    config = config_for("gat", attn_dropout=0.6)
    single = oracle(config)
    without = oracle(config_for("gat"))
    assert not torch.allclose(single["logits"], without["logits"])  # it drops
    method = "random" if num_parts == 3 else "metis"
    folder = parts(num_parts, method)
    ranks = run_dist_steps(folder, num_parts, config, exchange, options)
    _assert_matches(ranks, single)


def test_one_row_bins_match_single_process_on_cora(cora_dir, tmp_path) -> None:
    """G3 with one row per bin, 3-layer GAT with attention dropout, on Cora's
    first 400 nodes (the subgraph they induce): some of its degree-1 nodes
    have every attention edge dropped in layer 0, so their bin's output is
    all zeros (the bias starts at zero), and the dropout before layer 1 must
    still mask those zeros' gradients as the single process does (it failed
    so, on all of Cora and on this part: layer 0's bias gradient was 5%
    off). The whole of Cora took 50 s in one-row bins."""
    from dataclasses import replace

    from graphwire.graph.graph import Graph
    from graphwire.graph.planetoid import load_planetoid

    cora = load_planetoid(cora_dir, "cora")
    n = 400
    part = Graph.from_scipy(
        cora.to_scipy()[:n, :n],
        x=cora.x[:n],
        y=cora.y[:n],
        train_idx=cora.train_idx[cora.train_idx < n],
        val_idx=cora.val_idx[cora.val_idx < n],
        test_idx=cora.test_idx[cora.test_idx < n],
    )
    config = replace(
        config_for("gat", attn_dropout=0.6), num_layers=3, fanouts=[5] * 3, heads=8
    )
    oracle = single_step(part, config)
    folder = write_parts(part, 2, tmp_path, "metis")
    ranks = run_dist_steps(folder, 2, config, "g3", {"bin_rows": 1})
    _assert_matches(ranks, oracle)


@pytest.mark.parametrize(
    "options",
    [
        {"bin_rows": 16},
        {"bin_rows": 16, "cache_input": False},
        {"bin_rows": 16, "cache_input": False, "mode": "sequential"},
    ],
    ids=repr,
)
@pytest.mark.parametrize("model", ["gcn", "sage"])
@pytest.mark.parametrize("num_parts", [2, 3])
def test_g3_input_bins_reading_the_whole_table_match_single_process(
    oracle, parts, options, model, num_parts
):
    """A hidden width above the input's: the input layer aggregates its rows
    before transforming them, so G3's input bins read the whole [owned; halo]
    table in place (``dst_index``), with no per-bin gather of source rows."""
    from dataclasses import replace

    config = replace(config_for(model), hidden=16)  # the graph has 12 features
    single = oracle(config)
    method = "random" if num_parts == 3 else "metis"
    folder = parts(num_parts, method)
    ranks = run_dist_steps(folder, num_parts, config, "g3", options)
    _assert_matches(ranks, single)
    for rank in ranks:
        assert rank["counters"]["bins.in_place"] == rank["counters"]["bins.L0"]
        assert rank["counters"]["proj.table"] == 0  # it aggregates first


def _assert_matches(ranks, oracle) -> None:
    """Every rank's owned logits, the summed loss and every rank's synced
    gradients equal the single process's."""
    logits = torch.empty_like(oracle["logits"])
    for rank in ranks:
        logits[rank["orig_nid"]] = rank["logits"]
    torch.testing.assert_close(logits, oracle["logits"], **TOL)
    loss = sum(rank["loss"] for rank in ranks)
    assert loss == pytest.approx(oracle["loss"], rel=1e-5)
    for rank in ranks:
        for name, grad in oracle["grads"].items():
            torch.testing.assert_close(rank["grads"][name], grad, **TOL)


@pytest.fixture(scope="module")
def empty_part(graph, tmp_path_factory) -> Path:
    """The graph's 3 METIS parts as 4: part 3 owns no node."""
    three = get_partitioner("metis").partition(graph, 3, seed=0)
    partition = Partition(assignment=three.assignment, num_parts=4)
    return write_partitioned(
        graph, partition, tmp_path_factory.mktemp("empty") / "empty-part"
    )


@pytest.mark.parametrize(
    ("exchange", "options"),
    [
        ("halo", {}),
        ("replicate", {}),
        ("g3", {"bin_rows": 16}),
        ("g3", {"bin_rows": 16, "cache_input": False}),
        ("g3", {"bin_rows": 16, "mode": "sequential", "sync": "epoch"}),
    ],
    ids=repr,
)
@pytest.mark.parametrize("model", ["gcn", "sage", "gat", "gat-averaged-heads"])
def test_a_rank_that_owns_no_nodes_takes_part(
    oracle, empty_part, exchange, options, model
):
    """Four ranks over a 3-way split: rank 3 owns no node, yet joins every
    exchange and gradient sum, and the others still match the oracle; its
    logits have no rows and the classes' columns (GAT's output layer
    averages its heads when it has several)."""
    from dataclasses import replace

    config = config_for(model.removesuffix("-averaged-heads"))
    if model.endswith("-averaged-heads"):
        config = replace(config, out_heads=2)
    single = oracle(config)
    ranks = run_dist_steps(empty_part, 4, config, exchange, options)
    assert ranks[3]["orig_nid"].numel() == 0
    assert ranks[3]["logits"].shape == (0, single["logits"].shape[1])
    _assert_matches(ranks, single)


@pytest.mark.parametrize("exchange", ["halo", "g3"])
def test_eval_every_matches_single_process_and_skips_the_eval_traffic(
    graph, parts, exchange
) -> None:
    """With ``eval_every=2`` over 3 epochs, distributed training evaluates
    after epochs 1 and 2 only, with the single-process accuracies, and sends
    evaluation rows (``eval.*``) in those epochs only; every epoch's loss is
    still summed over the ranks."""
    from dataclasses import replace

    from graphwire.fullgraph.distributed import train_distributed
    from graphwire.fullgraph.trainer import train_fullgraph

    folder = parts(2, "metis")
    config = replace(config_for("gcn"), epochs=3, eval_every=2)

    def train(transport):
        part = load_part(folder, transport.rank)
        return train_distributed(part, transport, config, exchange).result.records

    records = run_local(train, 2)[0]
    single = train_fullgraph(graph, config).records
    for dist, one in zip(records, single, strict=True):
        assert dist.loss == pytest.approx(one.loss, rel=1e-5)
        eval_bytes = sum(
            n for tag, n in dist.comm["by_tag"].items() if tag.startswith("eval.")
        )
        if config.evaluates(dist.epoch):
            assert eval_bytes > 0
            for name in ("train_acc", "val_acc", "test_acc"):
                assert getattr(dist, name) == getattr(one, name)
        else:
            assert eval_bytes == 0
            assert dist.as_dict()["val_acc"] is None
    assert [r.epoch for r in records if config.evaluates(r.epoch)] == [1, 2]


def test_a_run_resumed_after_an_epoch_without_evaluation_goes_on(
    parts, tmp_path
) -> None:
    """Checkpoints keep the records of epochs without an evaluation (null
    accuracies); a resumed run reads them back as such and ends as the
    uninterrupted run does."""
    from dataclasses import replace

    from graphwire.fullgraph.distributed import train_distributed
    from graphwire.run.checkpoint import CheckpointConfig

    folder = parts(2, "metis")
    config = replace(config_for("gcn"), epochs=3, eval_every=2)

    def train(transport, epochs, checkpoint, restored=None):
        part = load_part(folder, transport.rank)
        run = train_distributed(
            part,
            transport,
            replace(config, epochs=epochs),
            on_restore=None
            if restored is None
            else lambda records: restored.update({transport.rank: records}),
            checkpoint=checkpoint,
        )
        return [r.as_dict() for r in run.result.records]

    saved = str(tmp_path / "ckpt")
    first = run_local(lambda t: train(t, 2, CheckpointConfig(saved, every=1)), 2)
    restored: dict = {}
    resumed = run_local(
        lambda t: train(t, 3, CheckpointConfig(saved, every=1, resume=True), restored),
        2,
    )[0]
    whole = run_local(lambda t: train(t, 3, None), 2)[0]
    # Each rank hands its restored records on (a run's stream writes them).
    for rank in range(2):
        assert [r.as_dict() for r in restored[rank]] == first[rank]
    assert [r["val_acc"] is None for r in resumed] == [True, False, False]
    for a, b in zip(resumed, whole, strict=True):
        assert a["loss"] == pytest.approx(b["loss"], rel=1e-6)
        assert a["val_acc"] == b["val_acc"]


@pytest.mark.parametrize("layers", [2, 3])
@pytest.mark.parametrize("model", ["gcn", "sage", "gat"])
@pytest.mark.parametrize(
    ("exchange", "options"),
    [("halo", {}), ("g3", {"bin_rows": 16}), ("g3", {"cache_input": False})],
    ids=repr,
)
def test_returning_only_the_read_gradients_changes_no_bit(
    parts, exchange, options, model, layers
) -> None:
    """The halo gradients the loss cannot reach (in the output layer, those
    of rows no training row reads; below, those of rows no such row reads)
    are exactly zero, so leaving them home (the default ``loss_rows``: the
    training rows) gives bitwise the logits and gradients of returning every
    row (``loss_rows=None``), with fewer backward bytes in every layer."""
    from dataclasses import replace

    folder = parts(3, "random")
    config = replace(config_for(model), num_layers=layers, fanouts=[5] * layers)
    pruned = run_dist_steps(folder, 3, config, exchange, options)
    every = run_dist_steps(folder, 3, config, exchange, {**options, "loss_rows": None})
    for a, b in zip(pruned, every, strict=True):
        assert torch.equal(a["logits"], b["logits"])
        for name, grad in a["grads"].items():
            assert torch.equal(grad, b["grads"][name]), name

    def back(ranks, layer):
        tag = f"bwd.L{layer}"
        return sum(
            r[3] for rank in ranks for r in rank["ledger"]["sent"] if r[2] == tag
        )

    # Every layer that returns gradients returns fewer (the small graph is
    # sparse enough that no layer's loss-reachable rows cover its halo).
    assert back(every, layers - 1) > 0
    for layer in range(layers):
        returned = back(every, layer)
        if returned:
            assert back(pruned, layer) < returned, layer


def test_a_run_that_stopped_early_stays_stopped_when_resumed(parts, tmp_path) -> None:
    """The epoch that stops a run early is also a checkpoint's: a resume of
    the finished run (a job script may always pass --resume) used to train on
    from there. It trains nothing now, and a larger patience goes on."""
    from dataclasses import replace

    from graphwire.fullgraph.distributed import train_distributed
    from graphwire.run.checkpoint import CheckpointConfig

    folder = parts(2, "metis")
    config = replace(config_for("gcn"), epochs=40, patience=1)
    saved = str(tmp_path / "ckpt")

    def train(transport, checkpoint, patience=1):
        part = load_part(folder, transport.rank)
        run = train_distributed(
            part, transport, replace(config, patience=patience), checkpoint=checkpoint
        )
        return [r.epoch for r in run.result.records], run.first_epoch

    ran, _ = run_local(lambda t: train(t, CheckpointConfig(saved, every=1)), 2)[0]
    assert len(ran) < config.epochs  # it stopped early
    resume = CheckpointConfig(saved, every=1, resume=True)
    again, first = run_local(lambda t: train(t, resume), 2)[0]
    assert (again, first) == (ran, len(ran))
    longer, _ = run_local(lambda t: train(t, resume, patience=40), 2)[0]
    assert len(longer) > len(ran)


class _RowwiseSum(torch.nn.Module):
    """A user's layer that is not one of graphwire's: it transforms every
    source row (``lin``, then tanh) and sums them into each destination, with
    no ``project``/``propagate`` for an engine to split it by."""

    def __init__(self, in_dim: int, out_dim: int) -> None:
        super().__init__()
        self.lin = torch.nn.Linear(in_dim, out_dim)

    def forward(self, mg, h_src):
        return spmm_sum(mg, torch.tanh(self.lin(h_src)))


def _rowwise_model(num_features: int, num_classes: int) -> GNN:
    layers = [_RowwiseSum(num_features, 8), _RowwiseSum(8, num_classes)]
    return GNN(layers, torch.relu, dropout=0.5, input_dropout=0.3)


def _rowwise_copy(weights: dict, num_features: int, num_classes: int) -> GNN:
    # The ranks are threads: each loads the oracle's weights (drawing its own
    # would interleave the draws of one generator).
    model = _rowwise_model(num_features, num_classes)
    model.load_state_dict(weights)
    return model


@pytest.mark.parametrize("num_parts", [2, 3])
def test_g3_runs_a_layer_of_the_users_own_that_it_cannot_split(graph, parts, num_parts):
    """A layer with neither ``project`` nor ``propagate`` runs whole in every
    bin: G3's cached input layer gathers each bin's source rows, its halo rows
    dropped out once per forward by the first bin that reads them, and the
    result equals the single process's."""
    torch.manual_seed(11)
    model = _rowwise_model(graph.num_features, graph.num_classes)
    weights = {k: v.clone() for k, v in model.state_dict().items()}
    oracle = single_step(graph, config_for("gcn"), model)
    method = "random" if num_parts == 3 else "metis"
    folder = parts(num_parts, method)
    copy = functools.partial(_rowwise_copy, weights)
    options = {"bin_rows": 16}
    ranks = run_dist_steps(folder, num_parts, config_for("gcn"), "g3", options, copy)
    _assert_matches(ranks, oracle)
    for rank in ranks:
        assert rank["counters"]["bins.L0"] > 1  # many bins, each gathering
        assert rank["counters"]["bins.in_place"] == 0
        assert rank["counters"]["proj.table"] == 0
