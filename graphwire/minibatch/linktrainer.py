"""Single-process link prediction (``--task link``): unsupervised GraphSAGE/GAT.

The graph's undirected edges are split
(:func:`~graphwire.graph.links.split_links`: by default ``--val-edges``
5%, ``--test-edges`` 10%, ``--eval-negatives`` 50 per held-out edge); the
model trains on the rest. Each epoch shuffles the nodes that have a
neighbour (as the distributed schedule does,
:func:`~graphwire.minibatch.schedule.epoch_batches` with one worker) and,
per batch of seeds:

    pairs    one positive and ``--negatives`` negatives per seed, hashed
    sample   the three branches' blocks (hashed, as the distributed sampler)
    forward  embeddings of [seeds | positives | negatives], hashed dropout
    loss     binary cross-entropy of the decoder's logits of the pairs

Evaluation embeds every node with the whole training graph (exact
inference, dropout off) and scores the held-out pairs
(:func:`~graphwire.nn.link.link_metrics`). A record's accuracies are
AUCs (``val_acc``: validation AUC, which picks the best epoch; ties: lower
validation loss); ``extra["link"]`` holds every metric of both splits.
"""

from __future__ import annotations

import functools
import math
import time
from collections.abc import Callable

import torch

from graphwire.graph.graph import Graph
from graphwire.graph.links import HeldOut, LinkSplit, split_links
from graphwire.minibatch.linkbatch import LinkMaker
from graphwire.minibatch.schedule import epoch_batches, steps_per_epoch
from graphwire.nn.link import LinkModel, link_loss, link_metrics
from graphwire.nn.models import LAYER_KINDS
from graphwire.run.config import TrainConfig
from graphwire.run.records import peak_rss_mb
from graphwire.run.training import (
    BestEpoch,
    EpochRecord,
    TrainResult,
    check_finite_eval,
    check_finite_loss,
    keeps_callers_generator,
    make_model_for,
    make_optimizer,
)
from graphwire.sampler.base import SampledBatch
from graphwire.sampler.dist import OwnedCSR
from graphwire.sampler.links import HopSampler, SamplingFunctions, link_seed_nodes

__all__ = [
    "held_out_metrics",
    "link_fields",
    "link_model",
    "train_link",
    "train_link_split",
]


def link_model(num_features: int, config: TrainConfig) -> LinkModel:
    """The encoder (``hidden``-wide embeddings) and the configured decoder;
    seed torch first."""
    assert config.hidden is not None
    encoder = make_model_for(num_features, config.hidden, config)
    return LinkModel(encoder, config.decoder, config.hidden)


def train_link(
    graph: Graph,
    config: TrainConfig,
    on_epoch: Callable[[EpochRecord], None] | None = None,
) -> TrainResult:
    """Split ``graph``'s edges and train on the rest (module docstring)."""
    split = split_links(graph, **config.held_out())
    return train_link_split(split, config, on_epoch)


