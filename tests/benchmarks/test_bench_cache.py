"""bench_cache's report: one line per cache share beside on-demand, a PNG of
both curves, and bad flags refused before any work."""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
import bench_cache  # noqa: E402
import bench_minibatch  # noqa: E402


def _result(**figures: float) -> bench_minibatch.Result:
    zero = {f.name: 0 for f in dataclasses.fields(bench_minibatch.Result)}
    return bench_minibatch.Result(**{**zero, **figures})


def test_each_share_is_set_beside_on_demand_and_drawn(tmp_path, capsys) -> None:
    base = {"compute_s": 2.0, "peak_rss_mb": 1000.0, "outside_s": 10.0}
    costs = {"compute_s": 2.2, "peak_rss_mb": 1250.0, "outside_s": 15.0}
    results = {
        "on-demand": _result(seeds_per_s=100, remote_rows=1000, **base),
        "rapid 0": _result(seeds_per_s=90, remote_rows=1000),
        "rapid 0.25": _result(
            seeds_per_s=250, remote_rows=360, cache_hit_rate=0.6, **costs
        ),
        "rapid 1": _result(seeds_per_s=300, remote_rows=150, cache_hit_rate=1.0),
    }
    rows = bench_cache._table(results, None)  # type: ignore[arg-type]
    lines = capsys.readouterr().out.splitlines()
    quarter = next(line for line in lines if line.startswith("rapid 0.25"))
    assert quarter.split()[2:7] == ["0.25", "250", "2.50x", "360", "64.0%"]
    # fwd+bwd, RSS and start against on-demand's
    assert quarter.split()[-5:] == ["1.10x", "1250", "1.25x", "15.0", "1.50x"]
    assert [r["share"] for r in rows[1:]] == [0.0, 0.25, 1.0]
    plot = tmp_path / "cache.png"
    bench_cache._plot(rows, str(plot), "title")
    assert plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert [p.name for p in tmp_path.iterdir()] == ["cache.png"]


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--shares", "0,x"], "--shares: expected numbers separated by commas"),
        (["--shares", "0,1.5"], "--shares: each must be in [0, 1]"),
        (["--workers", "1"], "--workers: expected an integer >= 2, got 1"),
        (["--plot", "."], "--plot .: is a folder"),
    ],
)
def test_bad_flag_is_refused_before_any_work(
    argv: list[str], message: str, capsys, monkeypatch
) -> None:
    def no_work(*args: object) -> int:
        raise AssertionError("the benchmark started")

    monkeypatch.setattr(bench_cache, "in_work_folder", no_work)
    with pytest.raises(SystemExit) as exit_:
        bench_cache.main(argv)
    assert exit_.value.code == 2
    assert message in capsys.readouterr().err
