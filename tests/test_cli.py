"""The graphwire command: help, data commands, config files, error exits."""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from graphwire.cli import _command_actions, build_parser, main
from graphwire.commands.partition import refinement_line
from graphwire.graph.datasets import load_dataset
from graphwire.partition import (
    PARTITIONERS,
    LocalityPartitioner,
    load_part,
    load_partition_meta,
)
from graphwire.partition.locality import RefineResult

REPO_ROOT = Path(__file__).resolve().parents[1]
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


def test_a_command_without_its_subcommand_says_so(capsys) -> None:
    with pytest.raises(SystemExit):  # argparse's usage error, exit 2
        main(["data"])
    err = capsys.readouterr().err  # it named the attribute, data_command
    assert "the following arguments are required: SUBCOMMAND" in err


def test_data_generate_then_info(tmp_path, capsys) -> None:
    folder = tmp_path / "g"
    assert main(["data", "generate", "--dataset", SMALL, "--out", str(folder)]) == 0
    assert (folder / "meta.json").exists()
    assert main(["data", "info", "--dataset", str(folder)]) == 0
    assert "3,000" in capsys.readouterr().out
    # Refuses to overwrite without --overwrite, and says why.
    assert main(["data", "generate", "--dataset", SMALL, "--out", str(folder)]) == 2
    assert "already exists" in capsys.readouterr().err
    # `data verify` reads every byte of a graph folder too.
    assert main(["data", "verify", "--dataset", str(folder)]) == 0
    assert "every array matches its checksum" in capsys.readouterr().out
    features = folder / "x.npy"
    data = bytearray(features.read_bytes())
    data[-1] ^= 0xFF
    features.write_bytes(bytes(data))
    assert main(["data", "verify", "--dataset", str(folder)]) == 2
    assert f"{features}: checksum mismatch" in capsys.readouterr().err


def test_bad_dataset_is_a_clear_error(capsys) -> None:
    assert main(["data", "info", "--dataset", "synthetic:products?nodes=x"]) == 2
    assert "nodes='x'" in capsys.readouterr().err


def test_a_write_cut_short_is_one_line_naming_the_file(tmp_path) -> None:
    """A full disk (here a file size limit) ended in numpy's traceback,
    ``OSError: 3880564 requested and 511968 written``, naming no file, and
    left the folder ``big`` the command had made."""
    import resource

    def limit() -> None:
        resource.setrlimit(resource.RLIMIT_FSIZE, (1 << 16, 1 << 16))

    done = subprocess.run(
        [sys.executable, "-m", "graphwire", "data", "generate", "--dataset", SMALL]
        + ["--out", str(tmp_path / "big" / "g")],
        capture_output=True,
        text=True,
        preexec_fn=limit,
        timeout=120,
    )
    assert done.returncode == 1, done.stderr
    (line,) = done.stderr.splitlines()[-1:]
    assert "Traceback" not in done.stderr
    assert (
        line.startswith("graphwire: error: ") and ".npy: could not be written (" in line
    )
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize(
    ("option", "said"),
    [
        ("signal=nan", "signal: must be a number in [0, 1e6], got nan"),  # was NaN x
        ("seed=-1", "seed: expected an int in [0, 2**63), got -1"),
        ("features=1000000000", "10.9 TiB for x"),  # was a MemoryError traceback
    ],
)
def test_data_info_names_a_bad_synthetic_option(capsys, option: str, said: str) -> None:
    spec = f"synthetic:products?nodes=3000&{option}"
    assert main(["data", "info", "--dataset", spec]) == 2
    err = capsys.readouterr().err
    assert err.startswith("graphwire: error: ") and said in err


def test_an_error_is_one_write(monkeypatch) -> None:
    """The ranks torchrun starts on a node share its stderr: an error line
    written in two pieces (``print`` writes the newline apart) ran into the
    next rank's."""
    writes: list[str] = []

    class Stream:
        def write(self, text: str) -> int:
            writes.append(text)
            return len(text)

        def flush(self) -> None:
            pass

    monkeypatch.setattr(sys, "stderr", Stream())
    assert main(["data", "info", "--dataset", "synthetic:products?nodes=x"]) == 2
    assert len(writes) == 1, writes
    assert writes[0].startswith("graphwire: error: dataset ")
    assert writes[0].endswith("is not an integer\n")


def test_config_file_keys_must_be_known(tmp_path, capsys) -> None:
    config = tmp_path / "run.yaml"
    config.write_text("model: gcn\ncolour: blue\n")
    assert main(["train", "--config", str(config)]) == 2
    assert "unknown key 'colour'" in capsys.readouterr().err
    for text in ("- not a mapping\n", "[]\n", "0\n", "false\n", "''\n"):
        config.write_text(text)  # the last four were taken for no settings
        assert main(["train", "--config", str(config)]) == 2
        assert "expected a mapping" in capsys.readouterr().err
    config.write_text("help: true\n")  # a flag, but no setting
    assert main(["train", "--config", str(config)]) == 2
    assert "unknown key 'help'" in capsys.readouterr().err
    config.write_text("model: gcn\nepochs: 3\nmodel: sage\n")
    assert main(["train", "--config", str(config)]) == 2
    err = capsys.readouterr().err
    assert "not valid YAML" in err and "found the key 'model' twice" in err
    assert "line 3, column 1" in err
    config.write_text("[" * 100_000)  # was a RecursionError traceback
    assert main(["train", "--config", str(config)]) == 2
    assert "not valid YAML: nested too deeply" in capsys.readouterr().err
    config.write_text("batch-size: 8\nbatch_size: 16\n")
    assert main(["train", "--config", str(config)]) == 2
    err = capsys.readouterr().err
    assert "keys 'batch-size' and 'batch_size' set the same flag" in err
    config.write_bytes(b"\x00\xff\xfe model: gcn\n")
    assert main(["train", "--config", str(config)]) == 2
    err = capsys.readouterr().err
    assert f"graphwire: error: --config {config}: not a text file (UTF-8)" in err


