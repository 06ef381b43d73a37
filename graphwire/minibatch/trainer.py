"""Single-process mini-batch training with uniform neighbour sampling.

Each epoch shuffles the training nodes (a generator seeded by ``(seed, epoch)``),
cuts them into batches of ``batch_size`` seeds, and for each batch:

    sample   blocks = sampler.sample(seeds, derive_seed(seed, epoch, batch))
    forward  logits = model(blocks, x[input_nid]); loss on the seeds' labels
    backward loss.backward(); Adam step

Evaluation is full-graph inference after every epoch: the model runs on the
whole (prepared) graph with every neighbour, layer by layer, with dropout off,
as DGL's GraphSAGE example does. It is exact and deterministic (no sampling
noise in the validation accuracy that picks the best epoch) and cheap at the
sizes a single process trains on; the reported accuracy is the test accuracy at
the epoch of best validation accuracy.

GCN samples from ``A + I`` and its blocks carry the *full graph's* ``gcn_norm``
for the sampled edges, each scaled by its destination's in-degree over the
edges it kept (:func:`~graphwire.sampler.uniform.sampled_weights`: unbiased,
and exact where every edge is kept); GAT samples from ``A + I``; SAGE from
``A``.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable

import torch
import torch.nn.functional as F

from graphwire.graph.graph import Graph
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
from graphwire.sampler.base import derive_seed
from graphwire.sampler.uniform import UniformNeighborSampler

__all__ = ["train_minibatch"]


@keeps_callers_generator
def train_minibatch(
    graph: Graph,
    config: TrainConfig,
    on_epoch: Callable[[EpochRecord], None] | None = None,
) -> TrainResult:
    """Train ``config.model`` on sampled mini-batches with Adam.

    torch's default generator is seeded with ``config.seed`` for the run; the
    caller's generator state is put back after it.

    Args:
        graph: with features ``x`` float32 [N, F], labels ``y`` int64 [N] and
            train/val/test index splits.
        config: model, optimiser, ``fanouts`` (input layer first), ``batch_size``
            and stopping settings.
        on_epoch: called with each epoch's record as soon as it is complete.

    Returns:
        Accuracies at the best-validation epoch, per-epoch records, weights.
    """
    x, y = check_trainable(graph)
    assert config.fanouts is not None and graph.train_idx is not None
    torch.manual_seed(config.seed)  # initialisation and dropout
    kind = LAYER_KINDS[config.model]
    sample_graph, edge_weight = kind.prepare(graph)
    sampler = UniformNeighborSampler(
        sample_graph, config.fanouts, config.seed, edge_weight=edge_weight
    )
    full = kind.full_graph(graph)
    model = make_model(graph, config)
    optimizer = make_optimizer(model, config)
    best = BestEpoch(config.patience)
    records: list[EpochRecord] = []
    for epoch in range(config.epochs):
        times = dict.fromkeys(("sample_s", "forward_s", "backward_s", "eval_s"), 0.0)
        model.train()
        shuffle = torch.Generator().manual_seed(derive_seed(config.seed, epoch))
        order = graph.train_idx[
            torch.randperm(graph.train_idx.numel(), generator=shuffle)
        ]
        total_loss = 0.0
        for batch_index, seeds in enumerate(order.split(config.batch_size)):
            start = time.perf_counter()
            batch = sampler.sample(seeds, derive_seed(config.seed, epoch, batch_index))
            sampled = time.perf_counter()
            logits = model(batch.blocks, x[batch.input_nid])
            loss = F.cross_entropy(logits, y[seeds])
            forward_done = time.perf_counter()
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            backward_done = time.perf_counter()
            total_loss += float(loss.detach()) * seeds.numel()
            times["sample_s"] += sampled - start
            times["forward_s"] += forward_done - sampled
            times["backward_s"] += backward_done - forward_done

        check_finite_loss(total_loss, epoch, config)
        start = time.perf_counter()
        metrics: dict[str, float] = {}
        if config.evaluates(epoch):
            model.eval()
            with torch.no_grad():
                metrics = split_metrics(model([full] * config.num_layers, x), graph)
        check_finite_eval(metrics, epoch, config)
        times["eval_s"] = time.perf_counter() - start

        record = EpochRecord(
            epoch=epoch,
            loss=total_loss / max(1, order.numel()),
            train_acc=metrics.get("train_acc", math.nan),
            val_acc=metrics.get("val_acc", math.nan),
            test_acc=metrics.get("test_acc", math.nan),
            times=times,
            peak_rss_mb=peak_rss_mb(),
        )
        records.append(record)
        if on_epoch is not None:
            on_epoch(record)
        if metrics and best.update(epoch, metrics, model):
            break
    return best.result(records, model)
