"""What every training loop shares: records, results, early stopping, the model.

- :class:`EpochRecord`: one line of ``metrics.jsonl`` per epoch.
- :class:`TrainResult`: the accuracies *at the epoch of best validation
  accuracy* (ties broken by lower validation loss), and the trained weights.
- :class:`BestEpoch`: the best-epoch tracker and early stopping both loops use.
"""

from __future__ import annotations

import copy
import dataclasses
import functools
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, ParamSpec, TypeVar

import torch
import torch.nn.functional as F

from graphwire.graph.graph import Graph
from graphwire.nn.models import GNN, build_model
from graphwire.run.config import TrainConfig

__all__ = [
    "SPLITS",
    "BestEpoch",
    "EpochRecord",
    "TrainResult",
    "check_finite_eval",
    "check_finite_loss",
    "check_split_sizes",
    "check_trainable",
    "format_acc",
    "keeps_callers_generator",
    "make_model",
    "make_model_for",
    "make_optimizer",
    "split_metrics",
]

_ACCURACIES = ("train_acc", "val_acc", "test_acc")  # NaN: not evaluated
SPLITS = ("train", "val", "test")  # the node splits every loop scores


@dataclass(kw_only=True, slots=True)
class EpochRecord:
    """One epoch: loss, accuracies (evaluated after the epoch's updates), times.

    ``times`` holds seconds per phase: ``sample_s``, ``forward_s``,
    ``backward_s`` (including the optimizer step) and ``eval_s``; distributed
    runs add ``sync_s`` (the gradients' all-reduce, or the wait for the
    last of the layer-wise ones), full-graph ones
    ``comm_s`` (inside forward/backward), mini-batch ones ``fetch_s`` and
    ``wait_s`` (the batches' input features). ``comm`` holds
    the epoch's bytes by tag and by peer (distributed runs only; full-graph
    runs add ``by_rank``, every rank's training bytes per layer:
    :func:`~graphwire.fullgraph.distributed.traffic_by_rank`); ``extra``
    what a loop measures besides (full-graph: ``cpu_s``, the CPU seconds of
    the process, all its threads, over the forward, backward, gradient sync
    and step; distributed mini-batch: seeds, remote rows, cache hits, CPU
    time and energy). Accuracies are NaN in an epoch
    without an evaluation (:meth:`TrainConfig.evaluates`); :meth:`as_dict`
    gives them as None, so the log stays strict JSON. ``time`` (distributed
    runs, stamped by the job) is the seconds from the start of the process
    that ran the epoch to the epoch's end; it stays with the record through
    checkpoints, and :meth:`as_dict` leaves it out while it is None (the
    log's own ``time`` then stands).
    """

    epoch: int
    loss: float
    train_acc: float
    val_acc: float
    test_acc: float
    times: dict[str, float]
    peak_rss_mb: float
    comm: dict[str, Any] = field(default_factory=dict)
    extra: dict[str, Any] = field(default_factory=dict)
    time: float | None = None

    def __post_init__(self) -> None:
        # Read back from as_dict (a checkpoint, a log): None is "not evaluated".
        for name in _ACCURACIES:
            if getattr(self, name) is None:
                setattr(self, name, math.nan)

    def as_dict(self) -> dict[str, Any]:
        out = dataclasses.asdict(self)
        for name in _ACCURACIES:
            if math.isnan(out[name]):
                out[name] = None
        if out["time"] is None:
            del out["time"]
        return out


def format_acc(value: float) -> str:
    """An accuracy as printed: four decimals, or ``-`` when not evaluated."""
    return "-" if math.isnan(value) else f"{value:.4f}"


@dataclass(kw_only=True, slots=True)
class TrainResult:
    """A finished run.

    Attributes:
        test_acc: test accuracy at ``best_epoch``.
        val_acc: validation accuracy at ``best_epoch``.
        best_epoch: the epoch of best validation accuracy (ties: lower val loss).
        epochs_run: epochs actually run (fewer than configured if stopped early).
        records: one record per epoch run.
        state_dict: the model's weights after the last epoch.
        best_state_dict: the model's weights at ``best_epoch``.
    """

    test_acc: float
    val_acc: float
    best_epoch: int
    epochs_run: int
    records: list[EpochRecord]
    state_dict: dict[str, torch.Tensor]
    best_state_dict: dict[str, torch.Tensor]


class BestEpoch:
    """Tracks the best-validation epoch and decides when to stop early.

    An evaluated epoch is better than the best so far when its validation
    accuracy is higher, or equal with a lower validation loss (accuracy moves
    in steps of one validation node, so ties are common; the loss breaks
    them). Such an epoch also resets the early-stopping count.
    """

    def __init__(self, patience: int | None) -> None:
        self.patience = patience
        self.epoch = -1
        self.val_acc = -1.0
        self.val_loss = math.inf
        self.test_acc = 0.0
        self.state_dict: dict[str, torch.Tensor] = {}
        self._stale = 0

    def update(
        self,
        epoch: int,
        metrics: dict[str, float],
        model: torch.nn.Module,
    ) -> bool:
        """Record one epoch's ``split_metrics``; return True to stop now."""
        val_acc, val_loss = metrics["val_acc"], metrics["val_loss"]
        improved = val_acc > self.val_acc or (
            val_acc == self.val_acc and val_loss < self.val_loss
        )
        if improved:
            self.epoch, self.val_acc, self.val_loss = epoch, val_acc, val_loss
            self.test_acc = metrics["test_acc"]
            self.state_dict = copy.deepcopy(model.state_dict())
            self._stale = 0
        else:
            self._stale += 1
        return self.stopped

    @property
    def stopped(self) -> bool:
        """Whether ``patience`` evaluated epochs in a row brought no better
        one (neither a higher validation accuracy nor an equal one with a
        lower validation loss; kept through a checkpoint: a resumed run that
        had stopped stays
        stopped, unless resumed with a larger patience)."""
        return self.patience is not None and self._stale >= self.patience

    def result(self, records: list[EpochRecord], model: torch.nn.Module) -> TrainResult:
        """The finished run: the best epoch's figures, ``model``'s last weights."""
        return TrainResult(
            test_acc=self.test_acc,
            val_acc=self.val_acc,
            best_epoch=self.epoch,
            epochs_run=len(records),
            records=records,
            state_dict=copy.deepcopy(model.state_dict()),
            best_state_dict=self.state_dict,
        )