@pytest.mark.parametrize(
    ("text", "error"),
    [
        ("epochs: lots\n", "epochs: expected int, got 'lots'"),
        ("epochs: 2.5\n", "epochs: expected int, got 2.5"),
        ("keep-checkpoints: true\n", "keep-checkpoints: expected int, got True"),
        ("exchange: mesh\n", "exchange: expected one of halo, replicate, g3"),
        ("quiet: 1\n", "quiet: expected true or false, got 1"),
        ("fanouts: {a: 1}\n", "fanouts: expected a single value"),
    ],
)
def test_config_file_values_are_checked_as_flags_are(
    tmp_path, capsys, text, error
) -> None:
    """A YAML value goes through its flag's type and choices, so a bad one is
    an error naming the file and key, not a TypeError deep in the run."""
    config = tmp_path / "run.yaml"
    config.write_text(text)
    assert main(["train", "--config", str(config)]) == 2
    assert f"graphwire: error: --config {config}: {error}" in capsys.readouterr().err


def test_config_file_values_become_the_flags_types(tmp_path) -> None:
    from graphwire.cli import apply_config, build_parser

    config = tmp_path / "run.yaml"
    config.write_text("lr: '0.05'\nseed: 7\ndataset: 12\nresume: false\n")
    argv = ["train", "--config", str(config), "--seed", "3"]
    args = apply_config(build_parser(), build_parser().parse_args(argv), argv)
    assert (args.lr, args.seed, args.dataset, args.resume) == (0.05, 3, "12", False)
    assert args.from_config == {"lr", "dataset", "resume"}


def test_an_abbreviated_flag_wins_over_the_config_file_too(tmp_path) -> None:
    """argparse takes ``--epoch`` for ``--epochs``; the file's value won, so
    the run trained with settings other than those typed, and said nothing."""
    from graphwire.cli import apply_config, build_parser

    config = tmp_path / "run.yaml"
    config.write_text("epochs: 1\nbatch_size: 16\nfanouts: [3, 3]\n# a comment\n")
    argv = ["train", "--config", str(config), "--epoch", "2", "--batch", "64"]
    args = apply_config(build_parser(), build_parser().parse_args(argv), argv)
    assert (args.epochs, args.batch_size, args.fanouts) == (2, 64, "3,3")
    assert args.from_config == {"fanouts"}
    config.write_text("# nothing set yet\n")  # no settings: the defaults
    argv = ["train", "--config", str(config)]
    args = apply_config(build_parser(), build_parser().parse_args(argv), argv)
    assert args.from_config == set() and args.epochs == 200


def test_a_distributed_flag_from_a_config_file_is_named_with_it(
    tmp_path, capsys
) -> None:
    """A shared config file's distributed settings on a one-process run: the
    refusal says they came from the file."""
    config = tmp_path / "run.yaml"
    config.write_text("exchange: g3\ntimeout: 600\n")
    argv = ["train", "--config", str(config), "--dataset", str(tmp_path / "x")]
    assert main([*argv, "--out", str(tmp_path / "run")]) == 2
    err = capsys.readouterr().err
    assert f"--exchange (in {config}) / --timeout (in {config}): only for" in err


def test_bench_list(capsys) -> None:
    assert main(["bench", "list"]) == 0
    assert "gcn-epoch" in capsys.readouterr().out


def _last_line(text: str) -> str:
    return text.strip().splitlines()[-1]


def test_train_writes_metrics_and_summary_line(tmp_path, capsys) -> None:
    out = tmp_path / "run"
    argv = ["train", "--dataset", SMALL, "--model", "gcn", "--epochs", "5"]
    argv += ["--seed", "3", "--partition", "metis", "--parts", "2", "--quiet"]
    assert main([*argv, "--out", str(out)]) == 0
    summary = _last_line(capsys.readouterr().out)
    assert summary.startswith("summary ")
    fields = dict(pair.split("=") for pair in summary.split()[1:])
    for key in ("test_acc", "val_acc", "epochs", "epoch_s_median", "edge_cut"):
        assert key in fields
    assert fields["epochs"] == "5"

    records = [json.loads(line) for line in (out / "metrics.jsonl").open()]
    kinds = [r["kind"] for r in records]
    assert kinds[0] == "config" and kinds[-1] == "summary"
    assert kinds.count("epoch") == 5 and "partition" in kinds
    assert records[-1]["test_acc"] == pytest.approx(float(fields["test_acc"]), 1e-3)
    epoch = next(r for r in records if r["kind"] == "epoch")
    assert {"loss", "train_acc", "val_acc", "test_acc", "peak_rss_mb"} <= set(epoch)


def test_eval_every_reaches_the_training_loop(tmp_path, capsys) -> None:
    out = tmp_path / "run"
    argv = ["train", "--dataset", SMALL, "--model", "gcn", "--epochs", "3"]
    assert main([*argv, "--eval-every", "2", "--quiet", "--out", str(out)]) == 0
    records = [json.loads(line) for line in (out / "metrics.jsonl").open()]
    val = [r["val_acc"] for r in records if r["kind"] == "epoch"]
    assert [v is None for v in val] == [True, False, False]  # 1, then the last
    assert main([*argv, "--eval-every", "0", "--out", str(tmp_path / "x")]) == 2
    assert "--eval-every: expected an integer >= 1" in capsys.readouterr().err


