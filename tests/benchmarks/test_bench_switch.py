"""bench_switch: a run's figures from its records, the small memory, the
check lines beside the paper's, bad flags refused before any work, and the
quick run end to end on Cora."""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
import bench_switch  # noqa: E402
from switch_report import MIB, Result, Runs, print_checks, result_of  # noqa: E402


def _line(out: str, start: str) -> str:
    (found,) = [line for line in out.splitlines() if line.startswith(start)]
    return found


def _records(tmp_path: Path, switch: bool) -> None:
    """Two ranks, three epochs: 100 B of fwd.L1 rows each way per rank, bwd
    30 B sent and 50 B received by rank 0 (an early read), 10 B by rank 1."""
    records: list[dict] = [{"kind": "config"}]
    for epoch in range(3):
        by_rank = {
            "fwd.L1": {"sent": [100, 100], "recv": [100, 100]},
            "bwd.L1": {"sent": [30, 30], "recv": [50, 10]},
            "sync.grad": {"sent": [999, 999], "recv": [999, 999]},
            "other": {"sent": [7, 7], "recv": [7, 7]},
        }
        extra = {}
        if switch:
            core = {"pool_rows": {"7": 32}, "peak_slots": 20 + epoch, "raw": 3 * epoch}
            core |= {"mean_slots": 10.0 + epoch, "bypassed": 0}
            workers = [{"timeouts": epoch, "blocks": {"L1": 4}}, {"timeouts": 0}]
            extra = {"switch": {"up": [200, 300], "down": [250, 250]}}
            extra["switch"] |= {"core": core, "workers": workers}
        for rank in range(2):
            times = {"forward_s": 1.0, "backward_s": float(epoch), "sync_s": 0.5}
            records.append(
                {"kind": "epoch", "epoch": epoch, "rank": rank, "times": times}
                | {"comm": {"by_rank": by_rank}, "extra": extra}
            )
    (tmp_path / "metrics.jsonl").write_text("\n".join(map(json.dumps, records)))


def test_a_runs_figures_are_every_ranks_rows_both_ways(tmp_path) -> None:
    _records(tmp_path, switch=True)
    result = result_of({}, 9.0, tmp_path)
    assert (result.fwd_bytes, result.bwd_bytes, result.train_bytes) == (400, 120, 520)
    assert result.fwd_sent == {"fwd.L1": 200}
    assert result.link_bytes == 1000  # up + down, every byte
    assert result.pool_rows == {"7": 32} and result.blocks == {"L1": 4}
    assert (result.peak_slots, result.mean_slots, result.raw) == (22, 11.0, 3.0)
    assert result.timeouts == 3  # 0 + 1 + 2
    assert result.epoch_s == 3.0  # median of 2.5 and 3.5: epoch 0 (1.5) left out
    _records(tmp_path, switch=False)
    host = result_of({}, 9.0, tmp_path)
    assert host.link_bytes is None and host.pool_rows == {} and host.blocks == {}


def test_the_parts_give_halo_and_boundary_rows(tmp_path) -> None:
    # Row 5 is read by parts 0 and 2: counted twice in the halo, once as boundary.
    for part, halo in enumerate([[5, 9], [1], [5]]):
        (tmp_path / f"part_{part}").mkdir()
        np.save(tmp_path / f"part_{part}" / "halo_nid.npy", np.array(halo))
    assert bench_switch.parts_rows(tmp_path) == (4, 3)


def test_the_small_memory_holds_a_tenth_of_the_uploads_in_whole_rows() -> None:
    runs = Runs("cora", 3, halo_rows=433, boundary_rows=385)
    ul = Result(fwd_bytes=0, bwd_bytes=0, fwd_sent={"fwd.L1": 385 * 28})
    ul.pool_rows = {"7": 1 << 62}
    runs.results["Straw-UL"] = ul
    runs.size_small(10)
    assert runs.small is not None
    mib, rows = runs.small
    assert rows == 39 and int(mib * MIB) == 39 * 128  # 7 floats: one aggregator
    flags = bench_switch.variant_flags("Straw-small", mib, 10)
    assert flags[flags.index("--switch-mb") + 1] == repr(mib)
    assert flags[-4:] == ["--switch-order", "random", "--switch-timeout", "10"]
    gnn = bench_switch.variant_flags("SwitchGNN-10MB", None, 2.5)
    assert gnn[3:8] == [
        "10.0",
        "--switch-blocks",
        "multilevel",
        "--switch-order",
        "gamr",
    ]
    assert bench_switch.variant_flags("g3", None, 10) == ["--exchange", "g3"]
    with pytest.raises(bench_switch.RunFailed, match="no small memory"):
        bench_switch.variant_flags("SwitchGNN-small", None, 10)


def _result(fwd: float, bwd: float, **more: object) -> Result:
    return Result(fwd_bytes=fwd, bwd_bytes=bwd, fwd_sent={"fwd.L1": fwd / 2}, **more)


