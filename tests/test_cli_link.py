"""`graphwire train --task link`: what a link-prediction run prints and writes.

- one process and two workers (bytegnn schedule) print AUC, MRR and
  Hits@K of the best epoch in the summary; the workers' parts hold the
  training edges only, the held-out pairs beside them;
- a graph without enough edges to hold out, or parts split without
  held-out pairs, is refused in one line naming it.
"""

from __future__ import annotations

import json

import numpy as np

from graphwire.cli import main
from graphwire.partition.format import load_partition_meta
from tests.cli_helpers import TINY

LINK = ["--mode", "minibatch", "--task", "link", "--quiet", "--fanouts", "3,4"]


def _summary(text: str) -> dict[str, str]:
    line = text.strip().splitlines()[-1]
    assert line.startswith("summary ")
    return dict(pair.split("=") for pair in line.split()[1:])


def test_one_process_and_two_workers_report_held_out_metrics(tmp_path, capsys) -> None:
    for name, extra in (
        ("one", []),
        (
            "two",
            ["--workers", "2", "--schedule", "bytegnn", "--partition", "blocks"]
            + ["--val-edges", "0.1", "--test-edges", "0.2", "--eval-negatives", "7"],
        ),
    ):
        out = tmp_path / name
        argv = ["train", "--dataset", TINY, *LINK, "--epochs", "2", *extra]
        assert main([*argv, "--out", str(out)]) == 0
        fields = _summary(capsys.readouterr().out)
        for key in ("test_auc", "test_mrr", "test_hits@1", "test_hits@10", "val_auc"):
            assert 0.0 <= float(fields[key]) <= 1.0, key
        assert "test_acc" not in fields
        records = [json.loads(line) for line in (out / "metrics.jsonl").open()]
        assert records[0]["task"] == "link" and records[0]["decoder"] == "dot"
        epochs = [r for r in records if r["kind"] == "epoch"]
        assert {"val_auc", "test_mrr"} <= set(epochs[-1]["extra"]["link"])
    parts = tmp_path / "two" / "partitions"
    meta = load_partition_meta(parts)
    assert meta["task"] == "link"
    with np.load(parts / "held_out.npz") as held:
        val, test = held["val_src"].size, held["test_src"].size
        assert held["test_neg"].shape == (test, 7)
    # 10% + 20% of the undirected edges are not among the parts' edges
    pairs = _edges(tmp_path) // 2  # the synthetic graph is symmetric
    assert (val, test) == (int(0.1 * pairs), int(0.2 * pairs))
    assert meta["num_edges"] + 2 * (val + test) == 2 * pairs


def _edges(tmp_path) -> int:
    from graphwire.graph.datasets import load_dataset

    return load_dataset(TINY).num_edges


def test_too_few_edges_and_parts_without_pairs_are_one_line(tmp_path, capsys) -> None:
    sparse = "synthetic:products?nodes=12&degree=1&features=3&classes=2&seed=1"
    argv = ["train", "--dataset", sparse, *LINK, "--out", str(tmp_path / "a")]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    assert "--task link: graph" in err and "undirected edges; holding out 5%" in err
    assert not (tmp_path / "a").exists()  # refused before anything is written
    parts = tmp_path / "parts"
    assert (
        main(["partition", "--dataset", TINY, "--parts", "2", "--out", str(parts)]) == 0
    )
    capsys.readouterr()
    argv = ["train", "--dataset", str(parts), *LINK, "--workers", "2"]
    assert main([*argv, "--out", str(tmp_path / "b")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "is split without held-out edges" in err