TINY = "synthetic:products?nodes=200&degree=4&features=8&classes=3&seed=1"


@pytest.mark.parametrize("mode", ["fullgraph", "minibatch"])
def test_gat_flags_reach_the_model(tmp_path, monkeypatch, mode: str) -> None:
    """--heads, --out-heads and --attn-dropout build the GAT a run trains
    (without them GAT always had 8 heads and attention dropout 0.6)."""
    import graphwire.training

    built = []

    def spy(*args, **kwargs):
        built.append(build(*args, **kwargs))
        return built[-1]

    build = graphwire.training.build_model
    monkeypatch.setattr(graphwire.training, "build_model", spy)
    out = tmp_path / "run"
    argv = ["train", "--dataset", TINY, "--model", "gat", "--mode", mode]
    argv += ["--heads", "3", "--out-heads", "2", "--attn-dropout", "0.25"]
    assert main([*argv, "--epochs", "1", "--quiet", "--out", str(out)]) == 0
    (model,) = built
    hidden, output = model.layers
    assert (hidden.heads, output.heads) == (3, 2)
    assert hidden.attn_dropout == output.attn_dropout == 0.25
    config = json.loads((out / "metrics.jsonl").open().readline())
    assert (config["heads"], config["out_heads"], config["attn_dropout"]) == (
        3,
        2,
        0.25,
    )


@pytest.mark.parametrize(
    ("flags", "error"),
    [
        (["--checkpoint-every", "2"], "--checkpoint-every: only for distributed"),
        (["--resume"], "--resume: only for distributed runs"),
        (["--keep-checkpoints", "0"], "--keep-checkpoints: only for distributed"),
        (["--exchange", "g3"], "--exchange: only for distributed runs"),
        (["--workers", "1", "--bin-rows", "64"], "--bin-rows: only for distributed"),
        (["--mode", "minibatch", "--fetch", "rapid"], "--fetch: only for distrib"),
        (["--timeout", "30", "--prefetch", "2"], "--prefetch / --timeout: only for"),
        (["--workers", "2", "--keep-checkpoints", "-1"], "--keep-checkpoints: exp"),
        (["--workers", "2", "--fetch", "rapid"], "--fetch: only with --mode minib"),
        (
            ["--workers", "2", "--mode", "minibatch", "--exchange", "halo"],
            "--exchange: only with --mode fullgraph",
        ),
        (
            ["--workers", "2", "--keep-checkpoints", "3"],
            "--keep-checkpoints: only with --checkpoint-every or --resume",
        ),
        (["--workers", "2", "--checkpoint-every", "0"], "--checkpoint-every: expected"),
        (["--workers", "2", "--timeout", "0"], "--timeout: expected > 0"),
        (["--workers", "2", "--threads", "0"], "--threads: expected >= 1"),
        (["--workers", "2", "--bin-rows", "0"], "--bin-rows: expected >= 1, got 0"),
        (["--workers", "2", "--bin-mb", "-1"], "--bin-mb: expected > 0, got -1"),
        (["--workers", "2", "--bin-mb", "inf"], "--bin-mb: expected a finite value"),
        (["--workers", "2", "--timeout", "inf"], "--timeout: expected > 0 and <= 1e"),
        (["--workers", "2", "--timeout", "1e300"], "--timeout: expected > 0 and <="),
        (
            ["--workers", "2", "--exchange", "halo", "--bin-rows", "5"],
            "--bin-rows: only with --exchange g3",
        ),
        (
            ["--workers", "2", "--mode", "minibatch", "--n-hot", "10"],
            "--n-hot: only with --fetch rapid",
        ),
        (
            ["--workers", "2", "--mode", "minibatch", "--prefetch", "2"],
            "--prefetch: only with --fetch rapid",
        ),
        (
            ["--workers", "2", "--mode", "minibatch", "--fetch", "rapid"]
            + ["--prefetch", "0"],
            "--prefetch: expected >= 1, got 0",
        ),
        (
            ["--workers", "2", "--mode", "minibatch", "--fetch", "rapid"]
            + ["--cache-mb", "0"],
            "--cache-mb: expected > 0, got 0",
        ),
        (
            ["--workers", "2", "--mode", "minibatch", "--fetch", "rapid"]
            + ["--cache-mb", "inf"],
            "--cache-mb: expected a finite value > 0, got inf",
        ),
        (["--fanouts", "10,25"], "--fanouts: only with --mode minibatch"),
        (["--fanouts", "10"], "--fanouts: only with --mode minibatch"),
        (["--batch-size", "0"], "--batch-size: only with --mode minibatch"),
        (["--workers", "2", "--batch-size", "9"], "--batch-size: only with --mode mi"),
        (["--parts", "3"], "--parts 3: only with --partition"),
        (
            ["--workers", "2", "--parts", "3"],
            "--parts 3: a distributed run has one part per worker (2)",
        ),
        (["--partition", "random", "--parts", "0"], "--parts: expected >= 1, got 0"),
        (["--layers", "0"], "--layers: expected an integer >= 1, got 0"),
        (["--heads", "2"], "--heads: only with --model gat"),
        (
            ["--model", "gcn", "--out-heads", "2", "--attn-dropout", "0.1"],
            "--out-heads / --attn-dropout: only with --model gat",
        ),
        (["--model", "gat", "--heads", "0"], "--heads: expected an integer >= 1"),
        (["--model", "gat", "--out-heads", "-1"], "--out-heads: expected an int"),
        (
            ["--model", "gat", "--attn-dropout", "1"],
            "--attn-dropout: expected a value in [0, 1), got 1.0",
        ),
        (["--eval-every", "0"], "--eval-every: expected an integer >= 1, got 0"),
        (  # it said "or None", which no command line can give
            ["--patience", "0"],
            "--patience: expected an integer >= 1 (leave it out: never stop early)",
        ),
        (
            ["--mode", "minibatch", "--layers", "3", "--fanouts", "-1,5"],
            "--fanouts: expected one per layer (--layers 3), got [-1, 5]",
        ),
        (  # the sampler's limit, which it said only after the data was read
            ["--mode", "minibatch", "--fanouts", "5000,5"],
            "--fanouts: at most 4096 each (or -1, all), got [5000, 5]",
        ),
        (
            ["--partition", "bogus"],
            "--partition bogus: unknown; expected one of chunk, locality, metis,",
        ),
        (
            ["--workers", "2", "--partition", "bogus"],
            "--partition bogus: unknown; expected one of chunk, locality, metis,",
        ),
    ],
    ids=repr,
)
def test_run_flags_are_refused_before_any_work(tmp_path, capsys, flags, error) -> None:
    """Flags a run would ignore, or could not use, are an error up front:
    nothing is read, split or written (the dataset does not even exist)."""
    argv = ["train", "--dataset", str(tmp_path / "missing"), "--quiet"]
    assert main([*argv, *flags, "--out", str(tmp_path / "run")]) == 2
    assert error in capsys.readouterr().err
    assert not (tmp_path / "run").exists()


