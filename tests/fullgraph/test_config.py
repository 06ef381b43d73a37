"""TrainConfig: per-model defaults and validation of user values."""

from __future__ import annotations

import dataclasses
import json
import pickle

import numpy as np
import pytest
import torch

from graphwire.run.config import MAX_LR, MODEL_DEFAULTS, TrainConfig


@pytest.mark.parametrize("model", sorted(MODEL_DEFAULTS))
def test_unset_fields_take_the_model_defaults(model: str) -> None:
    config = TrainConfig(model=model)
    for name, value in MODEL_DEFAULTS[model].items():
        assert getattr(config, name) == value
    assert config.fanouts == (10, 25)
    assert config.as_dict()["hidden"] == MODEL_DEFAULTS[model]["hidden"]


def test_explicit_values_win_and_fanouts_follow_depth() -> None:
    config = TrainConfig(model="gcn", hidden=32, lr=0.1, dropout=0.0, num_layers=3)
    assert (config.hidden, config.lr, config.dropout) == (32, 0.1, 0.0)
    assert config.fanouts == (10, 10, 25)


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"model": "gin"}, "model"),
        ({"hidden": 0}, "hidden"),
        ({"num_layers": 0}, "num_layers"),
        ({"epochs": 0}, "epochs"),
        ({"dropout": 1.0}, "dropout"),
        ({"attn_dropout": -0.1}, "attn_dropout"),
        ({"lr": 0.0}, "lr"),
        ({"lr": float("nan")}, "lr"),
        ({"weight_decay": -1.0}, "weight_decay"),
        ({"patience": 0}, "patience"),
        ({"batch_size": 0}, "batch_size"),
        ({"heads": 0}, "heads"),
        ({"fanouts": [10]}, "fanouts"),
        ({"fanouts": [10, 0]}, "fanouts"),
        ({"hidden": 2.5}, "hidden"),
        # each of these was taken, to fail later inside torch or the sampler
        ({"seed": -1}, r"seed: expected an int in \[0, 2\*\*63\)"),
        ({"seed": 2**64}, "seed: expected an int"),
        ({"seed": None}, "seed: expected an int"),
        ({"seed": 1.5}, "seed: expected an int"),
        ({"fanouts": [10, 2.5]}, "fanouts: expected positive ints"),
        ({"fanouts": "10,25"}, "fanouts: expected a list of ints"),
        ({"fanouts": 25}, "fanouts: expected a list of ints"),
        ({"patience": 1.5}, "patience: expected an integer"),
        ({"dropout": "0.5"}, "dropout: expected a number"),
        ({"lr": "0.01"}, "lr: expected a number"),
        ({"num_layers": 2.0}, "num_layers: expected an integer"),
        # each of these was taken, to fail inside Adam's step with torch's
        # "value cannot be converted to type float without overflow"
        (
            {"lr": 1e38},
            r"lr: expected a value > 0 and <= 3\.40282346638528\d*e\+37 \(Adam",
        ),
        ({"lr": float("inf")}, "lr: expected a value > 0"),
        (
            {"weight_decay": 1e39},
            r"weight_decay: expected >= 0 and <= 3\.40282346638528\d*e\+38",
        ),
        ({"weight_decay": float("nan")}, "weight_decay: expected >= 0"),
        (
            {"lr": 10**400},
            r"lr: expected a number a float holds, got one past float's .*\(a int\)",
        ),
    ],
)
def test_bad_values_raise_value_error(fields: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        TrainConfig(**fields)


def test_the_largest_lr_and_weight_decay_take_an_adam_step() -> None:
    """The bounds are Adam's own: at them a step runs (and past them fails)."""
    for lr, weight_decay, works in (
        (MAX_LR, float(torch.finfo(torch.float32).max), True),
        (MAX_LR * (1 + 1e-7), 0.0, False),
    ):
        param = torch.nn.Parameter(torch.ones(2))
        param.grad = torch.ones(2)
        step = torch.optim.Adam([param], lr=lr, weight_decay=weight_decay).step
        if works:
            TrainConfig(lr=lr, weight_decay=weight_decay)
            step()
        else:
            with pytest.raises(RuntimeError, match="overflow"):
                step()


def test_numpy_numbers_are_taken_as_plain_ones() -> None:
    """A sweep over ``np.arange`` values is a config like any other; as_dict
    stays JSON."""
    config = TrainConfig(
        hidden=np.int64(16),
        epochs=np.int32(3),
        dropout=np.float32(0.25),
        seed=np.uint8(7),
        fanouts=list(np.array([5, -1])),
        patience=np.int64(2),
    )
    assert json.loads(json.dumps(config.as_dict())) == config.as_dict()
    assert (config.hidden, config.epochs, config.dropout) == (16, 3, 0.25)
    assert (config.seed, config.fanouts, config.patience) == (7, (5, -1), 2)


def test_a_config_is_frozen_and_replace_checks_again() -> None:
    """A field set after the config was made skipped every check above;
    ``dataclasses.replace`` makes a new config, checked again."""
    config = TrainConfig(model="gcn", fanouts=[5, 5])
    with pytest.raises(dataclasses.FrozenInstanceError):
        config.epochs = 0  # type: ignore[misc]
    with pytest.raises(TypeError):
        config.fanouts[0] = 0  # type: ignore[index]
    with pytest.raises(ValueError, match="epochs: expected an integer >= 1"):
        dataclasses.replace(config, epochs=0)
    assert dataclasses.replace(config, epochs=3).epochs == 3
    assert config.as_dict()["fanouts"] == [5, 5]  # JSON, as the run log writes it
    assert pickle.loads(pickle.dumps(config)) == config  # to spawned workers


def test_config_rejects_unknown_fields() -> None:
    with pytest.raises(TypeError):
        TrainConfig(model="gcn", hiden=16)  # type: ignore[call-arg]
