"""G3Config: G3's settings and their checks."""

from __future__ import annotations

import dataclasses
import pickle
from typing import Any

import numpy as np
import pytest

from graphwire.fullgraph.g3.config import LASTS, MODES, ORDERS, SYNCS, G3Config
from graphwire.run.options import OptionError, flag_of, option_fields


def test_defaults_flags_and_choices() -> None:
    config = G3Config()
    assert dataclasses.asdict(config) == {
        "mode": "full",
        "sync": "layer",
        "order": "bfs",
        "last": None,
        "bin_rows": 32768,
        "bin_mb": 256.0,
    }
    flags = {f.name: flag_of(f) for f in option_fields(G3Config)}
    assert flags == {
        "mode": "--g3-mode",
        "sync": "--g3-sync",
        "order": "--g3-order",
        "last": "--g3-last",
        "bin_rows": "--bin-rows",
        "bin_mb": "--bin-mb",
    }
    choices = {f.name: f.metadata["choices"] for f in option_fields(G3Config)}
    assert choices["mode"] == MODES == ("full", "inter", "intra", "sequential")
    assert choices["sync"] == SYNCS == ("layer", "epoch")
    assert choices["order"] == ORDERS == ("bfs", "priority")
    assert choices["last"] == LASTS == ("sums", "bins")
    for field in option_fields(G3Config):
        assert "\n" not in field.metadata["help"]


@pytest.mark.parametrize(
    ("changes", "field", "why"),
    [
        ({"mode": "overlap"}, "mode", "expected one of full, inter, intra"),
        ({"sync": "step"}, "sync", "expected one of layer, epoch"),
        ({"order": "random"}, "order", "expected one of bfs, priority"),
        ({"last": "rows"}, "last", "expected one of sums, bins"),
        ({"bin_rows": 0}, "bin_rows", "expected >= 1, got 0"),
        ({"bin_rows": 1.5}, "bin_rows", "expected an integer"),
        ({"bin_mb": 0}, "bin_mb", "expected > 0, got 0"),
        ({"bin_mb": float("inf")}, "bin_mb", "expected a finite number"),
        ({"mode": None}, "mode", "expected a string, got None"),
    ],
)
def test_refused_values_name_their_field(
    changes: dict[str, Any], field: str, why: str
) -> None:
    with pytest.raises(OptionError, match=why) as caught:
        G3Config(**changes)
    assert caught.value.field == field
    assert str(caught.value).startswith(f"{field}: ")


def test_values_are_normalised_and_the_config_is_frozen() -> None:
    config = G3Config(bin_rows=np.int64(16), bin_mb=1)
    assert type(config.bin_rows) is int and config.bin_rows == 16
    assert type(config.bin_mb) is float and config.bin_mb == 1.0
    with pytest.raises(dataclasses.FrozenInstanceError):
        config.mode = "inter"  # type: ignore[misc]
    assert pickle.loads(pickle.dumps(config)) == config