def test_an_out_folder_that_cannot_be_one_is_refused_before_any_work(
    tmp_path, capsys
) -> None:
    """``--out`` naming a file, or a path under one, and a rapid run's
    ``--presample-dir`` naming a file, are errors up front, not an OSError
    traceback after the data was read."""
    afile = tmp_path / "afile"
    afile.write_text("keep me\n")
    argv = ["train", "--dataset", str(tmp_path / "missing"), "--quiet"]
    for out, said in ((afile, "is a file"), (afile / "sub", f"is under {afile}")):
        assert main([*argv, "--out", str(out)]) == 2
        assert f"--out {out}: {said}" in capsys.readouterr().err
    rapid = ["--workers", "2", "--mode", "minibatch", "--fetch", "rapid"]
    flags = [*rapid, "--presample-dir", str(afile), "--out", str(tmp_path / "run")]
    assert main([*argv, *flags]) == 2
    assert f"--presample-dir {afile}: exists and is not a folder" in (
        capsys.readouterr().err
    )
    assert afile.read_text() == "keep me\n" and not (tmp_path / "run").exists()


@pytest.mark.parametrize("workers", ["1", "2"])
def test_a_dataset_that_cannot_be_trained_is_refused_before_anything_is_written(
    tmp_path, capsys, workers
) -> None:
    """Without features, or with an empty split, a run failed after writing
    its metrics.jsonl.partial (one process) or OUT/partitions (workers)."""
    from graphwire.graph.files import save_npz

    graph = load_dataset(SMALL)
    empty_val = save_npz(
        graph.replace(val_idx=graph.val_idx[:0]), tmp_path / "empty-val.npz"
    )
    tiny = "synthetic:products?nodes=200&degree=8&features=4&classes=2"
    cases = [
        ("synthetic:rmat?scale=8", workers, "training needs features, labels and"),
        (f"npz:{empty_val}", workers, "val_idx holds no node"),
    ]
    if workers == "2":  # it said 'num_parts: must be <= the number of nodes'
        cases.append((tiny, "300", "300 workers (--workers, or torchrun's world): "))
    for dataset, world, said in cases:
        out = tmp_path / "run"
        argv = ["train", "--dataset", dataset, "--mode", "minibatch", "--quiet"]
        assert main([*argv, "--workers", world, "--out", str(out)]) == 2
        assert said in capsys.readouterr().err
        assert not out.exists()


def test_partition_is_refused_with_a_partitioned_dataset(tmp_path, capsys) -> None:
    """It was ignored: the run trained on the parts as they were split."""
    parts = str(tmp_path / "p2")
    assert (
        main(
            ["partition", "--dataset", SMALL, "--method", "random"]
            + ["--parts", "2", "--out", parts]
        )
        == 0
    )
    capsys.readouterr()
    argv = ["train", "--dataset", parts, "--workers", "2", "--quiet"]
    assert main([*argv, "--partition", "metis", "--out", str(tmp_path / "r")]) == 2
    assert (
        f"--partition metis: --dataset {parts} is split already (by random)"
        in capsys.readouterr().err
    )
    assert not (tmp_path / "r").exists()


def test_a_minibatch_runs_default_folder_is_not_named_after_an_exchange(
    tmp_path, monkeypatch
) -> None:
    """It was runs/train-sage-g3-*: mini-batch runs have no exchange."""
    import graphwire.commands.train_dist as train_dist

    folders = []
    monkeypatch.setattr(
        train_dist, "run_distributed", lambda args, config, out: folders.append(out)
    )
    monkeypatch.chdir(tmp_path)
    argv = ["train", "--dataset", SMALL, "--workers", "2", "--quiet"]
    assert main([*argv, "--mode", "minibatch"]) == 0
    assert main(argv) == 0
    names = [folder.name.rsplit("-", 2)[0] for folder in folders]
    assert names == ["train-sage-minibatch", "train-sage-g3"]


