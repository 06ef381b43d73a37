"""bench_minibatch's report: each ratio line quotes RapidGNN's claim for the
partitioner it compares on, and bad flags are refused before any work."""

from __future__ import annotations

import dataclasses
import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
import bench_minibatch  # noqa: E402


def _result(**figures: float) -> bench_minibatch.Result:
    zero = {f.name: 0 for f in dataclasses.fields(bench_minibatch.Result)}
    return bench_minibatch.Result(**{**zero, **figures})


def test_ratio_lines_quote_the_claim_for_their_partitioner(capsys) -> None:
    results = {}
    for method in ("metis", "random"):
        results[f"on-demand ({method})"] = [
            _result(remote_rows=100, remote_mib=4, fetch_s=1, seeds_per_s=10)
        ]
        results[f"rapid ({method})"] = [
            _result(remote_rows=20, remote_mib=1, wait_s=0.5, seeds_per_s=20)
        ]
    ratios = bench_minibatch._ratios(results, {}, ["metis", "random"])
    lines = {
        line.split("  ")[0].strip(): line
        for line in capsys.readouterr().out.splitlines()
    }
    step = "seeds/s rapid / on-demand ({})"
    assert "2.46x step time over DGL-METIS" in lines[step.format("metis")]
    assert "2.26x step time over DGL-Random" in lines[step.format("random")]
    network = "fetch s on-demand / fetch+wait s rapid ({})"
    assert "network time 12.70x over DGL-METIS" in lines[network.format("metis")]
    assert "network time 9.70x over DGL-Random" in lines[network.format("random")]
    assert "Fig. 4" in lines["remote bytes on-demand / rapid (metis)"]
    assert ratios["seeds/s rapid / on-demand (random)"] == pytest.approx(2.0)
    assert ratios["remote rows on-demand / rapid (metis)"] == pytest.approx(5.0)


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--fanouts", "a,b"], "--fanouts: expected integers separated by commas"),
        (["--fanouts", "0,5"], "--fanouts: each must be >= 1 or -1 (all)"),
        (["--sampler-batches", "0"], "--sampler-batches: expected an integer >= 1"),
        (["--rate-mbit", "-1"], "or 0 for an unshaped link, got -1.0"),
        (["--rate-mbit", "0.0004"], "--rate-mbit: expected a number >= 0.001"),
        (["--workers", "1"], "--workers: expected an integer >= 2, got 1"),
        (["--methods", "metis,metis"], "--methods: each at most once, got metis,m"),
    ],
)
def test_bad_flag_is_refused_before_any_work(
    argv: list[str], message: str, capsys, monkeypatch
) -> None:
    def no_work(*args: object) -> int:
        raise AssertionError("the benchmark started")

    monkeypatch.setattr(bench_minibatch, "in_work_folder", no_work)
    with pytest.raises(SystemExit) as exit_:
        bench_minibatch.main(argv)
    assert exit_.value.code == 2
    assert message in capsys.readouterr().err


def test_a_json_path_that_cannot_be_written_is_refused_before_any_work(
    tmp_path, capsys, monkeypatch
) -> None:
    """--json was written only after the runs, and a path it could not take
    ended there in a FileNotFoundError traceback (its ``.x.json.tmp``)."""
    (tmp_path / "file").touch()
    monkeypatch.setattr(bench_minibatch, "in_work_folder", lambda *_: 0)
    for path in (tmp_path / "file" / "x.json", tmp_path):
        with pytest.raises(SystemExit) as exit_:
            bench_minibatch.main(["--json", str(path)])
        assert exit_.value.code == 2
        assert f"error: --json {path}: is " in capsys.readouterr().err


def test_json_figures_are_written_with_their_folder(tmp_path) -> None:
    bench_minibatch.write_figures(str(tmp_path / "new" / "x.json"), {"a": [1.5]})
    assert json.loads((tmp_path / "new" / "x.json").read_text()) == {"a": [1.5]}
    assert [p.name for p in (tmp_path / "new").iterdir()] == ["x.json"]
