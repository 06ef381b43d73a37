"""`TrainConfig`: what to train and how, shared by every loop.

Fields left ``None`` take the model's default from :data:`MODEL_DEFAULTS` when
the config is made, so ``as_dict()`` always shows the values a run used. The
fields are :func:`~graphwire.options.option` s: the command line offers
each as a flag (``num_layers`` as ``--layers``).
"""

from __future__ import annotations

import dataclasses
import numbers
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from graphwire.graph.seeds import check_seed, is_int
from graphwire.nn.dropout import check_dropout
from graphwire.nn.link import DECODERS
from graphwire.nn.models import LAYER_KINDS
from graphwire.options import option
from graphwire.sampler.uniform import check_fanouts

__all__ = ["MAX_LR", "MODEL_DEFAULTS", "TrainConfig", "parse_fanouts"]

# Adam keeps its hyperparameters as float32 scalars: the weight decay as it
# is, the first step as lr / (1 - beta1) = 10 lr (torch's default betas).
_FLOAT32_MAX = float(torch.finfo(torch.float32).max)
MAX_LR = _FLOAT32_MAX * (1 - 0.9)
TASKS = ("node", "link")
# An L2 penalty shrinks the embeddings a dot decoder scores: link prediction
# on Cora falls from 0.89 to 0.78 test AUC with GraphSAGE's 5e-4.
LINK_DEFAULTS: dict[str, Any] = {"weight_decay": 0.0}
MAX_NEGATIVES = 1 << 12  # the hashed draws' most per node

# Per-model defaults: GCN from Kipf & Welling, GAT from Veličković et al. (Cora:
# 8 heads x 8 hidden, 1 output head, dropout 0.6 on inputs and attention).
MODEL_DEFAULTS: dict[str, dict[str, float | int]] = {
    "gcn": {
        "hidden": 16,
        "dropout": 0.5,
        "attn_dropout": 0.0,
        "lr": 0.01,
        "weight_decay": 5e-4,
    },
    "sage": {
        "hidden": 64,
        "dropout": 0.5,
        "attn_dropout": 0.0,
        "lr": 0.01,
        "weight_decay": 5e-4,
    },
    "gat": {
        "hidden": 8,
        "dropout": 0.6,
        "attn_dropout": 0.6,
        "lr": 0.005,
        "weight_decay": 5e-4,
    },
}


def parse_fanouts(text: str) -> list[int]:
    """``"10,25"`` as ``[10, 25]`` (the command line's form of ``fanouts``).

    Raises:
        ValueError: the text is not comma-separated integers.
    """
    try:
        return [int(v) for v in str(text).split(",")]
    except ValueError:
        raise ValueError(f"expected comma-separated integers, got {text!r}") from None


def _defaults(name: str) -> str:
    """Each model's default of setting ``name``, for ``--help``."""
    return "default " + ", ".join(
        f"{model} {values[name]:g}" for model, values in MODEL_DEFAULTS.items()
    )


# TrainConfig is frozen: __post_init__ stores the values it checked with this.
_set = object.__setattr__