def test_under_torchrun_workers_must_match_its_world(
    tmp_path, capsys, monkeypatch
) -> None:
    """--workers 4 where torchrun started 2 is refused, not quietly run on 2."""
    env = {"RANK": "0", "WORLD_SIZE": "2", "LOCAL_RANK": "0"}
    env |= {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29500"}
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    argv = ["train", "--dataset", str(tmp_path / "missing"), "--workers", "4"]
    assert main([*argv, "--quiet", "--out", str(tmp_path / "run")]) == 2
    assert "--workers 4: torchrun started 2 workers" in capsys.readouterr().err
    # A malformed variable is named before any work (it was int()'s message).
    monkeypatch.setenv("WORLD_SIZE", "abc")
    assert main([*argv[:3], "--quiet", "--out", str(tmp_path / "run")]) == 2
    assert "variable WORLD_SIZE must be an integer, got 'abc'" in (
        capsys.readouterr().err
    )


def test_train_config_file_stands_in_for_flags(tmp_path, capsys) -> None:
    config = tmp_path / "run.yaml"
    config.write_text(f"dataset: '{SMALL}'\nmodel: sage\nepochs: 3\nquiet: true\n")
    out = tmp_path / "run"
    assert main(["train", "--config", str(config), "--out", str(out)]) == 0
    records = [json.loads(line) for line in (out / "metrics.jsonl").open()]
    assert records[0]["model"] == "sage" and records[0]["epochs"] == 3
    assert "epochs=3" in _last_line(capsys.readouterr().out)


def test_partition_command_writes_loadable_parts(tmp_path, capsys) -> None:
    out = tmp_path / "parts"
    argv = ["partition", "--dataset", SMALL, "--method", "metis", "--parts", "3"]
    assert main([*argv, "--out", str(out)]) == 0
    text = capsys.readouterr().out
    assert "edge cut" in text and "max/mean" in text
    meta = load_partition_meta(out)
    assert meta["num_parts"] == 3
    owned = sum(load_part(out, p).num_owned for p in range(3))
    assert owned == 3000
    # `data verify` checks every byte against meta.json's sums.
    assert main(["data", "verify", "--dataset", str(out)]) == 0
    assert "all 3 parts match their checksums" in capsys.readouterr().out
    features = out / "part_2" / "x.npy"
    data = bytearray(features.read_bytes())
    data[-1] ^= 0xFF  # one bit pattern of one feature: sizes still agree
    features.write_bytes(bytes(data))
    assert load_part(out, 2).num_owned > 0  # loading does not read every byte
    assert main(["data", "verify", "--dataset", str(out)]) == 2
    assert f"{features}: checksum mismatch" in capsys.readouterr().err
    assert main(["data", "verify", "--dataset", SMALL]) == 2
    assert "no such folder (verify checks a folder from" in capsys.readouterr().err
    # One process cannot train it: the error says how.
    assert main(["train", "--dataset", str(out), "--quiet"]) == 2
    said = "a partitioned graph (3 parts); train it with --workers 3"
    assert said in capsys.readouterr().err
    # An unknown method is a clear error, not a traceback.
    assert main(["partition", "--dataset", SMALL, "--method", "spectral"]) == 2
    assert (
        "--method spectral: unknown; expected one of chunk" in capsys.readouterr().err
    )


TINY = "synthetic:products?nodes=300&degree=4&features=4&classes=3&seed=1"


def test_partition_refuses_to_destroy_its_input(tmp_path, capsys) -> None:
    """--out may not be the input folder, hold it or lie in it, even with
    --overwrite; the input is left as it was."""
    source = tmp_path / "g"
    assert main(["data", "generate", "--dataset", TINY, "--out", str(source)]) == 0
    before = sorted(p.name for p in source.iterdir())
    argv = ["partition", "--dataset", str(source), "--parts", "2", "--overwrite"]
    for out, said in [
        (source, "holds the input"),
        (tmp_path, "holds the input"),
        (source / "parts", "lies inside the input"),
    ]:
        capsys.readouterr()
        assert main([*argv, "--out", str(out)]) == 2
        err = capsys.readouterr().err
        assert err.startswith(f"graphwire: error: --out {out}: {said}"), err
        assert sorted(p.name for p in source.iterdir()) == before
    assert main(["data", "info", "--dataset", str(source)]) == 0


def test_distributed_train_refuses_to_write_its_parts_over_its_input(
    tmp_path, capsys
) -> None:
    """``train --workers N`` writes ``OUT/partitions`` (and, checkpointing,
    ``OUT/checkpoints``): a graph read from there was replaced by its own parts
    while memory-mapped. Refused before any work; the input is left as it was."""
    for name in ("partitions", "checkpoints"):
        source = tmp_path / name
        argv = ["data", "generate", "--dataset", TINY, "--out", str(source)]
        assert main(argv) == 0
        before = sorted(p.name for p in source.iterdir())
        capsys.readouterr()
        argv = ["train", "--dataset", str(source), "--workers", "2", "--quiet"]
        argv += ["--epochs", "1", "--checkpoint-every", "1", "--out", str(tmp_path)]
        assert main(argv) == 2
        err = capsys.readouterr().err
        said = f"--out {tmp_path}: {source}: holds the input of --dataset {source}"
        assert err.startswith(f"graphwire: error: {said}"), err
        assert sorted(p.name for p in source.iterdir()) == before
        assert main(["data", "info", "--dataset", str(source)]) == 0


def test_a_planetoid_folder_takes_outputs_beside_its_files(
    tmp_path, capsys, cora_dir
) -> None:
    """A planetoid spec reads ``ind.cora.*`` only: an output may be written
    into its folder, but not over the folder itself."""
    folder = tmp_path / "planetoid"
    folder.mkdir()
    for source in cora_dir.glob("ind.cora.*"):  # linked, not copied
        (folder / source.name).symlink_to(source)
    spec = f"planetoid:{folder}/cora"
    argv = ["data", "generate", "--dataset", spec, "--overwrite", "--out"]
    assert main([*argv, str(folder / "cora-gw")]) == 0
    capsys.readouterr()
    assert main([*argv, str(folder)]) == 2
    assert f"--out {folder}: holds the input" in capsys.readouterr().err
    assert len(list(folder.glob("ind.cora.*"))) == 8


def test_partition_overwrites_only_graphwire_folders(tmp_path, capsys) -> None:
    argv = ["partition", "--dataset", TINY, "--parts", "2", "--out"]
    kept = tmp_path / "afile"
    kept.write_text("keep me")
    assert main([*argv, str(kept), "--overwrite"]) == 2
    assert f"--out {kept}: is a file, not a folder" in capsys.readouterr().err
    assert main([*argv, str(kept / "sub")]) == 2  # before any work, as train's
    assert f"--out {kept / 'sub'}: is under {kept}" in capsys.readouterr().err
    assert kept.read_text() == "keep me"
    # An existing folder is refused before the partition is computed.
    out = tmp_path / "parts"
    assert main([*argv, str(out)]) == 0
    capsys.readouterr()
    assert main([*argv, str(out)]) == 2
    done = capsys.readouterr()
    assert "already exists (pass --overwrite to replace it)" in done.err
    assert "partition: " not in done.out  # no table: nothing was computed
    assert main([*argv, str(out), "--overwrite"]) == 0


def test_more_parts_than_nodes_is_refused_naming_parts(tmp_path, capsys) -> None:
    """The partitioner said 'num_parts: must be <= ...', a name never typed."""
    out = tmp_path / "run"
    for argv in (
        ["partition", "--dataset", TINY, "--parts", "5000"],
        ["train", "--dataset", TINY, "--partition", "random", "--parts", "5000"]
        + ["--quiet", "--out", str(out)],
    ):
        assert main(argv) == 2
        err = capsys.readouterr().err
        assert f"--parts 5000: more than the 300 nodes of {TINY}" in err, err
    assert not out.exists()


def test_partition_help_names_every_registered_partitioner(capsys) -> None:
    for command in ("partition", "train"):
        with pytest.raises(SystemExit):
            main([command, "--help"])
        text = capsys.readouterr().out
        for name in PARTITIONERS:
            assert name in text, (command, name)


def test_locality_partition_reports_what_the_refinement_did(tmp_path, capsys) -> None:
    assert main(["partition", "--dataset", SMALL, "--method", "locality"]) == 0
    text = capsys.readouterr().out
    expected = LocalityPartitioner()
    expected.partition(load_dataset(SMALL), 4, seed=0)
    assert expected.last_refinement is not None
    # All but the seconds it took.
    assert refinement_line(expected.last_refinement).rsplit(", ", 1)[0] in text
    assert text.count("locality refinement:") == text.count("partition: ") == 1
    # A single-process run with --partition locality logs it as well.
    out = tmp_path / "run"
    argv = ["train", "--dataset", SMALL, "--epochs", "1", "--quiet"]
    assert main([*argv, "--partition", "locality", "--out", str(out)]) == 0
    records = [json.loads(line) for line in (out / "metrics.jsonl").open()]
    logged = next(r for r in records if r["kind"] == "partition")
    summary = expected.last_refinement.summary()
    assert {k: logged[f"refine_{k}"] for k in summary if k != "seconds"} == {
        k: v for k, v in summary.items() if k != "seconds"
    }


def _refinement(halo: tuple[int, ...], cut_before: int, cut_after: int):
    return RefineResult(
        halo_before=halo,
        halo_after=halo,
        degree_sum_before=(4,) * len(halo),
        degree_sum_after=(4,) * len(halo),
        edge_cut_before=cut_before,
        edge_cut_after=cut_after,
        num_swaps=0,
        num_rejected=0,
        stop_reason="converged",
        seconds=0.0,
    )


@pytest.mark.parametrize(
    ("result", "said"),
    [
        # --parts 1: no halo, no cut; not "0 -> 0 (-100.0%)".
        (_refinement((0,), 0, 0), "halo max/min 1.000 -> 1.000, edge cut 0 -> 0, "),
        # A tiny graph with a part that reads no other: not "inf -> inf".
        (
            _refinement((0, 3), 4, 5),
            "halo max/min n/a -> n/a (n/a: a part with no halo), edge cut 4 -> 5 "
            "(+25.0%), ",
        ),
        (_refinement((2, 3), 4, 2), "halo max/min 1.500 -> 1.500, edge cut 4 -> 2 ("),
    ],
    ids=["one part", "a part without halo", "usual"],
)
def test_refinement_line_says_only_true_numbers(result, said: str) -> None:
    assert said in refinement_line(result)


# A launcher's worker running the CLI, with a thread that never ends: a normal
# interpreter exit would wait for it forever (as it can abort on gloo's threads).
_LAUNCHED_CLI = """
import atexit, runpy, sys, threading
threading.Thread(target=threading.Event().wait).start()
atexit.register(print, "atexit handlers ran")
sys.argv = ["graphwire", *sys.argv[1:]]
runpy.run_module("graphwire", run_name="__main__")
"""


@pytest.mark.parametrize(
    ("dataset", "code", "said"),
    [(SMALL, 0, "3,000"), ("synthetic:products?nodes=x", 2, "nodes='x'")],
)
def test_under_a_launcher_the_cli_exits_without_interpreter_teardown(
    monkeypatch, dataset: str, code: int, said: str
) -> None:
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "1")
    monkeypatch.delenv("PYTHONUNBUFFERED", raising=False)  # stdout: a buffered pipe
    done = subprocess.run(
        [sys.executable, "-c", _LAUNCHED_CLI, "data", "info", "--dataset", dataset],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == code
    assert said in done.stdout + done.stderr
    # atexit handlers still run, and output is flushed before the process ends.
    assert done.stdout.rstrip().endswith("atexit handlers ran")


@pytest.mark.parametrize("command", ["partition", "train", "bench"])
def test_every_flag_has_help(command: str) -> None:
    actions = _command_actions(build_parser(), command)
    missing = [a.dest for a in actions.values() if not a.help]
    assert missing == []


@pytest.mark.parametrize("command", ["generate", "info", "verify"])
def test_every_data_flag_has_help(command: str) -> None:
    data = _command_actions(build_parser(), "data")["data_command"]
    assert isinstance(data, argparse._SubParsersAction)
    parser = data.choices[command]
    assert [a.dest for a in parser._actions if not a.help] == []


@pytest.mark.parametrize(
    ("flags", "said"),
    [
        (["--seed", "-1"], "--seed: expected an int in [0, 2**63), got -1"),
        (["--nodes", "3000000000"], "--nodes: need 100 to 2**31, got 3000000000"),
        (["--nodes", "99"], "--nodes: need 100 to 2**31, got 99"),
        (["--repeat", "0"], "--repeat: need at least 1, got 0"),
    ],
)
def test_bench_bad_options_are_named_by_their_flags(capsys, flags, said) -> None:
    # The generator benchmark used to die in its child process (a traceback).
    assert main(["bench", "generator", "--nodes", "200", *flags]) == 2
    assert capsys.readouterr().err == f"graphwire: error: {said}\n"


def test_out_of_memory_is_one_line(tmp_path, capsys, cora_dir, monkeypatch) -> None:
    """torch's failed CPU allocation (a huge --hidden) and numpy's
    MemoryError were tracebacks; now one line saying what was asked for."""
    argv = ["train", "--dataset", f"planetoid:{cora_dir}/cora", "--quiet"]
    argv += ["--model", "gcn", "--hidden", "100000000000", "--epochs", "1"]
    assert main([*argv, "--out", str(tmp_path / "run")]) == 1
    err = capsys.readouterr().err
    assert err == (
        "graphwire: error: out of memory: you tried to allocate "
        f"{1433 * 100_000_000_000 * 4} bytes\n"
    ), err

    def numpy_runs_out(args):
        return np.zeros(2**40)  # 8 TiB

    import graphwire.commands.data

    monkeypatch.setattr(graphwire.commands.data, "info", numpy_runs_out)
    assert main(["data", "info", "--dataset", "synthetic:products"]) == 1
    err = capsys.readouterr().err
    assert err.startswith("graphwire: error: out of memory: Unable to allocate"), err


def test_bench_script_help_is_its_own() -> None:
    script = REPO_ROOT / "benchmarks" / "bench_sampler.py"
    out = subprocess.run(
        [sys.executable, str(script), "--help"],
        capture_output=True,
        text=True,
        check=True,
        env={**os.environ, "PYTHONPATH": str(REPO_ROOT)},
    ).stdout
    assert out.startswith("usage: bench_sampler.py [-h] [--nodes NODES]")
    assert "`graphwire bench sampler`" in out
    assert "name" not in out.split("\n\n")[0]  # the script passes the NAME itself


def test_sigterm_ends_a_command_as_ctrl_c_does(tmp_path) -> None:
    """``timeout``, a job scheduler or ``kill PID`` send SIGTERM: its
    default ended ``graphwire data generate`` or ``partition`` mid-write
    with the temporary folder left beside the target (``.NAME.*.tmp``: 291
    MB for 4 parts of a 1M-node graph). Now the clean-up runs: one line,
    exit 130, nothing left."""
    spec = "synthetic:products?nodes=200000"
    command = [sys.executable, "-m", "graphwire", "data", "generate"]
    command += ["--dataset", spec, "--out", str(tmp_path / "g")]
    process = subprocess.Popen(
        command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True
    )
    try:
        while not list(tmp_path.glob(".g.*.tmp")):  # about 2 s in, for 0.7 s
            assert process.poll() is None, "ended before it wrote"
            time.sleep(0.01)
        process.send_signal(signal.SIGTERM)
        _, stderr = process.communicate(timeout=60)
    finally:
        if process.poll() is None:
            process.kill()
            process.communicate()
    assert process.returncode == 130, stderr
    assert stderr.strip().splitlines()[-1] == "graphwire: interrupted"
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("source", ["flag", "config"])
def test_empty_fanouts_are_refused_not_the_default(tmp_path, capsys, source) -> None:
    """``--fanouts ''`` or ``fanouts: []`` trained with the default 10,25."""
    config = tmp_path / "run.yaml"
    config.write_text("mode: minibatch\n" + ("fanouts: []\n" * (source == "config")))
    argv = ["train", "--config", str(config), "--out", str(tmp_path / "out")]
    assert main(argv + ["--fanouts", ""] * (source == "flag")) == 2
    err = capsys.readouterr().err
    assert "--fanouts: expected comma-separated integers, got ''" in err
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize(
    ("flags", "error"),
    [
        (["--method", "bogus"], "--method bogus: unknown; expected one of chunk,"),
        (["--parts", "0"], "--parts: expected >= 1, got 0"),
        (["--seed", "-1"], "--seed: expected an int in [0, 2**63), got -1"),
        (["--overwrite"], "--overwrite: only with --out"),
    ],
    ids=repr,
)
def test_partition_settings_are_refused_before_the_graph_is_read(
    tmp_path, capsys, flags, error
) -> None:
    """They were checked only after the graph was read or generated (long,
    for a large one); --overwrite without --out was ignored. The dataset
    does not even exist."""
    argv = ["partition", "--dataset", str(tmp_path / "missing"), *flags]
    assert main(argv) == 2
    assert f"graphwire: error: {error}" in capsys.readouterr().err


def test_verify_names_what_is_wrong_with_a_folder(tmp_path, capsys) -> None:
    """It said 'not a graphwire folder' for a missing path, a damaged
    meta.json and a parts folder without part_0; a meta.json nested deeply
    was a RecursionError traceback (info, verify, --overwrite)."""
    graph, parts = tmp_path / "g", tmp_path / "p"
    assert main(["data", "generate", "--dataset", SMALL, "--out", str(graph)]) == 0
    assert (
        main(
            ["partition", "--dataset", str(graph), "--parts", "2"]
            + ["--out", str(parts)]
        )
        == 0
    )
    (parts / "part_0").rename(tmp_path / "moved")
    capsys.readouterr()

    def error(*argv: str) -> str:
        assert main(list(argv)) == 2
        return capsys.readouterr().err

    verify = ["data", "verify", "--dataset"]
    assert f"{tmp_path / 'none'}: no such folder" in error(
        *verify, str(tmp_path / "none")
    )
    assert f"{parts / 'part_0'} is missing" in error(*verify, str(parts))
    (graph / "meta.json").write_text("[" * 100_000)
    for argv in (
        [*verify, str(graph)],
        ["data", "info", "--dataset", str(graph)],
    ):
        assert "meta.json: not valid JSON (maximum recursion depth" in error(*argv)
    generate = ["data", "generate", "--dataset", SMALL, "--out", str(graph)]
    assert "refusing to replace it" in error(*generate, "--overwrite")


def _resave_part_array(parts: Path, part: int, name: str, array) -> None:
    """Write ``part_<part>/<name>.npy`` with its checksum and shape in
    meta.json updated, as a careful tamperer would."""
    import hashlib

    import numpy as np

    path = parts / f"part_{part}" / f"{name}.npy"
    np.save(path, array)
    meta = json.loads((parts / "meta.json").read_text())
    spec = meta["parts"][part]["arrays"][name]
    spec["sha256"] = hashlib.sha256(path.read_bytes()).hexdigest()
    spec["shape"] = list(array.shape)
    (parts / "meta.json").write_text(json.dumps(meta))


@pytest.mark.parametrize(
    "damage",
    [
        "no labels in part 0",
        "repeated training node",
        "node owned twice",
        "owned halo node",
        "num_classes",
    ],
)
def test_verify_finds_parts_that_disagree_with_checksums_intact(
    tmp_path, capsys, damage
) -> None:
    """Each passed 'all parts match their checksums': meta.json has none of
    its own, and only IDs were range-checked."""
    import numpy as np

    parts = tmp_path / "p"
    argv = ["partition", "--dataset", SMALL, "--parts", "2", "--out", str(parts)]
    assert main(argv) == 0
    meta = json.loads((parts / "meta.json").read_text())
    part0, part1 = (np.load(parts / f"part_{i}" / "orig_nid.npy") for i in (0, 1))
    if damage == "no labels in part 0":
        del meta["parts"][0]["arrays"]["y"]
        (parts / "meta.json").write_text(json.dumps(meta))
        said = "parts[1].arrays lists ['halo_nid', 'indices', 'indptr', 'orig_nid',"
    elif damage == "repeated training node":
        train = np.load(parts / "part_1" / "train_local.npy")
        _resave_part_array(parts, 1, "train_local", np.append(train, train[0]))
        said = "train_local.npy: holds a node twice"
    elif damage == "node owned twice":
        _resave_part_array(parts, 0, "orig_nid", np.append(part0[:-1], part1[0]))
        said = "own more than once 1 node(s), such as"
    elif damage == "owned halo node":
        halo = np.load(parts / "part_1" / "halo_nid.npy")
        start = meta["offsets"][1]
        below = int(np.searchsorted(halo, start)) - 1
        assert below >= 0 and (below + 1 == halo.size or halo[below + 1] > start)
        halo[below] = start
        _resave_part_array(parts, 1, "halo_nid", halo)
        said = f"halo_nid.npy: holds 1 nodes this part owns (global IDs [{start},"
    else:
        meta["num_classes"] = 50
        (parts / "meta.json").write_text(json.dumps(meta))
        said = "num_classes is 50, but the labels run to 3 (expected 4)"
    capsys.readouterr()
    assert main(["data", "verify", "--dataset", str(parts)]) == 2
    assert said in capsys.readouterr().err


def test_under_a_launcher_a_failed_join_is_one_line(tmp_path) -> None:
    """A rank whose master never comes up: torch's C++ log (a page of
    ``frame #`` lines before the error) is off under a launcher unless the
    user set its level, so stderr is graphwire's one line naming the rank."""
    from graphwire.comm.launch import free_port

    parts = tmp_path / "parts"
    argv = ["partition", "--dataset", SMALL, "--method", "random", "--parts", "2"]
    assert main([*argv, "--out", str(parts)]) == 0
    env = {k: v for k, v in os.environ.items() if k != "TORCH_CPP_LOG_LEVEL"}
    env |= {"RANK": "1", "WORLD_SIZE": "2", "LOCAL_RANK": "0"}
    env |= {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port())}
    done = subprocess.run(
        [sys.executable, "-m", "graphwire", "train", "--dataset", str(parts)]
        + ["--quiet", "--timeout", "2", "--out", str(tmp_path / "run")],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    assert done.returncode != 0
    assert done.stderr.startswith("graphwire: error: rank 1: joining 2 ranks at ")
    assert done.stderr.count("\n") == 1, done.stderr
