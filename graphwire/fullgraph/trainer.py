"""Single-process full-graph training: every epoch runs every layer on all nodes.

One epoch reads top to bottom: forward on the whole graph (dropout on), the
cross-entropy loss on the training nodes, backward, one Adam step, then an
evaluation forward (dropout off) that scores train/val/test. The reported
accuracy is the test accuracy at the epoch of best validation accuracy.

The graph each model aggregates over comes from its layer kind
(:meth:`graphwire.nn.models.LayerKind.prepare`): GCN uses ``A + I`` with
``gcn_norm`` weights, GAT ``A + I``, SAGE ``A``. The same MessageGraph is passed
to every layer.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable

import torch
import torch.nn.functional as F

from graphwire.graph.graph import Graph
from graphwire.graph.order import NODE_ORDERS, locality_order
from graphwire.graph.seeds import derive_seed
from graphwire.nn.models import LAYER_KINDS
from graphwire.run.config import TrainConfig
from graphwire.run.records import peak_rss_mb
from graphwire.run.training import (
    BestEpoch,
    EpochRecord,
    TrainResult,
    check_finite_eval,
    check_finite_loss,
    check_trainable,
    keeps_callers_generator,
    make_model,
    make_optimizer,
    split_metrics,
)

__all__ = ["train_fullgraph"]


@keeps_callers_generator
def train_fullgraph(
    graph: Graph,
    config: TrainConfig,
    on_epoch: Callable[[EpochRecord], None] | None = None,
    *,
    node_order: str = "id",
) -> TrainResult:
    """Train ``config.model`` on the whole graph with Adam.

    torch's default generator is seeded with ``config.seed`` for the run; the
    caller's generator state is put back after it.

    Args:
        graph: with features ``x`` float32 [N, F], labels ``y`` int64 [N] and
            train/val/test index splits.
        config: model, optimiser and stopping settings (``fanouts`` and
            ``batch_size`` are unused here).
        on_epoch: called with each epoch's record as soon as it is complete.
        node_order: how the rows are laid out in memory while training: ``id``
            as in ``graph``, or ``rcm``
            (:func:`~graphwire.graph.order.locality_order`: neighbours close
            together, for faster sparse products; the run holds a reordered
            copy of the graph and its features). Dropout masks follow the
            nodes' IDs in ``graph`` either way, so both train the same model
            up to float rounding.

    Returns:
        Accuracies at the best-validation epoch, per-epoch records, weights.
    """
    check_trainable(graph)  # before the reordering's work
    if node_order not in NODE_ORDERS:
        raise ValueError(
            f"node_order: expected one of {NODE_ORDERS}, got {node_order!r}"
        )
    # Hashed dropout draws by node ID, as on any worker: the graph's own IDs.
    row_ids = torch.arange(graph.num_nodes)
    if node_order == "rcm":
        row_ids = locality_order(graph.indptr, graph.indices)
        graph = graph.permute(row_ids)
    x, y = check_trainable(graph)
    torch.manual_seed(config.seed)  # initialisation (dropout masks are hashed)
    mg = LAYER_KINDS[config.model].full_graph(graph)
    mgs = [mg] * config.num_layers
    model = make_model(graph, config)
    optimizer = make_optimizer(model, config)
    train_idx, train_y = graph.train_idx, y[graph.train_idx]
    best = BestEpoch(config.patience)
    records: list[EpochRecord] = []
    for epoch in range(config.epochs):
        start, cpu_start = time.perf_counter(), time.process_time()
        model.train()
        logits = model(
            mgs, x, row_ids=row_ids, dropout_seed=derive_seed(config.seed, epoch)
        )
        loss = F.cross_entropy(logits[train_idx], train_y)
        loss_value = float(loss.detach())  # a host sync point (as the record's)
        check_finite_loss(loss_value, epoch, config)
        forward_done = time.perf_counter()
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        backward_done = time.perf_counter()
        cpu_s = time.process_time() - cpu_start

        metrics: dict[str, float] = {}
        if config.evaluates(epoch):
            model.eval()
            with torch.no_grad():
                metrics = split_metrics(model(mgs, x), graph)
        check_finite_eval(metrics, epoch, config)
        eval_done = time.perf_counter()

        record = EpochRecord(
            epoch=epoch,
            loss=loss_value,
            train_acc=metrics.get("train_acc", math.nan),
            val_acc=metrics.get("val_acc", math.nan),
            test_acc=metrics.get("test_acc", math.nan),
            times={
                "sample_s": 0.0,
                "forward_s": forward_done - start,
                "backward_s": backward_done - forward_done,
                "eval_s": eval_done - backward_done,
            },
            peak_rss_mb=peak_rss_mb(),
            extra={"cpu_s": cpu_s},
        )
        records.append(record)
        if on_epoch is not None:
            on_epoch(record)
        if metrics and best.update(epoch, metrics, model):
            break
    return best.result(records, model)
