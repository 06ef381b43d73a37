"""The collectives every distributed training loop runs, on any transport.

- :func:`seeded_model`: the initial weights every rank (and one process) gets;
- :func:`split_sizes`: the training, validation and test nodes over all parts;
- :func:`sum_gradients` / :func:`sync_gradients`: parameter gradients summed
  over ranks in one flat all-reduce (``sync.grad``);
- :func:`global_metrics` / :func:`summed_loss`: the accuracies, validation
  loss and training loss over all ranks (``sync.metrics``), so every rank
  stops early, or raises on a non-finite loss, at the same epoch;
- :func:`phase_record`: a set-up or teardown window as a record holds it;
- :class:`Inference`: what gives a loop the full-graph logits it evaluates.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from typing import Any, Protocol, TypeVar

import torch
import torch.nn.functional as F

from graphwire.comm.base import Transport
from graphwire.nn.models import GNN
from graphwire.partition.local import LocalPart
from graphwire.run.config import TrainConfig
from graphwire.run.training import SPLITS, check_split_sizes, make_model_for

__all__ = [
    "seeded",
    "Inference",
    "InferenceFactory",
    "assign_gradients",
    "flat_gradients",
    "global_metrics",
    "phase_record",
    "seeded_model",
    "shaped_model",
    "split_sizes",
    "sum_gradients",
    "summed_loss",
    "sync_gradients",
]


# torch's default generator is per process: ranks that are threads of one
# process (the in-process transport) must not interleave their draws.
_INIT_LOCK = threading.Lock()
_Built = TypeVar("_Built")


def seeded_model(num_features: int, num_classes: int, config: TrainConfig) -> GNN:
    """The model with the initial weights every rank (and one process) gets."""
    return seeded(
        config.seed, lambda: make_model_for(num_features, num_classes, config)
    )


def seeded(seed: int, build: Callable[[], _Built]) -> _Built:
    """``build()`` with torch's generator seeded by ``seed`` (one thread at a
    time: in-process ranks share the generator)."""
    with _INIT_LOCK:
        torch.manual_seed(seed)
        return build()


def shaped_model(num_features: int, num_classes: int, config: TrainConfig) -> GNN:
    """A throw-away model for its layers' shapes; torch's generator is left as
    it was."""
    with _INIT_LOCK, torch.random.fork_rng(devices=[]):
        return make_model_for(num_features, num_classes, config)


def sum_gradients(
    params: Sequence[torch.Tensor], transport: Transport, tag: str
) -> None:
    """Replace each parameter's gradient (zeros if it has none) by its sum over
    ranks, in one flat all-reduce."""
    total = transport.all_reduce_sum(flat_gradients(params), tag)
    assign_gradients(params, total)


def flat_gradients(params: Sequence[torch.Tensor]) -> torch.Tensor:
    """The gradients of ``params`` (zeros where missing), concatenated."""
    return torch.cat(
        [
            (p.grad if p.grad is not None else torch.zeros_like(p)).reshape(-1)
            for p in params
        ]
    )


def assign_gradients(params: Sequence[torch.Tensor], flat: torch.Tensor) -> None:
    """Set the gradients of ``params`` from ``flat`` (as :func:`flat_gradients`
    laid them out)."""
    offset = 0
    for p in params:
        p.grad = flat[offset : offset + p.numel()].view_as(p).clone()
        offset += p.numel()


def sync_gradients(model: torch.nn.Module, transport: Transport) -> None:
    """Sum every parameter's gradient over ranks, in one flat all-reduce."""
    sum_gradients(list(model.parameters()), transport, "sync.grad")


def split_sizes(part: LocalPart, transport: Transport) -> dict[str, int]:
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


def global_metrics(
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


def phase_record(comm: dict[str, Any], began: float, **extra: Any) -> dict[str, Any]:
    """A set-up or teardown window that began at ``began`` (a perf_counter)
    and ends now, as an epoch record holds its traffic: ``comm`` and, if
    given, ``extra``; with its length in ``seconds``."""
    out = {"seconds": time.perf_counter() - began, "comm": comm}
    return out | ({"extra": extra} if extra else {})


class Inference(Protocol):
    """Owned logits float [num_owned, C] of a model on the whole graph, with
    dropout off (collective: every rank calls it with the same model)."""

    def __call__(self, model: GNN) -> torch.Tensor: ...


InferenceFactory = Callable[[LocalPart, Transport, TrainConfig], Inference]
"""Makes a rank's :class:`Inference` from its part (a mini-batch loop takes
one, as it cannot import the full-graph engines)."""