def test_the_check_lines_set_ours_beside_the_paper(capsys) -> None:
    runs = Runs("synthetic", 2, halo_rows=180, boundary_rows=100, small=(0.5, 40))
    runs.results = {
        "halo": _result(180 * 2 * 64, 10, epoch_s=2.0),
        "g3": _result(180 * 2 * 64, 10, epoch_s=1.0),
        # Up and down 100 rows each way of 16 floats, forward and backward.
        "Straw-UL": _result(200 * 64, 200 * 64, pool_rows={"16": 1 << 62}, epoch_s=3),
        "Straw-10MB": _result(1000, 1000),
        "SwitchGNN-10MB": _result(800, 700),
        "Straw-small": _result(1000, 1000, raw=50.0, peak_slots=40),
        "SwitchGNN-small": _result(500, 500, peak_slots=30, blocks={"L1": 7}),
    }
    runs.results["Straw-UL"].fwd_sent = {"fwd.L1": 100 * 64}
    runs.results["halo"].fwd_sent = {"fwd.L1": 180 * 64}
    print_checks("s, 2 workers", runs, timed=True)
    out = capsys.readouterr().out
    formula = _line(out, "formula [s, 2 workers] Straw-UL vs halo, fwd rows:")
    assert (
        "paper: 94% on Reddit at 128 parts; ours at 2 parts: 44.4% measured" in formula
    )
    assert "44.4% by the formula 1 - 1/mean|R(v)|, mean|R(v)| = 180 / 100" in formula
    assert "the runs moved 180 / 100" in formula
    versus = _line(out, "SwitchGNN vs Straw [s, 2 workers]")
    assert "10MB -25.0%, small 0.5 MiB -50.0%; paper (Fig. 18f" in versus
    overflow = _line(out, "overflow [s, 2 workers] at 0.5 MiB (40 pool rows)")
    assert "Straw raw 50 rows/ep (peak 40), SwitchGNN raw 0 (peak 30, blocks L1:7)" in (
        overflow
    )
    time = _line(out, "time [s, 2 workers]")
    assert "halo 2.000s (1.00x), g3 1.000s (0.50x), Straw-UL 3.000s (1.50x)" in time


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--workers", "1,4"], "--workers: expected distinct integers >= 2"),
        (["--graphs", "cora,pubmed"], "--graphs: expected synthetic, cora or both"),
        (["--only", "halo", "Straw-5MB"], "--only: no variant named ['Straw-5MB']"),
        (["--only", "halo", "Straw-small"], "the -small variants need Straw-UL"),
        (["--epochs", "1"], "--epochs: expected an integer >= 2, got 1"),
        (["--num-layers", "1"], "--num-layers: expected an integer >= 2, got 1"),
        (["--jobs", "0"], "--jobs: expected an integer >= 1, got 0"),
        (["--switch-timeout", "0"], "--switch-timeout: expected a number > 0"),
        (["--cora", "/nowhere/cora"], "--cora /nowhere/cora: no /nowhere/ind.cora.x"),
    ],
)
def test_bad_flag_is_refused_before_any_work(
    argv: list[str], message: str, capsys, monkeypatch
) -> None:
    def no_work(*args: object) -> int:
        raise AssertionError("the benchmark started")

    monkeypatch.setattr(bench_switch, "in_work_folder", no_work)
    with pytest.raises(SystemExit) as exit_:
        bench_switch.main(argv)
    assert exit_.value.code == 2
    assert message in capsys.readouterr().err


def _figures(line: str) -> list[float]:
    return [float(x) for x in re.findall(r"(-?[\d.]+)%", line)]


@pytest.mark.slow
def test_quick_run_on_cora_is_consistent(cora_dir, tmp_path, capsys) -> None:
    """Two runs on Cora at 3 workers, at once (about 10 s): Straw-UL moves
    fewer forward rows than halo, by what the formula says. (Overflow and
    blocks at a small memory: tests/fullgraph/test_switch.py; the lines that
    print them: test_the_check_lines_set_ours_beside_the_paper.)"""
    figures = tmp_path / "figures.json"
    argv = ["--quick", "--cora", str(cora_dir / "cora"), "--json", str(figures)]
    assert bench_switch.main(argv) == 0
    out = capsys.readouterr().out
    (runs,) = json.loads(figures.read_text())["runs"]
    results = runs["results"]
    assert set(results) == {"halo", "Straw-UL"}
    halo, ul = results["halo"], results["Straw-UL"]
    # Forward: Straw-UL's rows are fewer than halo's: Cora's 3 parts have
    # rows read by 2 others.
    assert ul["fwd_bytes"] < halo["fwd_bytes"]
    assert runs["boundary_rows"] < runs["halo_rows"]
    formula = _line(out, "formula [cora, 3 workers, unshaped] Straw-UL vs halo")
    measured, predicted = _figures(formula)[1:3]
    assert measured == predicted > 0
    assert all(r["timeouts"] == 0 for r in results.values())