@dataclass(kw_only=True, slots=True, frozen=True)
class TrainConfig:
    """What to train and how.

    Attributes:
        model: "gcn", "sage" or "gat".
        hidden: hidden width (per head for GAT); None: the model's default.
        num_layers: message-passing layers.
        dropout: dropout on every layer's input; None: the model's default.
        attn_dropout: GAT attention dropout; None: the model's default.
        lr: Adam learning rate; None: the model's default.
        weight_decay: Adam L2 penalty; None: the model's default.
        epochs: maximum number of epochs.
        patience: stop after this many evaluations in a row without a
            better epoch: a higher validation accuracy, or the same accuracy
            with a lower validation loss (:class:`BestEpoch`); None: never
            stop early.
        eval_every: evaluate (accuracies, best epoch, early stopping) after
            every this many epochs and after the last; the records of other
            epochs have NaN accuracies (``null`` in ``metrics.jsonl``).
        seed: seeds initialisation, dropout, shuffling and sampling.
        heads: GAT heads in hidden layers.
        out_heads: GAT heads (averaged) in the output layer.
        fanouts: mini-batch neighbours per layer, **input layer first** (as
            DGL): ``[10, 25]`` takes 25 neighbours of each seed, then 10 of each
            of those; kept as a tuple. None: ``[10] * (num_layers - 1) + [25]``.
        batch_size: mini-batch seeds per step.
        task: ``"node"`` (classification) or ``"link"`` (unsupervised link
            prediction, mini-batch: :mod:`~graphwire.minibatch.linktrainer`;
            the model's output is the node embedding, ``hidden`` wide).
        decoder: link: ``"dot"`` or ``"mlp"`` (:mod:`~graphwire.nn.link`).
        negatives: link: negatives drawn per seed.
        val_edges, test_edges: link: the shares of the undirected edges
            held out for validation and for testing.
        eval_negatives: link: corrupted edges scored against each held-out
            one.

    A config is checked when it is made and is frozen after: change a field
    with ``dataclasses.replace(config, epochs=50)``, which checks it again.
    The model's defaults are filled in when the config is made, so
    ``dataclasses.replace(config, model="gat")`` keeps the old model's hidden
    width, dropout and learning rate: make a new ``TrainConfig`` to switch
    models.
    """

    model: str = option(
        "sage",
        choices=("gcn", "sage", "gat"),
        help="GCN, GraphSAGE (mean) or GAT",
    )
    hidden: int | None = option(None, help=f"hidden width ({_defaults('hidden')})")
    num_layers: int = option(2, flag="--layers", help="message-passing layers")
    dropout: float | None = option(None, help=f"dropout ({_defaults('dropout')})")
    lr: float | None = option(None, help=f"learning rate ({_defaults('lr')})")
    weight_decay: float | None = option(
        None, help=f"L2 penalty ({_defaults('weight_decay')}; --task link: 0)"
    )
    epochs: int = option(200, help="most epochs")
    patience: int | None = option(
        None,
        help="stop after this many evaluations (epochs, by default) in a row "
        "without a better epoch: a higher validation accuracy, or the same "
        "with a lower validation loss",
    )
    seed: int = option(0, help="seeds weights, dropout, sampling and partitioning")
    heads: int = option(8, only="gat", help="GAT: attention heads in hidden layers")
    out_heads: int = option(
        1, only="gat", help="GAT: attention heads in the output layer, averaged"
    )
    attn_dropout: float | None = option(
        None,
        only="gat",
        help=f"GAT: dropout on attention coefficients ({_defaults('attn_dropout')})",
    )
    fanouts: Sequence[int] | None = option(
        None,
        only="minibatch",
        parse=parse_fanouts,
        metavar="F0,F1",
        help="mini-batch fan-outs, input layer first: 10,25 (-1: all; default "
        "10 per layer, 25 for the last)",
    )
    batch_size: int = option(64, only="minibatch", help="mini-batch seeds per step")
    eval_every: int = option(
        1,
        help="evaluate every K epochs and after the last (--patience counts "
        "evaluations)",
    )
    task: str = option(
        "node",
        choices=TASKS,
        only="minibatch",
        help="node: classify nodes by their labels; link: unsupervised link "
        "prediction (positive and negative samplers, binary cross-entropy; "
        "scored by AUC, MRR and Hits@K on held-out edges)",
    )
    decoder: str = option(
        "dot",
        choices=DECODERS,
        only="link",
        help="link: the edge decoder, dot (<h_u, h_v>) or mlp (MLP(h_u * h_v))",
    )
    negatives: int = option(1, only="link", help="link: negatives per seed")
    val_edges: float = option(
        0.05, only="link", help="link: share of the edges held out for validation"
    )
    test_edges: float = option(
        0.10, only="link", help="link: share of the edges held out for testing"
    )
    eval_negatives: int = option(
        50, only="link", help="link: negatives each held-out edge is ranked against"
    )

    def __post_init__(self) -> None:
        if self.model not in LAYER_KINDS:
            raise ValueError(
                f"model: expected one of {sorted(LAYER_KINDS)}, got {self.model!r}"
            )
        defaults = MODEL_DEFAULTS[self.model]
        if self.task == "link":
            defaults = defaults | LINK_DEFAULTS
        for name in ("hidden", "dropout", "attn_dropout", "lr", "weight_decay"):
            if getattr(self, name) is None:
                _set(self, name, defaults[name])
        fanouts = self.fanouts
        if fanouts is None:  # a bad num_layers is named by _validate
            layers = self.num_layers if is_int(self.num_layers) else 1
            fanouts = [10] * (layers - 1) + [25]
        # list() would split a string into characters
        if isinstance(fanouts, str) or not isinstance(fanouts, Iterable):
            raise ValueError(
                f"fanouts: expected a list of ints, one per layer, got {fanouts!r}"
            )
        _set(self, "fanouts", list(fanouts))
        self._validate()

    def _validate(self) -> None:
        # numpy numbers are taken and stored as plain ones (as_dict is JSON).
        positive = ("hidden", "num_layers", "epochs", "heads", "out_heads")
        for name in (*positive, "batch_size", "eval_every"):
            value = getattr(self, name)
            if not is_int(value) or value < 1:
                raise ValueError(f"{name}: expected an integer >= 1, got {value!r}")
            _set(self, name, int(value))
        for name in ("dropout", "attn_dropout"):
            _set(self, name, check_dropout(getattr(self, name), name))
        for name in ("lr", "weight_decay"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, numbers.Real):
                raise ValueError(f"{name}: expected a number, got {value!r}")
            try:
                _set(self, name, float(value))
            except OverflowError:  # an int past float's range
                raise ValueError(
                    f"{name}: expected a number a float holds, got one past "
                    f"float's range (a {type(value).__name__})"
                ) from None
        assert self.lr is not None and self.weight_decay is not None
        if not (0 < self.lr <= MAX_LR):
            raise ValueError(
                f"lr: expected a value > 0 and <= {MAX_LR!r} (Adam's first step "
                f"is lr / (1 - beta1) = 10 lr, a float32), got {self.lr!r}"
            )
        if not (0 <= self.weight_decay <= _FLOAT32_MAX):
            raise ValueError(
                f"weight_decay: expected >= 0 and <= {_FLOAT32_MAX!r} (a "
                f"float32), got {self.weight_decay!r}"
            )
        if self.patience is not None:
            if not is_int(self.patience) or self.patience < 1:
                raise ValueError(
                    f"patience: expected an integer >= 1 (None: never stop early), "
                    f"got {self.patience!r}"
                )
            _set(self, "patience", int(self.patience))
        _set(self, "seed", check_seed(self.seed))
        self._validate_task()
        assert self.fanouts is not None
        if len(self.fanouts) != self.num_layers:
            raise ValueError(
                f"fanouts: expected one per layer (num_layers={self.num_layers}), "
                f"got {self.fanouts}"
            )
        _set(self, "fanouts", tuple(check_fanouts(self.fanouts)))

    def _validate_task(self) -> None:  # noqa: C901 - one check per field
        if self.task not in TASKS:
            raise ValueError(f"task: expected one of {TASKS}, got {self.task!r}")
        if self.decoder not in DECODERS:
            raise ValueError(
                f"decoder: expected one of {DECODERS}, got {self.decoder!r}"
            )
        if not is_int(self.negatives) or not 1 <= self.negatives <= MAX_NEGATIVES:
            raise ValueError(
                f"negatives: expected an integer in [1, {MAX_NEGATIVES}], got "
                f"{self.negatives!r}"
            )
        _set(self, "negatives", int(self.negatives))
        for name in ("val_edges", "test_edges"):
            value = getattr(self, name)
            if not _is_real(value) or not 0 < value < 1:
                raise ValueError(f"{name}: expected a share in (0, 1), got {value!r}")
            _set(self, name, float(value))
        if self.val_edges + self.test_edges >= 1:
            raise ValueError(
                f"test_edges: with val_edges {self.val_edges:g}, leaves no edges "
                "to train on"
            )
        if not is_int(self.eval_negatives) or self.eval_negatives < 1:
            raise ValueError(
                f"eval_negatives: expected an integer >= 1, got {self.eval_negatives!r}"
            )
        _set(self, "eval_negatives", int(self.eval_negatives))

    def held_out(self) -> dict[str, Any]:
        """:func:`~graphwire.graph.links.split_links`' settings (link)."""
        return {
            "val": self.val_edges,
            "test": self.test_edges,
            "negatives": self.eval_negatives,
            "seed": self.seed,
        }

    def as_dict(self) -> dict[str, Any]:
        """The fields as JSON values (``fanouts`` a list)."""
        out = dataclasses.asdict(self)
        out["fanouts"] = list(self.fanouts or ())
        return out

    def evaluates(self, epoch: int) -> bool:
        """Whether epoch ``epoch`` (0-based) ends with an evaluation: every
        ``eval_every``-th epoch, and the last."""
        return (epoch + 1) % self.eval_every == 0 or epoch + 1 == self.epochs


def _is_real(value: object) -> bool:
    return not isinstance(value, bool) and isinstance(value, numbers.Real)
