"""`graphwire train`: flags refused before any work, and what a run writes."""

from __future__ import annotations

import json

import pytest

from graphwire.cli import main
from graphwire.graph.datasets import load_dataset
from tests.cli_helpers import SMALL, TINY


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
    assert records[0]["node_order"] == "rcm"  # the default
    by_id = tmp_path / "by-id"
    argv += ["--epochs", "1", "--node-order", "id", "--out", str(by_id)]
    assert main(argv) == 0
    with (by_id / "metrics.jsonl").open() as lines:
        assert json.loads(lines.readline())["node_order"] == "id"


def test_a_run_into_an_earlier_runs_folder_needs_overwrite(tmp_path, capsys) -> None:
    """As ``partition`` and ``data generate`` do: a second run into a run's
    folder is refused before any work, in one line naming --overwrite and
    --resume, and the first run's records are kept; ``--overwrite`` (a flag
    or a --config key) replaces them. An empty folder is any run's."""
    out = tmp_path / "run"
    out.mkdir()
    argv = ["train", "--dataset", TINY, "--quiet", "--out", str(out)]
    assert main([*argv, "--epochs", "2"]) == 0
    first = (out / "metrics.jsonl").read_text()
    capsys.readouterr()
    assert main([*argv, "--epochs", "1"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "holds an earlier run (metrics.jsonl)" in err
    assert "pass --overwrite to replace it" in err and "--resume" in err
    assert (out / "metrics.jsonl").read_text() == first
    config = tmp_path / "run.yaml"
    config.write_text("output:\n  overwrite: true\n")
    assert main([*argv, "--epochs", "1", "--config", str(config)]) == 0
    epochs = [json.loads(line)["kind"] for line in (out / "metrics.jsonl").open()]
    assert epochs.count("epoch") == 1
    assert main([*argv[:-2], "--overwrite"]) == 2
    said = "--overwrite: only with --out (without it the run writes a new folder)"
    assert said in capsys.readouterr().err
    assert main([*argv, "--overwrite", "--workers", "2", "--resume"]) == 2
    assert "--overwrite: only without --resume" in capsys.readouterr().err


def test_eval_every_reaches_the_training_loop(tmp_path, capsys) -> None:
    out = tmp_path / "run"
    argv = ["train", "--dataset", SMALL, "--model", "gcn", "--epochs", "3"]
    assert main([*argv, "--eval-every", "2", "--quiet", "--out", str(out)]) == 0
    records = [json.loads(line) for line in (out / "metrics.jsonl").open()]
    val = [r["val_acc"] for r in records if r["kind"] == "epoch"]
    assert [v is None for v in val] == [True, False, False]  # 1, then the last
    assert main([*argv, "--eval-every", "0", "--out", str(tmp_path / "x")]) == 2
    assert "--eval-every: expected an integer >= 1" in capsys.readouterr().err


@pytest.mark.parametrize("mode", ["fullgraph", "minibatch"])
def test_gat_flags_reach_the_model(tmp_path, monkeypatch, mode: str) -> None:
    """--heads, --out-heads and --attn-dropout build the GAT a run trains
    (without them GAT always had 8 heads and attention dropout 0.6)."""
    import graphwire.run.training

    built = []

    def spy(*args, **kwargs):
        built.append(build(*args, **kwargs))
        return built[-1]

    build = graphwire.run.training.build_model
    monkeypatch.setattr(graphwire.run.training, "build_model", spy)
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
            ["--workers", "2", "--exchange", "halo", "--g3-last", "bins"],
            "--g3-last: only with --exchange g3",
        ),
        (
            ["--workers", "2", "--mode", "minibatch", "--n-hot", "10"],
            "--n-hot: only with --fetch rapid",
        ),
        (
            ["--workers", "2", "--exchange", "halo", "--staleness", "epoch:1"],
            "--staleness: only with --exchange g3 or broadcast",
        ),
        (
            ["--workers", "2", "--exchange", "halo", "--staleness-norm", "max"],
            "--staleness-norm: only with --exchange g3 or broadcast",
        ),
        (
            ["--workers", "2", "--exchange", "broadcast", "--staleness", "often"],
            "--staleness: expected none, epoch:K, adaptive:K (K an integer >= 0) "
            "or gap:X (a number >= 0), got 'often'",
        ),
        (
            ["--workers", "2", "--exchange", "broadcast", "--staleness", "gap:-1"],
            "--staleness: gap: the bound must be >= 0, got 'gap:-1'",
        ),
        (
            ["--workers", "2", "--exchange", "broadcast", "--grad-staleness", "-1"],
            "--grad-staleness: expected >= 0, got -1",
        ),
        (
            ["--workers", "2", "--exchange", "halo", "--switch-mb", "1"],
            "--switch-mb: only with --exchange switch",
        ),
        (
            ["--workers", "2", "--exchange", "switch", "--switch-loss", "0.9"],
            "--switch-loss: expected >= 0 and <= 0.5, got 0.9",
        ),
        (
            ["--workers", "2", "--exchange", "switch", "--switch-addr", "nohost"],
            "--switch-addr: switch address: expected HOST:PORT, got 'nohost'",
        ),
        (
            ["--workers", "2", "--exchange", "switch", "--model", "gat"],
            "--exchange switch: only with --model gcn or sage, not gat",
        ),
        (
            ["--workers", "2", "--mode", "minibatch", "--cache-share", "0.5"],
            "--cache-share: only with --fetch rapid",
        ),
        (
            ["--workers", "2", "--mode", "minibatch", "--fetch", "rapid"]
            + ["--n-hot", "100", "--cache-mb", "0.0001"],
            "--cache-mb: only without --n-hot",
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
        (
            ["--workers", "2", "--mode", "minibatch", "--fetch", "dgs"]
            + ["--feature-rate", "0"],
            "--feature-rate: expected > 0 and <= 1, got 0.0",
        ),
        (
            ["--workers", "2", "--mode", "minibatch", "--fetch", "dgs"]
            + ["--epsilon", "1"],
            "--epsilon: expected a value in [0, 1), got 1.0",
        ),
        (
            ["--workers", "2", "--mode", "minibatch", "--fetch", "dgs"]
            + ["--explain-every", "0"],
            "--explain-every: expected >= 1, got 0",
        ),
        (
            ["--workers", "2", "--mode", "minibatch", "--epsilon", "0.2"],
            "--epsilon: only with --fetch dgs",
        ),
        (
            ["--workers", "2", "--mode", "minibatch", "--fetch", "dgs"]
            + ["--explain-every", "3", "--prefetch", "4"],
            "--prefetch: at most --explain-every (3), got 4",
        ),
        (
            ["--workers", "2", "--mode", "minibatch", "--fetch", "rapid"]
            + ["--explain-every", "3"],
            "--explain-every: only with --dgs-dims",
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
            "--partition bogus: unknown; expected one of blocks, chunk, locality,",
        ),
        (
            ["--backend", "gloo"],
            "--backend: only for distributed runs (--workers N with N >= 2",
        ),
        (
            ["--mode", "minibatch", "--node-order", "id"],
            "--node-order: on one process, only with --mode fullgraph",
        ),
        (
            ["--workers", "2", "--partition", "bogus"],
            "--partition bogus: unknown; expected one of blocks, chunk, locality,",
        ),
        (["--task", "link"], "--task: only with --mode minibatch"),
        (["--mode", "minibatch", "--decoder", "mlp"], "--decoder: only with --task"),
        (
            ["--mode", "minibatch", "--task", "link", "--negatives", "0"],
            "--negatives: expected an integer in [1, 4096], got 0",
        ),
        (
            ["--workers", "2", "--mode", "minibatch", "--task", "link"]
            + ["--fetch", "rapid"],
            "--task link: only with --fetch on-demand, not rapid",
        ),
        (["--mode", "minibatch", "--val-edges", "0.1"], "--val-edges: only with --t"),
        (
            ["--mode", "minibatch", "--task", "link", "--test-edges", "1"],
            "--test-edges: expected a share in (0, 1), got 1.0",
        ),
        (
            ["--mode", "minibatch", "--task", "link", "--val-edges", "0.5"]
            + ["--test-edges", "0.5"],
            "--test-edges: with val_edges 0.5, leaves no edges to train on",
        ),
        (
            ["--mode", "minibatch", "--task", "link", "--eval-negatives", "0"],
            "--eval-negatives: expected an integer >= 1, got 0",
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


def test_nccl_without_a_gpu_per_worker_is_refused_before_any_work(
    tmp_path, capsys, monkeypatch
) -> None:
    """It was refused only once the graph had been read and split."""
    import torch

    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    argv = ["train", "--dataset", str(tmp_path / "missing"), "--quiet"]
    argv += ["--workers", "2", "--backend", "nccl", "--out", str(tmp_path / "run")]
    assert main(argv) == 2
    error = "'nccl' needs one GPU per rank, but 2 ranks were asked for and 1 CUDA"
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
    edges = tmp_path / "g.txt"
    edges.write_text("0 1\n1 2\n2 0\n")
    bare = save_npz(graph.replace(x=None), tmp_path / "bare.npz")
    cases = [
        ("synthetic:rmat?scale=8", workers, "training needs features, labels and"),
        (f"npz:{empty_val}", workers, "val_idx holds no node"),
        # It suggested R-MAT's features=F&classes=C, which an edge list lacks.
        (
            f"edgelist:{edges}",
            workers,
            f"dataset edgelist:{edges}: an edge list carries edges only, no "
            "features, labels or splits, which training needs; save the edges "
            "with them as an .npz",
        ),
        (f"npz:{bare}", workers, "split, and it has no features (x)"),
    ]
    if workers == "2":  # it said 'num_parts: must be <= the number of nodes'
        cases.append((tiny, "300", "300 workers (--workers, or torchrun's world): "))
    for dataset, world, said in cases:
        out = tmp_path / "run"
        argv = ["train", "--dataset", dataset, "--mode", "minibatch", "--quiet"]
        assert main([*argv, "--workers", world, "--out", str(out)]) == 2
        err = capsys.readouterr().err
        assert said in err and (dataset.startswith("synthetic") or "R-MAT" not in err)
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
    # Its parts are numbered already (rcm, partition's default).
    assert main([*argv, "--node-order", "id", "--out", str(tmp_path / "r")]) == 2
    assert (
        f"--node-order id: --dataset {parts} is split already (its parts "
        "numbered rcm)" in capsys.readouterr().err
    )
    assert not (tmp_path / "r").exists()


def test_a_minibatch_runs_default_folder_is_not_named_after_an_exchange(
    tmp_path, monkeypatch
) -> None:
    """It was runs/train-sage-g3-*: mini-batch runs have no exchange."""
    import graphwire.run.start as start

    folders = []
    monkeypatch.setattr(
        start, "_run_distributed", lambda spec, mode, out: folders.append(out)
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


def test_under_torchrun_each_machines_first_worker_warns_of_cpu_sharing(
    monkeypatch,
) -> None:
    """Under torchrun the workers of this machine are its LOCAL_WORLD_SIZE,
    and only its first (LOCAL_RANK 0) says so, once for the machine."""
    import graphwire.run.start as start
    from graphwire.comm.context import WorkerContext

    monkeypatch.setattr(start, "usable_cores", lambda: 2)

    def on(local_rank: int, local_world_size: int) -> WorkerContext:
        return WorkerContext(
            rank=2 + local_rank,
            world_size=8,
            local_rank=local_rank,
            master_addr="127.0.0.1",
            master_port=29500,
            backend="gloo",
            local_world_size=local_world_size,
        )

    said = start.oversubscribed(on(0, 4), 8)
    assert said is not None and said.startswith(
        "graphwire: warning: 4 workers on this machine's 2 cores:"
    )
    assert start.oversubscribed(on(1, 4), 8) is None  # the first worker says it
    assert start.oversubscribed(on(0, 2), 8) is None  # a core each
    assert start.oversubscribed(None, 2) is None  # --workers 2 on 2 cores
    assert "3 workers" in (start.oversubscribed(None, 3) or "")


def test_train_config_file_stands_in_for_flags(tmp_path, capsys) -> None:
    config = tmp_path / "run.yaml"
    config.write_text(f"dataset: '{SMALL}'\nmodel: sage\nepochs: 3\nquiet: true\n")
    out = tmp_path / "run"
    assert main(["train", "--config", str(config), "--out", str(out)]) == 0
    records = [json.loads(line) for line in (out / "metrics.jsonl").open()]
    assert records[0]["model"] == "sage" and records[0]["epochs"] == 3
    assert "epochs=3" in _last_line(capsys.readouterr().out)


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


def test_verify_is_refused_for_a_dataset_without_checksums(tmp_path, capsys) -> None:
    """Only a folder graphwire wrote stores its files' SHA-256; a generated
    graph has none to check, which is said before any work."""
    for workers in ("1", "2"):
        argv = ["train", "--dataset", TINY, "--verify", "--workers", workers]
        assert main([*argv, "--quiet", "--out", str(tmp_path / "run")]) == 2
        said = capsys.readouterr().err
        assert f"--verify: --dataset {TINY} is read by the synthetic loader" in said
        assert not (tmp_path / "run").exists()


@pytest.mark.parametrize(
    "how",
    [["--workers", "1"], ["--workers", "2"], ["--workers", "2", "--mode", "minibatch"]],
    ids=" ".join,
)
def test_verify_refuses_a_file_that_changed_after_it_was_written(
    tmp_path, capsys, how
) -> None:
    """A feature changed in place (size, dtype and shape kept) trained
    without a word; with --verify the run stops before training, naming the
    file (one process: the graph folder's; workers: rank 1's part)."""
    import numpy as np

    graph, parts = tmp_path / "g", tmp_path / "p"
    assert main(["data", "generate", "--dataset", TINY, "--out", str(graph)]) == 0
    argv = ["partition", "--dataset", str(graph), "--parts", "2", "--out", str(parts)]
    assert main(argv) == 0
    distributed = how[1] == "2"
    spoiled = (parts / "part_1" if distributed else graph) / "x.npy"
    data = bytearray(spoiled.read_bytes())
    data[-4:] = np.float32(0.5).tobytes()
    spoiled.write_bytes(bytes(data))
    capsys.readouterr()
    dataset = str(parts if distributed else graph)
    argv = ["train", "--dataset", dataset, "--epochs", "1", "--quiet", *how]
    assert main([*argv, "--verify", "--out", str(tmp_path / "run")]) == 2
    said = capsys.readouterr().err
    assert f"{spoiled}: checksum mismatch" in said, said
    if distributed:
        assert "the parts could not be loaded on rank 1: " in said
    else:  # unverified, it trains (the parts: test_agreed_parts)
        assert main([*argv, "--out", str(tmp_path / "plain")]) == 0
    assert not (tmp_path / "run" / "metrics.jsonl").exists()
