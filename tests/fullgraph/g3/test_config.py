"""G3Config: G3's settings, their checks, and the engine's two ways to take them."""

from __future__ import annotations

import dataclasses
import pickle
from typing import Any

import numpy as np
import pytest

from graphwire.comm.local import run_local
from graphwire.fullgraph.distributed import build_engine
from graphwire.fullgraph.engines import EXCHANGES
from graphwire.fullgraph.g3.config import LASTS, MODES, ORDERS, SYNCS, G3Config
from graphwire.fullgraph.g3.engine import G3Engine
from graphwire.fullgraph.halo import HaloConfig
from graphwire.nn.models import LAYER_KINDS
from graphwire.options import OptionError, flag_of, option_fields
from graphwire.partition import load_part
from tests.fullgraph.dist_helpers import config_for, small_graph, write_parts


def test_defaults_flags_and_choices() -> None:
    config = G3Config()
    assert dataclasses.asdict(config) == {
        "mode": "full",
        "sync": "layer",
        "order": "bfs",
        "last": None,
        "bin_rows": 32768,
        "bin_mb": 256.0,
        "staleness": "none",
        "staleness_norm": "relative",
    }
    flags = {f.name: flag_of(f) for f in option_fields(G3Config)}
    assert flags == {
        "mode": "--g3-mode",
        "sync": "--g3-sync",
        "order": "--g3-order",
        "last": "--g3-last",
        "bin_rows": "--bin-rows",
        "bin_mb": "--bin-mb",
        "staleness": "--staleness",
        "staleness_norm": "--staleness-norm",
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
        ({"bin_mb": float("inf")}, "bin_mb", "expected a finite value > 0"),
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


def test_the_engine_reads_its_config_type() -> None:
    assert G3Engine.config_type is G3Config
    assert EXCHANGES.get("g3").config_type is G3Config


def _built(transport: Any, folder: str, exchange: Any, options: dict[str, Any]) -> Any:
    """The engine's config, or the error building it raised."""
    part = load_part(folder, transport.rank)
    try:
        engine = build_engine(part, transport, config_for("gcn"), exchange, options)
    except (TypeError, ValueError) as error:
        return error
    assert isinstance(engine, G3Engine)
    return engine.config


def _g3_with(transport: Any, folder: str, config: Any) -> Any:
    """The error G3Engine raises for ``config``, built directly."""
    part = load_part(folder, transport.rank)
    try:
        G3Engine(part, transport, LAYER_KINDS["gcn"], 2, config=config)
    except TypeError as error:
        return str(error)
    return "built"


def test_the_engine_takes_its_config(tmp_path) -> None:
    folder = str(write_parts(small_graph(), 2, tmp_path, "metis"))
    config = G3Config(mode="inter", bin_rows=16)
    assert run_local(lambda t: _built(t, folder, config, {}), 2) == [config] * 2
    assert run_local(lambda t: _built(t, folder, "g3", {}), 2) == [G3Config()] * 2
    for exchange, options, kind, what in [
        ("g3", {"mode": "full"}, TypeError, "unexpected keyword argument 'mode'"),
        ("g3", {"config": HaloConfig()}, TypeError, "multiple values"),
        ("g3", {"bin_row": 16}, TypeError, "unexpected keyword argument 'bin_row'"),
    ]:
        for error in run_local(
            lambda t, e=exchange, o=options: _built(t, folder, e, o), 2
        ):
            assert isinstance(error, kind) and what in str(error), error
    said = run_local(lambda t: _g3_with(t, folder, HaloConfig()), 2)
    assert said == ["G3Engine: expected a G3Config, got HaloConfig()"] * 2