_P = ParamSpec("_P")
_R = TypeVar("_R")


def keeps_callers_generator(train: Callable[_P, _R]) -> Callable[_P, _R]:
    """Run ``train`` on a fork of torch's default generator: it may seed it
    with its config's seed, and the caller's generator state is put back after
    it (CPU generator; training runs on the host)."""

    @functools.wraps(train)
    def forked(*args: _P.args, **kwargs: _P.kwargs) -> _R:
        with torch.random.fork_rng(devices=[]):
            return train(*args, **kwargs)

    return forked


def check_trainable(graph: Graph) -> tuple[torch.Tensor, torch.Tensor]:
    """``(x, y)`` of a graph that has features, labels and all three splits."""
    missing = [
        name
        for name in ("x", "y", "train_idx", "val_idx", "test_idx")
        if getattr(graph, name) is None
    ]
    if missing:
        raise ValueError(
            f"graph {graph.name!r}: training needs {', '.join(missing)} "
            "(features, labels and train/val/test splits)"
        )
    assert graph.x is not None and graph.y is not None
    check_split_sizes(
        {split: getattr(graph, f"{split}_idx").numel() for split in SPLITS},
        f"graph {graph.name!r}",
    )
    return graph.x, graph.y


def check_split_sizes(sizes: dict[str, int], where: str) -> None:
    """Raise ``ValueError`` unless every split (``sizes``: nodes per ``train``,
    ``val``, ``test``) holds a node: without training nodes the loss is NaN,
    without validation nodes no epoch is better than another, and without test
    nodes the reported accuracy is a made-up 0."""
    empty = [f"{split}_idx" for split in SPLITS if sizes[split] == 0]
    if empty:
        raise ValueError(
            f"{where}: {', '.join(empty)} holds no nodes; training needs training "
            "nodes for the loss, validation nodes to pick the best epoch and "
            "test nodes to score it"
        )


def check_finite_loss(loss: float, epoch: int, config: TrainConfig) -> None:
    """Raise ``ValueError`` when epoch ``epoch``'s training loss is NaN or
    infinite: every later epoch would train on NaN weights and score a
    meaningless accuracy (argmax of NaN logits). Distributed loops pass the
    loss summed over ranks, so every rank raises alike."""
    if not math.isfinite(loss):
        raise ValueError(
            f"epoch {epoch}: the training loss is {loss} (not finite); check the "
            "features for NaN or infinite values, or lower the learning rate "
            f"(lr={config.lr})"
        )


def check_finite_eval(
    metrics: dict[str, float], epoch: int, config: TrainConfig
) -> None:
    """Raise ``ValueError`` when epoch ``epoch``'s evaluation (``metrics``,
    none when it had none) gave a NaN or infinite validation loss: the step
    after a finite training loss left weights whose logits are not finite,
    and their argmax would be scored, and could be picked as the best epoch,
    like any other. Distributed loops pass metrics summed over ranks, so
    every rank raises alike."""
    val_loss = metrics.get("val_loss")
    if val_loss is not None and not math.isfinite(val_loss):
        raise ValueError(
            f"epoch {epoch}: the validation loss is {val_loss} (not finite): the "
            "weights after this epoch's step give logits that overflow; "
            f"lower the learning rate (lr={config.lr})"
        )


def make_model(graph: Graph, config: TrainConfig) -> GNN:
    """The configured model for ``graph``'s feature width and class count."""
    return make_model_for(graph.num_features, graph.num_classes, config)


def make_model_for(num_features: int, num_classes: int, config: TrainConfig) -> GNN:
    """The configured model for ``num_features`` inputs and ``num_classes``."""
    assert config.hidden is not None and config.dropout is not None
    assert config.attn_dropout is not None
    return build_model(
        config.model,
        num_features,
        config.hidden,
        num_classes,
        config.num_layers,
        config.dropout,
        heads=config.heads,
        out_heads=config.out_heads,
        attn_dropout=config.attn_dropout,
    )


def make_optimizer(model: torch.nn.Module, config: TrainConfig) -> torch.optim.Adam:
    """Adam over all parameters with the configured lr and weight decay."""
    assert config.lr is not None and config.weight_decay is not None
    return torch.optim.Adam(
        model.parameters(), lr=config.lr, weight_decay=config.weight_decay
    )


def split_metrics(logits: torch.Tensor, graph: Graph) -> dict[str, float]:
    """Accuracy on train/val/test and the validation loss.

    Args:
        logits: float [N, C] for every node of ``graph``.
        graph: with ``y`` and the three splits.

    Returns:
        ``{"train_acc", "val_acc", "test_acc", "val_loss"}``.
    """
    assert graph.y is not None
    pred = logits.argmax(1)
    out: dict[str, float] = {}
    for split in ("train", "val", "test"):
        idx = getattr(graph, f"{split}_idx")
        correct = (pred[idx] == graph.y[idx]).sum()
        out[f"{split}_acc"] = float(correct) / max(1, idx.numel())
    val = graph.val_idx
    out["val_loss"] = float(F.cross_entropy(logits[val], graph.y[val]))
    return out
