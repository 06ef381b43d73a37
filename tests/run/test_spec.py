"""The run specification: flags derived from config fields, YAML both ways,
and strategies that plug in with one registry call and no edit to the
command line's code."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from graphwire.cli import build_parser, main
from tests.multiprocess.cli_runs import SPEC, graphwire


@pytest.mark.parametrize(
    "flags",
    [
        ["--model", "gat", "--epochs", "3", "--heads", "2", "--patience", "4"],
        ["--workers", "2", "--exchange", "g3", "--g3-mode", "inter", "--bin-rows", "9"],
        ["--workers", "3", "--exchange", "halo", "--checkpoint-every", "2"],
        ["--mode", "minibatch", "--fanouts", "-1,5", "--batch-size", "7"],
        ["--workers", "2", "--mode", "minibatch", "--fetch", "rapid", "--n-hot", "8"],
        ["--partition", "random", "--parts", "3", "--node-order", "id", "--quiet"],
        ["--out", "runs/x", "--overwrite"],
    ],
    ids=" ".join,
)
def test_print_spec_reads_back_as_the_same_spec(tmp_path, capsys, flags) -> None:
    """``--print-spec`` writes the resolved spec as YAML; ``--config`` of it
    gives the same spec again (nothing is read, split or trained)."""
    assert main(["train", *flags, "--print-spec"]) == 0
    printed = capsys.readouterr().out
    assert printed.startswith("mode: ")
    config = tmp_path / "spec.yaml"
    config.write_text(printed)
    assert main(["train", "--config", str(config), "--print-spec"]) == 0
    assert capsys.readouterr().out == printed


def test_the_printed_spec_holds_every_setting_with_its_default(capsys) -> None:
    """Each default is written once, on its field, and the spec shows it."""
    from graphwire.feature.rapid import DEFAULT_CACHE_MB, RapidConfig
    from graphwire.fullgraph.g3.config import G3Config

    assert main(["train", "--workers", "2", "--print-spec"]) == 0
    printed = capsys.readouterr().out
    assert "exchange:\n  name: g3\n  mode: full\n" in printed  # the default exchange
    assert f"  bin_rows: {G3Config().bin_rows}\n" in printed
    assert "fetch:" not in printed and "fanouts" not in printed
    assert main(["train", "--workers", "2", "--mode", "minibatch", "--print-spec"]) == 0
    printed = capsys.readouterr().out
    assert "fetch:\n  name: on-demand\n" in printed and "exchange:" not in printed
    assert RapidConfig().cache_mb is None and DEFAULT_CACHE_MB == 512.0


def test_a_sectioned_file_names_its_keys_in_errors(tmp_path, capsys) -> None:
    config = tmp_path / "run.yaml"
    config.write_text("exchange:\n  name: g3\n  colour: blue\n")
    assert main(["train", "--config", str(config)]) == 2
    assert "unknown key 'exchange.colour'" in capsys.readouterr().err
    config.write_text("train:\n  epochs: many\n")
    assert main(["train", "--config", str(config)]) == 2
    assert f"--config {config}: train.epochs: expected int" in capsys.readouterr().err
    config.write_text("exchange: {name: g3, bin_rows: 0}\nlaunch: {workers: 2}\n")
    assert main(["train", "--config", str(config)]) == 2
    assert "--bin-rows: expected >= 1, got 0" in capsys.readouterr().err


@pytest.fixture
def toys() -> Iterator[ModuleType]:
    """The toy strategies, registered for this test only."""
    from tests.run import toys

    toys.register()
    yield toys
    toys.unregister()


def _records(out: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (out / "metrics.jsonl").open()]


def test_a_toy_exchange_and_fetcher_plug_in_with_one_registry_call_each(
    tmp_path, capfd, toys
) -> None:
    """Registered from this test's module, with no edit to cli.py or
    commands/: their flags come from their config fields, reach their
    configs, are refused with another strategy, and they train."""
    train = next(a for a in build_parser()._actions if a.dest == "command").choices[
        "train"
    ]
    help_text = train.format_help()
    assert "--toy-rows" in help_text and "--toy-every" in help_text
    base = ["train", "--dataset", SPEC, "--workers", "2", "--epochs", "2", "--quiet"]

    out = tmp_path / "exchange"
    ran = graphwire(
        capfd, *base, "--exchange", "toy", "--toy-rows", "3", "--out", str(out)
    )
    assert float(ran.summary()["test_acc"]) > 0
    records = _records(out)
    assert records[0]["exchange"] == "toy"
    assert records[0]["exchange_options"] == {"toy_rows": 3}
    epochs = [r for r in records if r["kind"] == "epoch"]
    assert all(r["comm"]["by_tag"]["toy.rows"] > 0 for r in epochs)

    out = tmp_path / "fetch"
    flags = ["--mode", "minibatch", "--fetch", "toy", "--toy-every", "5"]
    ran = graphwire(capfd, *base, *flags, "--out", str(out))
    assert float(ran.summary()["test_acc"]) > 0
    records = _records(out)
    assert records[0]["fetch_options"] == {
        "fetch": "toy",
        "prefetch": 4,
        "schedule": "serial",  # OnDemandConfig's, which the toy's extends
        "sampler_threads": None,
        "sigma": None,
        "toy_every": 5,
    }
    epochs = [r for r in records if r["kind"] == "epoch"]
    assert all(r["comm"]["by_tag"]["toy.fetch"] > 0 for r in epochs)

    ran = graphwire(capfd, *base, "--exchange", "halo", "--toy-rows", "3")
    assert ran.returncode == 2
    assert "--toy-rows: only with --exchange toy" in ran.stderr
    ran = graphwire(capfd, *base, "--mode", "minibatch", "--toy-every", "3")
    assert ran.returncode == 2
    assert "--toy-every: only with --fetch toy" in ran.stderr
