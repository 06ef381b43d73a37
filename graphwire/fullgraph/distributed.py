"""Distributed full-graph training: one rank's loop, top to bottom.

Every rank builds the same model from the same seed, holds its part's rows and
runs the same epochs in lockstep. One epoch:

1. forward on the owned nodes through the engine (remote rows arrive through
   its exchanges; dropout masks are hashed from global node IDs, so they equal
   the single-process masks);
2. the loss: cross-entropy summed over the owned training nodes divided by the
   *global* number of training nodes, so the ranks' losses and gradients sum to
   the single-process ones;
3. backward (gradients of remote rows travel back to their owners);
4. the parameter gradients are summed over ranks (``sync.grad``) and every rank
   takes the same Adam step;
5. evaluation (dropout off): correct counts and the validation loss are summed
   over ranks (``sync.metrics``), so every rank sees the global accuracies and
   stops early at the same epoch; so are the bytes every rank sent and
   received in the epoch's training, per layer (:func:`traffic_by_rank`).

An epoch's ``comm`` counts this rank's traffic in its window of the run
(:class:`~graphwire.comm.ledger.LedgerWindows`): from the end of the window
before (so a checkpoint's collectives count in the next epoch) to the end of
its evaluation and sums. What came before the first epoch (loading the parts,
the engine's plans, a resumed checkpoint) is the ``setup`` window, what
followed the last (its checkpoint) the ``teardown``; with the epochs, they
add up to the ledger's totals.

Parity with :func:`graphwire.fullgraph.trainer.train_fullgraph` holds up to
float summation order, GAT attention dropout included: its masks are hashed from
each edge's original (source, destination) IDs and the head
(:meth:`~graphwire.fullgraph.base.Engine.call_layer`).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F

from graphwire.comm.base import Transport
from graphwire.comm.ledger import LedgerWindows, recv_between, sent_between
from graphwire.fullgraph.base import Engine
from graphwire.fullgraph.engines import EXCHANGES
from graphwire.graph.seeds import derive_seed
from graphwire.nn.models import GNN, LAYER_KINDS
from graphwire.partition.local import LocalPart, trainable_classes
from graphwire.run.checkpoint import CheckpointConfig
from graphwire.run.collective import (
    global_metrics,
    phase_record,
    seeded_model,
    shaped_model,
    split_sizes,
    summed_loss,
)
from graphwire.run.config import TrainConfig
from graphwire.run.job import EpochStream, Job
from graphwire.run.records import peak_rss_mb
from graphwire.run.state import (
    load_on_every_rank,
    restore_training_state,
    save_on_every_rank,
    training_state,
)
from graphwire.run.training import (
    BestEpoch,
    EpochRecord,
    TrainResult,
    check_finite_eval,
    check_finite_loss,
    make_optimizer,
)

__all__ = [
    "DistributedResult",
    "build_engine",
    "forward_loss",
    "traffic_by_rank",
    "train_distributed",
    "train_rank",
]


@dataclass(kw_only=True)
class DistributedResult:
    """One rank's view of a finished run (accuracies are global).

    Attributes:
        result: as :func:`train_fullgraph` returns, with global accuracies.
        ledger: this rank's :meth:`Ledger.snapshot` for the whole run.
        counters: engine counters (rows recomputed, bins, ...) and
            ``phases``: ``{"setup": w, "teardown": w}``, the traffic before
            the first epoch and after the last (module docstring), with
            ``w`` = ``{"seconds", "comm"}``.
        first_epoch: the first epoch this process ran (0, or the one after
            the checkpoint it resumed from); ``ledger`` counts from there.
    """

    result: TrainResult
    ledger: dict[str, Any]
    counters: dict[str, Any] = field(default_factory=dict)
    first_epoch: int = 0


def build_engine(
    part: LocalPart,
    transport: Transport,
    config: TrainConfig,
    exchange: Any = None,
    options: dict[str, Any] | None = None,
) -> Engine:
    """The exchange engine for ``config.model`` on this rank's part.

    Args:
        exchange: the engine's name (``--exchange``) or its config
            (:data:`~graphwire.fullgraph.engines.EXCHANGES`; None: its
            default, as the command line's).
        options: the engine's keywords besides its config: ``loss_rows``
            (default the training rows, which :func:`forward_loss`'s loss
            reads; None: any row), ``cache_input``, ``widths`` (default the
            model's, for an engine that takes them).
    """
    strategy, exchange_config = EXCHANGES.resolve(exchange or EXCHANGES.default)
    options = dict(options or {})
    engine_cls: type[Engine] = strategy.cls
    kind = LAYER_KINDS[config.model]
    options.setdefault("loss_rows", part.train_local)
    if engine_cls.takes_widths and "widths" not in options and part.x is not None:
        num_classes = int(part.meta.get("num_classes") or 1)
        model = shaped_model(part.x.shape[1], num_classes, config)
        options["widths"] = [_widths(layer) for layer in model.layers]
    return engine_cls(
        part, transport, kind, config.num_layers, config=exchange_config, **options
    )


def _widths(layer: torch.nn.Module) -> tuple[int, int]:
    """A layer's input row width and the width its transform gives each row
    (all heads for GAT)."""
    dims: Any = layer
    return int(dims.in_dim), int(getattr(dims, "heads", 1)) * int(dims.out_dim)


def forward_loss(
    engine: Engine, model: GNN, num_train: int, dropout_seed: int | None
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(owned logits [n, C], this rank's share of the mean training loss)``."""
    part = engine.part
    assert part.y is not None and part.train_local is not None
    engine.begin(model, dropout_seed)
    logits = model(
        engine.mgs,
        engine.x,
        **engine.model_hooks(),
        row_ids=engine.row_ids,
        dropout_seed=dropout_seed,
    )
    if logits.shape[0] != part.num_owned:
        # Not a slice of every row: its backward writes a zero-filled copy.
        logits = logits[: part.num_owned]
    train = part.train_local.to(torch.int64)
    loss = (
        F.cross_entropy(logits[train], part.y[train].to(torch.int64), reduction="sum")
        / num_train
    )
    return logits, loss


def train_distributed(
    part: LocalPart,
    transport: Transport,
    config: TrainConfig,
    exchange: Any = None,
    *,
    options: dict[str, Any] | None = None,
    on_epoch: Callable[[EpochRecord], None] | None = None,
    on_restore: Callable[[list[EpochRecord]], None] | None = None,
    checkpoint: CheckpointConfig | None = None,
) -> DistributedResult:
    """Train ``config.model`` on the whole graph, this rank holding ``part``.

    Args:
        part: this rank's part; features, labels and splits required.
        transport: connects the ranks (rank == part ID).
        config: as for single-process training.
        exchange: the engine's name (``halo``, ``replicate``, ``g3``) or its
            config (None: the registry's default, as the command line's).
        options: the engine's own keywords (:func:`build_engine`).
        on_epoch: called on every rank with each epoch's record.
        on_restore: called on every rank with the records a resume restored.
        checkpoint: checkpoint every K epochs and/or resume from the latest.

    Returns:
        The run, with accuracies over all ranks' nodes.
    """
    num_classes = trainable_classes(part)
    assert part.x is not None  # (trainable_classes checked it)
    began = time.perf_counter()
    windows = LedgerWindows(transport.ledger)
    sizes = split_sizes(part, transport)  # first: it checks no split is empty
    engine = build_engine(part, transport, config, exchange, options)
    model = seeded_model(part.x.shape[1], num_classes, config)
    engine.prepare(model)  # plans that need the model: set-up, not epoch 0
    optimizer = make_optimizer(model, config)
    best = BestEpoch(config.patience)
    records: list[EpochRecord] = []
    first = 0
    if checkpoint is not None and checkpoint.resume:
        state = load_on_every_rank(checkpoint, transport)
        if state is not None:
            first = restore_training_state(state, model, optimizer, best, records)
            if "engine" in state:  # (checkpoints of engines that keep state)
                engine.load_state_dict(state["engine"])
            if on_restore is not None:
                on_restore(list(records))
    # Set-up ends when every rank's has: epoch 0 of a rank done early would
    # otherwise count, as its own, the wait for the slowest peer's set-up.
    transport.barrier()
    phases = {"setup": phase_record(windows.cut(), began)}
    ended = time.perf_counter()  # the last window's end
    stopped = best.stopped  # a resumed run that had stopped early
    for epoch in range(first, config.epochs):
        if stopped:
            break
        transport.phase = f"epoch {epoch}"  # told by a rank held up
        before = transport.ledger.snapshot()
        engine.reset_timers()
        start, cpu_start = time.perf_counter(), time.process_time()
        model.train()
        engine.phase = ""
        engine.begin_epoch(epoch)
        _, loss = forward_loss(
            engine, model, sizes["train"], derive_seed(config.seed, epoch)
        )
        forward_done = time.perf_counter()
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        sync_start = time.perf_counter()
        engine.sync_gradients(model)
        sync_done = time.perf_counter()
        optimizer.step()
        backward_done = time.perf_counter()
        cpu_s = time.process_time() - cpu_start
        comm_s = engine.comm_s
        engine_extra = engine.end_epoch()
        trained = transport.ledger.snapshot()

        if config.evaluates(epoch):
            model.eval()
            engine.phase = "eval."
            with torch.no_grad():
                logits, _ = forward_loss(engine, model, sizes["train"], None)
                metrics = global_metrics(logits, part, transport, sizes, loss.detach())
        else:
            metrics = {"loss": summed_loss(transport, float(loss.detach()))}
        eval_done = time.perf_counter()
        # The loss summed over ranks: NaN or infinite on every rank alike if
        # on any, so every rank raises here and none waits in a collective.
        check_finite_loss(metrics["loss"], epoch, config)
        check_finite_eval(metrics, epoch, config)
        by_rank = traffic_by_rank(before, trained, transport, config.num_layers)
        comm = windows.cut() | {"by_rank": by_rank}
        ended = time.perf_counter()
        record = EpochRecord(
            epoch=epoch,
            loss=metrics.pop("loss"),
            train_acc=metrics.get("train_acc", math.nan),
            val_acc=metrics.get("val_acc", math.nan),
            test_acc=metrics.get("test_acc", math.nan),
            times={
                "sample_s": 0.0,
                "forward_s": forward_done - start,
                "backward_s": (sync_start - forward_done) + (backward_done - sync_done),
                "sync_s": sync_done - sync_start,
                "eval_s": eval_done - backward_done,
                "comm_s": comm_s,
            },
            peak_rss_mb=peak_rss_mb(),
            comm=comm,
            extra={"cpu_s": cpu_s} | engine_extra,
        )
        records.append(record)
        if on_epoch is not None:
            on_epoch(record)
        stopped = bool(metrics) and best.update(epoch, metrics, model)
        if checkpoint is not None and checkpoint.due(epoch, config.epochs, stopped):
            _save(checkpoint, epoch, transport, engine, model, optimizer, best, records)
    engine.close()
    transport.phase = "teardown"
    ledger = transport.ledger.snapshot()
    phases["teardown"] = phase_record(windows.cut(ledger), ended)
    return DistributedResult(
        result=best.result(records, model),
        ledger=ledger,
        counters=dict(engine.counters) | {"phases": phases},
        first_epoch=first,
    )


def traffic_by_rank(
    before: dict[str, Any],
    after: dict[str, Any],
    transport: Transport,
    num_layers: int,
) -> dict[str, dict[str, list[int]]]:
    """Collective: the bytes every rank sent and received, by kind of traffic.

    Between two of this rank's ledger snapshots (an epoch's training).

    The kinds are each layer's exchanges (``fwd.L0``, ``bwd.L0``, ...),
    ``sync.grad`` (the parameter gradients' sums, layer-wise ones included)
    and ``other``. Each rank counts what it sent, to whom; one sum (tag
    ``sync.metrics``) gives every rank the totals.

    Returns:
        ``{kind: {"sent": [bytes per rank], "recv": [bytes per rank]}}`` for
        the kinds with traffic, in the order above.
    """
    kinds = [f"{way}.L{layer}" for layer in range(num_layers) for way in ("fwd", "bwd")]
    kinds += ["sync.grad", "other"]
    position = {kind: k for k, kind in enumerate(kinds)}
    counts = torch.zeros((2, len(kinds), transport.world_size), dtype=torch.float64)
    for dst, tag, delta in sent_between(before, after):
        if tag.startswith("sync.grad"):
            tag = "sync.grad"
        k = position.get(tag, len(kinds) - 1)
        counts[0, k, transport.rank] += delta
        if dst < transport.world_size:
            counts[1, k, dst] += delta
    # Peers past the last rank (the switch process) send to this rank only:
    # what it received from them is its own to count.
    for src, tag, delta in recv_between(before, after):
        if src >= transport.world_size:
            k = position.get(tag, len(kinds) - 1)
            counts[1, k, transport.rank] += delta
    total = transport.all_reduce_sum(counts, "sync.metrics").to(torch.int64)
    return {
        kind: {"sent": total[0, k].tolist(), "recv": total[1, k].tolist()}
        for k, kind in enumerate(kinds)
        if bool(total[0, k].any())
    }


def _save(
    checkpoint: CheckpointConfig,
    epoch: int,
    transport: Transport,
    engine: Engine,
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    best: BestEpoch,
    records: list[EpochRecord],
) -> None:
    state = training_state(epoch, model, optimizer, best, records)
    state["engine"] = engine.state_dict()  # caches, stamps: a resume equals a run
    save_on_every_rank(checkpoint, epoch, transport, state)


def train_rank(
    part: LocalPart, transport: Transport, job: Job, on_epoch: EpochStream
) -> DistributedResult:
    """:func:`train_distributed` as a distributed job runs it.

    The job is a :class:`~graphwire.run.job.Job`; ``job.strategy`` is the
    exchange's name or config."""
    return train_distributed(
        part,
        transport,
        job.config,
        job.strategy,
        on_epoch=on_epoch,
        on_restore=on_epoch.restored,
        checkpoint=job.rank_checkpoint(),
    )
