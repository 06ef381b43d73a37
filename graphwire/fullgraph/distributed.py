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
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F

from graphwire.comm.base import Transport
from graphwire.comm.ledger import LedgerWindows, sent_between
from graphwire.fullgraph.base import Engine, get_engine, sum_gradients
from graphwire.graph.seeds import derive_seed
from graphwire.nn.models import GNN, LAYER_KINDS
from graphwire.partition.local import LocalPart, trainable_classes
from graphwire.run.checkpoint import (
    CheckpointConfig,
    load_checkpoint,
    mark_complete,
    save_checkpoint,
)
from graphwire.run.config import TrainConfig
from graphwire.run.records import peak_rss_mb
from graphwire.run.training import (
    SPLITS,
    BestEpoch,
    EpochRecord,
    TrainResult,
    check_finite_eval,
    check_finite_loss,
    check_split_sizes,
    make_model_for,
    make_optimizer,
)

__all__ = [
    "TRAINING_TAGS",
    "DistributedResult",
    "build_engine",
    "forward_loss",
    "load_on_every_rank",
    "phase_record",
    "restore_training_state",
    "save_on_every_rank",
    "seeded_model",
    "summed_loss",
    "sync_gradients",
    "traffic_by_rank",
    "train_distributed",
    "training_state",
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
    exchange: str,
    options: dict[str, Any] | None = None,
) -> Engine:
    """The ``exchange`` engine for ``config.model`` on this rank's part.

    The loss of :func:`forward_loss` reads the training rows, so they are the
    engine's ``loss_rows`` unless ``options`` says otherwise (None: any row).
    """
    engine_cls = get_engine(exchange)
    kind = LAYER_KINDS[config.model]
    options = dict(options or {})
    options.setdefault("loss_rows", part.train_local)
    if engine_cls.takes_widths and "widths" not in options and part.x is not None:
        num_classes = int(part.meta.get("num_classes") or 1)
        # A throw-away model for its shapes; torch's generator is left as it was.
        with _INIT_LOCK, torch.random.fork_rng(devices=[]):
            model = make_model_for(part.x.shape[1], num_classes, config)
        options["widths"] = [_widths(layer) for layer in model.layers]
    return engine_cls(part, transport, kind, config.num_layers, **options)


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


# torch's default generator is per process: ranks that are threads of one
# process (the in-process transport) must not interleave their draws.
_INIT_LOCK = threading.Lock()


def seeded_model(num_features: int, num_classes: int, config: TrainConfig) -> GNN:
    """The model with the initial weights every rank (and one process) gets."""
    with _INIT_LOCK:
        torch.manual_seed(config.seed)
        return make_model_for(num_features, num_classes, config)


def sync_gradients(model: torch.nn.Module, transport: Transport) -> None:
    """Sum every parameter's gradient over ranks, in one flat all-reduce."""
    sum_gradients(list(model.parameters()), transport, "sync.grad")


def train_distributed(
    part: LocalPart,
    transport: Transport,
    config: TrainConfig,
    exchange: str = "halo",
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
        exchange: engine name (``halo``, ``replicate``, ``g3``).
        options: engine options.
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
    sizes = _split_sizes(part, transport)  # first: it checks no split is empty
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
        before = transport.ledger.snapshot()
        engine.reset_timers()
        start, cpu_start = time.perf_counter(), time.process_time()
        model.train()
        engine.phase = ""
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
        trained = transport.ledger.snapshot()

        if config.evaluates(epoch):
            model.eval()
            engine.phase = "eval."
            with torch.no_grad():
                logits, _ = forward_loss(engine, model, sizes["train"], None)
                metrics = _global_metrics(logits, part, transport, sizes, loss.detach())
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
            extra={"cpu_s": cpu_s},
        )
        records.append(record)
        if on_epoch is not None:
            on_epoch(record)
        stopped = bool(metrics) and best.update(epoch, metrics, model)
        if checkpoint is not None and checkpoint.due(epoch, config.epochs, stopped):
            _save(checkpoint, epoch, transport, model, optimizer, best, records)
    ledger = transport.ledger.snapshot()
    phases["teardown"] = phase_record(windows.cut(ledger), ended)
    return DistributedResult(
        result=best.result(records, model),
        ledger=ledger,
        counters=dict(engine.counters) | {"phases": phases},
        first_epoch=first,
    )


def phase_record(comm: dict[str, Any], began: float, **extra: Any) -> dict[str, Any]:
    """A set-up or teardown window that began at ``began`` (a perf_counter)
    and ends now, as an epoch record holds its traffic: ``comm`` and, if
    given, ``extra``; with its length in ``seconds``."""
    out = {"seconds": time.perf_counter() - began, "comm": comm}
    return out | ({"extra": extra} if extra else {})


def _split_sizes(part: LocalPart, transport: Transport) -> dict[str, int]:
    """Collective: the nodes of each split over all parts; every rank raises
    ``ValueError`` alike when one is empty (:func:`check_split_sizes`)."""
    local = torch.tensor([_split(part, s).numel() for s in SPLITS], dtype=torch.float64)
    total = transport.all_reduce_sum(local, "sync.metrics")
    sizes = {s: int(v) for s, v in zip(SPLITS, total.tolist(), strict=True)}
    name = part.meta.get("name", "graph")
    check_split_sizes(sizes, f"graph {name!r} (all {transport.world_size} parts)")
    return sizes


def _split(part: LocalPart, split: str) -> torch.Tensor:
    idx = getattr(part, f"{split}_local")
    return idx.to(torch.int64) if idx is not None else torch.empty(0, dtype=torch.int64)


