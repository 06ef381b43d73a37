"""bench_dgs's report: each sampler's bytes and accuracy against uniform
sampling on the same parts, with the paper's figures; bad flags refused
before any work."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
import bench_dgs  # noqa: E402


def _figures(feature: float, sync: float, best: float) -> dict[str, float]:
    return {
        "feature_mib": feature,
        "sync_mib": sync,
        "setup_mib": 1.0,
        "fixed_acc": best - 0.1,
        "best_acc": best,
        "tail_acc": best - 0.01,
        "explain_share": 0.05,
        "dims_share": 0.85,
    }


def test_the_report_compares_every_sampler_with_uniform_on_its_parts(capsys) -> None:
    args = argparse.Namespace(
        datasets=["products"],
        methods=["metis", "random"],
        fetches=["uniform", "dgs"],
        layer_nodes=[1024],
    )
    results = {
        "products metis uniform": _figures(100.0, 0.0, 0.80),
        "products metis dgs": _figures(70.0, 2.0, 0.81),
        "products random uniform": _figures(200.0, 0.0, 0.78),
        "products random dgs": None,  # a failed run
    }
    ratios = bench_dgs._report(args, results)
    assert ratios["products metis dgs"]["bytes_vs_uniform"] == pytest.approx(-0.28)
    assert ratios["products metis dgs"]["acc_points"] == pytest.approx(1.0)
    assert ratios["products metis dgs"]["tail_points"] == pytest.approx(1.0)
    assert ratios["products random uniform"]["bytes_vs_uniform"] == 0.0
    out = capsys.readouterr().out
    assert "products random dgs                FAILED" in out
    assert "-28.0%" in out and "-24.55% (products)" in out


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--fetches", "uniform,magic"], "--fetches: unknown ['magic']"),
        (["--fetches", "dgs"], "--fetches: the ratios need uniform"),
        (["--datasets", "reddit"], "--datasets: unknown ['reddit']"),
        (["--epochs", "0"], "--epochs: expected >= 1"),
        (["--layer-nodes", "512,512"], "--layer-nodes: expected distinct integers"),
    ],
)
def test_bad_flags_are_refused_before_any_work(argv, message, capsys) -> None:
    with pytest.raises(SystemExit):
        bench_dgs.main(argv)
    assert message in capsys.readouterr().err


def test_layer_wise_samplers_run_once_per_layer_size() -> None:
    args = argparse.Namespace(fetches=["uniform", "ladies"], layer_nodes=[512, 4096])
    assert bench_dgs._runs(args) == [
        ("uniform", "uniform", None),
        ("ladies@512", "ladies", 512),
        ("ladies@4096", "ladies", 4096),
    ]
    args.layer_nodes = [512]
    assert bench_dgs._runs(args)[1] == ("ladies", "ladies", 512)


def test_the_speed_split_is_the_median_epoch_after_the_first(tmp_path) -> None:
    lines = []
    for rank in (0, 1):
        for epoch, (time, wait) in enumerate([(9.0, 5.0), (10.0, 1.0), (12.0, 3.0)]):
            times = {"forward_s": 0.5, "backward_s": 0.25, "sync_s": 0.1}
            extra = {"sample_busy_s": 1.0 + rank, "dgs": {"explain_cpu_s": 0.2}}
            record = {"kind": "epoch", "rank": rank, "epoch": epoch, "time": time}
            times["wait_s"] = wait
            lines.append(json.dumps(record | {"times": times, "extra": extra}))
    (tmp_path / "metrics.jsonl").write_text("\n".join(lines) + "\n")
    split = bench_dgs._split(tmp_path)
    assert split["epoch"] == pytest.approx(1.5)  # median of 1 and 2 s
    assert split["wait"] == pytest.approx(2.0)  # epochs 1 and 2, not 0's 5
    assert split["train"] == pytest.approx(0.75)
    assert split["sample busy"] == pytest.approx(1.5)  # the ranks' mean
    assert split["explain cpu"] == pytest.approx(0.2)
    assert split["fetch busy"] == 0.0
