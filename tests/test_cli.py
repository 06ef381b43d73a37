"""The graphwire command: help, data commands, config files, error exits."""

from __future__ import annotations

import subprocess
import sys

import pytest

from graphwire.cli import main

SMALL = "synthetic:products?nodes=3000&degree=8&features=16&classes=4&seed=1"


def test_help_lists_the_commands() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "graphwire", "--help"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    for command in ("data", "partition", "train", "bench"):
        assert command in out


def test_data_generate_then_info(tmp_path, capsys) -> None:
    folder = tmp_path / "g"
    assert main(["data", "generate", "--dataset", SMALL, "--out", str(folder)]) == 0
    assert (folder / "meta.json").exists()
    assert main(["data", "info", "--dataset", str(folder)]) == 0
    assert "3,000" in capsys.readouterr().out
    # Refuses to overwrite without --overwrite, and says why.
    assert main(["data", "generate", "--dataset", SMALL, "--out", str(folder)]) == 2
    assert "already exists" in capsys.readouterr().err


def test_bad_dataset_is_a_clear_error(capsys) -> None:
    assert main(["data", "info", "--dataset", "synthetic:products?nodes=x"]) == 2
    assert "nodes='x'" in capsys.readouterr().err


def test_config_file_keys_must_be_known(tmp_path) -> None:
    config = tmp_path / "run.yaml"
    config.write_text("model: gcn\ncolour: blue\n")
    with pytest.raises(SystemExit, match="unknown key 'colour'"):
        main(["train", "--config", str(config)])
    config.write_text("- not a mapping\n")
    with pytest.raises(SystemExit, match="expected a mapping"):
        main(["train", "--config", str(config)])


def test_bench_list(capsys) -> None:
    assert main(["bench", "list"]) == 0
    assert "gcn-epoch" in capsys.readouterr().out
