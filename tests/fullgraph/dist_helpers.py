"""Shared set-up for the distributed full-graph tests: parts, single-process oracle."""

from __future__ import annotations

import functools
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

from graphwire.comm.base import Transport
from graphwire.comm.local import run_local
from graphwire.fullgraph.distributed import build_engine, forward_loss
from graphwire.graph.graph import Graph
from graphwire.graph.synthetic import ProductsConfig, products_graph
from graphwire.nn.models import GNN, LAYER_KINDS
from graphwire.partition import (
    Partition,
    get_partitioner,
    load_part,
    write_partitioned,
)
from graphwire.run.collective import seeded_model
from graphwire.run.config import TrainConfig
from graphwire.run.training import make_model
from tests.multiprocess.fullgraph_probes import engine_args

DROPOUT_SEED = 12345


def small_graph(nodes: int = 600) -> Graph:
    return products_graph(
        ProductsConfig(nodes=nodes, degree=8, features=12, classes=5, seed=4)
    )


def write_parts(
    graph: Graph, num_parts: int, folder: Path, method: str, node_order: str = "id"
) -> Path:
    partition = get_partitioner(method).partition(graph, num_parts, seed=0)
    out = folder / f"{method}{num_parts}-{node_order}"
    return write_partitioned(graph, partition, out, node_order=node_order)


def nan_feature_halves(folder: Path, nan: bool = True) -> Path:
    """Two parts of four nodes with no edge between them: only part 1's
    training node (3) reads the one NaN feature (``nan``), so only rank 1's
    own loss is NaN; only part 0 holds a validation node (0)."""
    x, y = torch.ones(4, 2), torch.tensor([0, 1, 0, 1])
    if nan:
        x[3, 0] = float("nan")
    graph = Graph.from_edge_index(
        [0, 2], [1, 3], 4, x=x, y=y, train_idx=[1, 3], val_idx=[0], test_idx=[2]
    )
    halves = Partition(assignment=torch.tensor([0, 0, 1, 1]), num_parts=2)
    return write_partitioned(graph, halves, folder / "nan")


def config_for(model: str, attn_dropout: float = 0.0) -> TrainConfig:
    # Feature dropout is on (the models' defaults); GAT's attention dropout is
    # off unless asked for (test_gat_attention_dropout_matches_single_process).
    return TrainConfig(
        model=model, hidden=8, heads=2, attn_dropout=attn_dropout, seed=7
    )


def single_step(
    graph: Graph, config: TrainConfig, model: GNN | None = None
) -> dict[str, Any]:
    """The oracle: logits, loss and gradients of one training forward/backward
    of ``model`` (default: ``config``'s, seeded), on ``config.model``'s graph."""
    if model is None:
        torch.manual_seed(config.seed)
        model = make_model(graph, config)
    model.train()
    mg = LAYER_KINDS[config.model].full_graph(graph)
    logits = model(
        [mg] * config.num_layers,
        graph.x,
        row_ids=torch.arange(graph.num_nodes),
        dropout_seed=DROPOUT_SEED,
    )
    assert graph.y is not None and graph.train_idx is not None
    loss = F.cross_entropy(logits[graph.train_idx], graph.y[graph.train_idx])
    loss.backward()
    return {
        "logits": logits.detach(),
        "loss": float(loss.detach()),
        "grads": {n: p.grad.clone() for n, p in model.named_parameters()},
    }


def run_dist_steps(
    folder: Path | str,
    num_parts: int,
    config: TrainConfig,
    exchange: str,
    options: dict[str, Any] | None = None,
    model: Callable[[int, int], GNN] | None = None,
) -> list[dict[str, Any]]:
    """:func:`dist_step` on ``num_parts`` in-process ranks."""
    step = functools.partial(
        dist_step,
        folder=str(folder),
        config=config,
        exchange=exchange,
        options=options,
        model=model,
    )
    return run_local(step, num_parts)


def dist_step(
    transport: Transport,
    folder: str,
    config: TrainConfig,
    exchange: str,
    options: dict[str, Any] | None = None,
    model: Callable[[int, int], GNN] | None = None,
) -> dict[str, Any]:
    """One rank's logits (with their original IDs), loss share and synced
    grads, as epoch 0 of a run (``begin_epoch``, ``end_epoch``).

    ``model(num_features, num_classes)`` builds the rank's model, with the
    oracle's weights (default: ``config``'s model, :func:`seeded_model`).
    """
    part = load_part(folder, transport.rank)
    engine = build_engine(part, transport, config, *engine_args(exchange, options))
    assert part.x is not None
    sizes = (part.x.shape[1], int(part.meta["num_classes"]))
    gnn = seeded_model(*sizes, config) if model is None else model(*sizes)
    gnn.train()
    engine.prepare(gnn)  # as train_distributed does: plans that need the model
    num_train = int(
        transport.all_reduce_sum(
            torch.tensor([float(part.train_local.numel())]), "sync.metrics"
        )
    )
    engine.begin_epoch(0)
    logits, loss = forward_loss(engine, gnn, num_train, DROPOUT_SEED)
    loss.backward()
    engine.sync_gradients(gnn)
    extra = engine.end_epoch()
    engine.close()
    return {
        "orig_nid": part.orig_nid.clone(),
        "logits": logits.detach(),
        "loss": float(loss.detach()),
        "grads": {n: p.grad.clone() for n, p in gnn.named_parameters()},
        "ledger": transport.ledger.snapshot(),
        "counters": dict(engine.counters),
        "extra": extra,  # the epoch's report (end_epoch)
        "engine": engine,  # (ranks are threads: the engine itself comes back)
    }