def summed_loss(transport: Transport, loss: float) -> float:
    """Collective: ``loss`` summed over ranks, for an epoch without an
    evaluation (whose metrics would carry it): every rank checks the same
    value (:func:`~graphwire.run.training.check_finite_loss`)."""
    total = transport.all_reduce_sum(
        torch.tensor([loss], dtype=torch.float64), "sync.metrics"
    )
    return float(total[0])


def _global_metrics(
    logits: torch.Tensor,
    part: LocalPart,
    transport: Transport,
    sizes: dict[str, int],
    loss: torch.Tensor,
) -> dict[str, float]:
    assert part.y is not None
    y = part.y.to(torch.int64)
    pred = logits.argmax(1)
    values = [
        float((pred[_split(part, s)] == y[_split(part, s)]).sum()) for s in SPLITS
    ]
    val = _split(part, "val")
    values.append(float(F.cross_entropy(logits[val], y[val], reduction="sum")))
    values.append(float(loss))
    total = transport.all_reduce_sum(
        torch.tensor(values, dtype=torch.float64), "sync.metrics"
    ).tolist()
    out = {f"{s}_acc": total[i] / max(1, sizes[s]) for i, s in enumerate(SPLITS)}
    out["val_loss"] = total[3] / max(1, sizes["val"])
    out["loss"] = total[4]
    return out


# The tags of an epoch's training traffic: each layer's exchanges and the
# parameter gradients' sums (set-up, evaluation and metrics are not).
TRAINING_TAGS = ("fwd.", "bwd.", "sync.grad")


def traffic_by_rank(
    before: dict[str, Any],
    after: dict[str, Any],
    transport: Transport,
    num_layers: int,
) -> dict[str, dict[str, list[int]]]:
    """Collective: the bytes every rank sent and received between two of this
    rank's ledger snapshots (an epoch's training), by kind of traffic.

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
        counts[1, k, dst] += delta
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
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    best: BestEpoch,
    records: list[EpochRecord],
) -> None:
    state = training_state(epoch, model, optimizer, best, records)
    save_on_every_rank(checkpoint, epoch, transport, state)


def training_state(
    epoch: int,
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    best: BestEpoch,
    records: list[EpochRecord],
) -> dict[str, Any]:
    """What a checkpoint holds of any training loop after ``epoch``."""
    return {
        "epoch": epoch,
        "model": model.state_dict(),
        "optimizer": optimizer.state_dict(),
        "rng": torch.get_rng_state(),
        "best": {
            "epoch": best.epoch,
            "val_acc": best.val_acc,
            "val_loss": best.val_loss,
            "test_acc": best.test_acc,
            "stale": best._stale,
            "state_dict": best.state_dict,
        },
        "records": [r.as_dict() for r in records],
    }


def load_on_every_rank(
    checkpoint: CheckpointConfig, transport: Transport
) -> dict[str, Any] | None:
    """This rank's state at the latest complete checkpoint (None: none), once
    every rank has found the same one (an ``all_gather_object`` of the
    epochs, tag ``meta.resume``).

    Raises:
        ValueError: as :func:`load_checkpoint`; or, on every rank, the ranks
            found different checkpoints (machines that do not share the
            folder: a rank that found none would train on from fresh
            weights, in step with the others until the run ends apart).
    """
    state = load_checkpoint(checkpoint, transport.rank, transport.world_size)
    epoch = None if state is None else int(state["epoch"])
    found = transport.all_gather_object(epoch, "meta.resume")
    if len(set(found)) > 1:
        said = ", ".join(
            f"rank {rank} {'none' if e is None else f'epoch {e}'}"
            for rank, e in enumerate(found)
        )
        raise ValueError(
            f"{checkpoint.folder}: the ranks found different checkpoints there "
            f"({said}); every rank must read the run's own (on several machines: "
            "the same --out each machine gave the run, shared or its own)"
        )
    return state


def save_on_every_rank(
    checkpoint: CheckpointConfig,
    epoch: int,
    transport: Transport,
    state: dict[str, Any],
) -> None:
    """Write this rank's ``state``; the checkpoint counts once all have. The
    first rank of each machine then marks it complete in its folder
    (:meth:`~graphwire.comm.base.Transport.leads_machine`): machines that do
    not share the folder each keep their own ``latest.json`` and prune their
    own; those that share it write the same file."""
    save_checkpoint(checkpoint, epoch, transport.rank, state)
    transport.barrier()  # every rank has written this epoch
    if transport.leads_machine:
        mark_complete(checkpoint, epoch, transport.world_size)
    transport.barrier()


def restore_training_state(
    state: dict[str, Any],
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    best: BestEpoch,
    records: list[EpochRecord],
) -> int:
    """Load ``state``; return the first epoch still to run.

    Raises:
        ValueError: the state's model or optimizer does not fit these (a
            checkpoint file changed by hand).
    """
    try:
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
    except (RuntimeError, ValueError, KeyError) as error:
        said = str(error).strip().splitlines()
        raise ValueError(
            f"the checkpoint of rank {state.get('rank')} after epoch "
            f"{state.get('epoch')} does not fit this model: "
            f"{said[-1].strip() if said else type(error).__name__}"
        ) from None
    torch.set_rng_state(state["rng"])
    saved = state["best"]
    best.epoch, best.val_acc = saved["epoch"], saved["val_acc"]
    best.val_loss, best.test_acc = saved["val_loss"], saved["test_acc"]
    best._stale, best.state_dict = saved["stale"], saved["state_dict"]
    records.extend(EpochRecord(**r) for r in state["records"])
    return int(state["epoch"]) + 1