@keeps_callers_generator
def train_link_split(
    split: LinkSplit,
    config: TrainConfig,
    on_epoch: Callable[[EpochRecord], None] | None = None,
    functions: SamplingFunctions | None = None,
) -> TrainResult:
    """Train on ``split.graph``, score ``split.val`` and ``split.test``.

    Args:
        split: the training graph (features required) and held-out pairs.
        config: model, optimiser, fan-outs, batch size, decoder, negatives.
        on_epoch: called with each epoch's record.
        functions: the seed, positive, negative and hop functions (None:
            the uniform ones, ``config.negatives`` negatives per seed).
    """
    graph = split.graph
    if graph.x is None:
        raise ValueError(f"graph {graph.name!r}: link prediction needs features x")
    assert config.fanouts is not None
    x = graph.x
    fns = functions or SamplingFunctions(k=config.negatives)
    torch.manual_seed(config.seed)
    kind = LAYER_KINDS[config.model]
    sample_graph, edge_weight = kind.prepare(graph)
    csr = OwnedCSR(0, sample_graph.indptr, sample_graph.indices, edge_weight, 0)
    n = graph.num_nodes
    maker = LinkMaker(
        seeds=fns.seed,
        positives=lambda nid, seed: fns.positive(csr, nid, seed),
        negatives=lambda nid, seed: fns.negative(csr, nid, fns.k, seed, n),
        sample=HopSampler(csr, list(config.fanouts), fns.hop).sample,
        rows=lambda nid: (x.index_select(0, nid), {}),
    )
    seeds = link_seed_nodes(csr)
    steps = steps_per_epoch([seeds.numel()], config.batch_size)
    full = kind.full_graph(graph)
    model = link_model(graph.num_features, config)
    optimizer = make_optimizer(model, config)
    best = BestEpoch(config.patience)
    records: list[EpochRecord] = []
    for epoch in range(config.epochs):
        times = dict.fromkeys(("sample_s", "forward_s", "backward_s", "eval_s"), 0.0)
        total = 0.0
        for batch in epoch_batches(seeds, config.seed, 0, epoch, steps):
            began = time.perf_counter()
            sampled, rows, y, _ = maker.make(batch)
            made = time.perf_counter()
            loss = batch_loss(model, sampled, rows, y, batch.dropout_seed)
            forwarded = time.perf_counter()
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            times["sample_s"] += made - began
            times["forward_s"] += forwarded - made
            times["backward_s"] += time.perf_counter() - forwarded
            total += float(loss.detach()) * batch.seeds.numel()
        check_finite_loss(total, epoch, config)
        began = time.perf_counter()
        metrics: dict[str, float] = {}
        if config.evaluates(epoch):
            model.eval()
            with torch.no_grad():
                h = model([full] * config.num_layers, x)
            metrics = held_out_metrics(
                model, functools.partial(h.index_select, 0), split.val, split.test
            )
        check_finite_eval(metrics, epoch, config)
        times["eval_s"] = time.perf_counter() - began
        record = link_record(epoch, total / max(1, seeds.numel()), metrics, times)
        records.append(record)
        if on_epoch is not None:
            on_epoch(record)
        if metrics and best.update(epoch, metrics, model):
            break
    return best.result(records, model)


def batch_loss(
    model: LinkModel,
    sampled: SampledBatch,
    x: torch.Tensor,
    pairs: torch.Tensor,
    dropout_seed: int,
) -> torch.Tensor:
    """The batch's binary cross-entropy (``pairs`` int64 [3, Q], positives
    first: :mod:`~graphwire.minibatch.linkbatch`)."""
    model.train()
    h = model(sampled.blocks, x, row_ids=sampled.input_nid, dropout_seed=dropout_seed)
    logits = model.score(h, pairs[:2])
    return link_loss(logits, int(pairs[2].sum()))


def held_out_metrics(
    model: LinkModel,
    rows_of: Callable[[torch.Tensor], torch.Tensor],
    val: HeldOut,
    test: HeldOut,
) -> dict[str, float]:
    """Both splits' metrics: ``val_acc`` / ``test_acc`` their AUCs,
    ``val_loss``, and ``val_<metric>`` / ``test_<metric>`` for each of
    :func:`~graphwire.nn.link.link_metrics`' (``rows_of(nid)``: the
    embeddings of global IDs)."""
    out: dict[str, float] = {}
    with torch.no_grad():
        for name, split in (("val", val), ("test", test)):
            src, neg = split.src, split.neg
            pos = model.decoder(rows_of(src), rows_of(split.dst))
            r = neg.shape[1]
            neg_logits = model.decoder(
                rows_of(src.repeat_interleave(r)), rows_of(neg.reshape(-1))
            ).view(-1, r)
            for metric, value in link_metrics(pos, neg_logits).items():
                out[f"{name}_{metric}"] = value
    out["val_acc"], out["test_acc"] = out["val_auc"], out["test_auc"]
    return out


def link_record(
    epoch: int, loss: float, metrics: dict[str, float], times: dict[str, float]
) -> EpochRecord:
    """An epoch's record: AUCs as its accuracies, every metric in
    ``extra["link"]``."""
    return EpochRecord(
        epoch=epoch,
        loss=loss,
        train_acc=math.nan,
        val_acc=metrics.get("val_acc", math.nan),
        test_acc=metrics.get("test_acc", math.nan),
        times=times,
        peak_rss_mb=peak_rss_mb(),
        extra={"link": link_fields(metrics)} if metrics else {},
    )


def link_fields(metrics: dict[str, float]) -> dict[str, float]:
    """An epoch's held-out metrics as its record keeps them (``extra["link"]``:
    :func:`held_out_metrics`' without the accuracy aliases)."""
    return {
        k: v
        for k, v in metrics.items()
        if k.startswith(("val_", "test_")) and not k.endswith("_acc")
    }
