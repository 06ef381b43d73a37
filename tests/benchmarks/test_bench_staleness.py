"""bench_staleness's report: bytes and accuracy against CAGNET, time ratios
paired by round, the issue's check lines, and bad flags refused before any
work."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
import bench_staleness  # noqa: E402
from bench_staleness import MIB, Result  # noqa: E402


def _line(out: str, start: str) -> str:
    (found,) = [line for line in out.splitlines() if line.startswith(start)]
    return found


def _run(fwd: float, bwd: float, acc: float, **more: object) -> Result:
    """A 4-epoch run sending ``fwd`` and ``bwd`` MiB per epoch."""
    figures: dict = {"test_acc": acc, "last_acc": acc, "curve": [0.1, 0.5, acc, acc]}
    figures |= {"fwd_epochs": [int(fwd * MIB)] * 4, "bwd_epochs": [int(bwd * MIB)] * 4}
    figures |= more
    return Result(train_bytes=(fwd + bwd) * MIB, fwd_bytes=fwd * MIB, **figures)


def test_each_variant_is_set_beside_cagnet(capsys) -> None:
    timed = {"timed": True}
    runs = {
        "CAGNET": [_run(4, 4, 0.80, epoch_s=2.0, **timed)]
        + [_run(4, 4, 0.10, epoch_s=2.5, round_index=1, **timed)],
        "SCS-E1": [_run(2, 4, 0.798, cache_mib=1.5, epoch_s=1.5, **timed)]
        + [_run(2, 4, 0.10, epoch_s=2.0, round_index=1, **timed)],
        "SkipG-1": [_run(4, 2, 0.79, curve=[0.1, 0.2, 0.3, 0.79])],
    }
    rows = bench_staleness._table("label", runs, {"g3": "boom\nlast line"})
    out = capsys.readouterr().out
    assert "target of `to tgt`: test acc 0.7900 (CAGNET's test acc - 1 pt)" in out
    e1 = _line(out, "SCS-E1").split()
    # 6 of 8 MiB: 25% fewer; broadcasts 2 of 4: 50% fewer; reached 0.79 in 3
    assert e1[1:5] == ["6.000", "25.0%", "2.000", "50.0%"]
    assert e1[8:10] == ["3.0", "1.500"]
    # time: 1.5 / 2.0 and 2.0 / 2.5 per round, median 0.775
    assert e1[10:13] == ["1.750", "0.775x", "0.000"]
    assert "SCS-E1 x CAGNET per round: 0.75 0.80" in out
    skipg = _line(out, "SkipG-1").split()
    assert skipg[8] == "4.0" and skipg[10:] == ["-", "-", "-"]
    assert rows["SkipG-1"].train_cut == pytest.approx(0.25)
    assert rows["SkipG-1"].fwd_cut == 0.0


def test_a_variant_that_never_reaches_the_target_and_a_failed_one(capsys) -> None:
    runs = {
        "CAGNET": [_run(4, 4, 0.80)],
        "SCS-E3": [_run(1, 4, 0.70)],
        "g3+E1": [],
    }
    bench_staleness._table("label", runs, {"g3+E1": "`train ...` exited 2:\nerr: no"})
    out = capsys.readouterr().out
    assert _line(out, "SCS-E3").split()[8] == "-"
    assert _line(out, "g3+E1") == "g3+E1    FAILED: err: no"


def _rows(**runs: list[Result]) -> dict[str, bench_staleness.Row]:
    rows, _ = bench_staleness._rows(runs)
    return rows


def test_the_broadcast_check_takes_the_largest_cut_within_half_a_point(
    capsys,
) -> None:
    rows = _rows(
        CAGNET=[_run(4, 4, 0.800)],
        **{"SCS-E1": [_run(2, 4, 0.797)], "SCS-E2": [_run(1.2, 4, 0.796)]},
        **{"SCS-E3": [_run(1, 4, 0.790)], "SCS-H1": [_run(3, 4, 0.80)]},
    )
    bench_staleness._check_broadcast_cut("cora, 4 workers", rows)
    line = capsys.readouterr().out.strip()
    assert line.startswith("check [cora, 4 workers] SCS cuts broadcast bytes >= 35%")
    assert "SCS-E2 fwd -70.0%, test 0.7960 vs 0.8000 (-0.40 pt;" in line
    assert line.endswith("2 of 4 SCS variants meet both  MET")
    # Every cutting variant 0.6 point below: the best of them, NOT MET.
    rows = _rows(CAGNET=[_run(4, 4, 0.8)], **{"SCS-E1": [_run(2, 4, 0.794)]})
    bench_staleness._check_broadcast_cut("x", rows)
    line = capsys.readouterr().out.strip()
    assert "SCS-E1 fwd -50.0%, test 0.7940 vs 0.8000 (-0.60 pt;" in line
    assert line.endswith("0 of 1 SCS variants meet both  NOT MET")


def test_skipg_is_held_against_scs_at_a_similar_cut(capsys) -> None:
    rows = _rows(
        CAGNET=[_run(4, 4, 0.80)],
        **{"SkipG-1": [_run(4, 2, 0.78)], "SCS-E1": [_run(2, 4, 0.795)]},
        **{"SCS-H3": [_run(3.6, 4, 0.80)]},  # cuts 5%: not similar
    )
    bench_staleness._check_skipg("s", rows)
    line = capsys.readouterr().out.strip()
    assert "SkipG-1 train bytes -25.0%, loses 2.00 pt (0.7800)" in line
    assert "best SCS cutting >= 15.0%: SCS-E1 -25.0%, loses 0.50 pt" in line
    assert line.endswith("  MET")
    # Cora: gradients dwarf the broadcasts, no SCS cuts as much as SkipG.
    rows = _rows(
        CAGNET=[_run(1, 6, 0.80)],
        **{"SkipG-1": [_run(1, 3, 0.80)], "SCS-E1": [_run(0.5, 6, 0.79)]},
    )
    bench_staleness._check_skipg("cora", rows)
    line = capsys.readouterr().out.strip()
    assert "no SCS cuts within 10% of it; the nearest: SCS-E1 -7.1%" in line
    assert line.endswith("NOT MET")


def test_g3_staleness_check_counts_the_worst_epoch(capsys) -> None:
    base = _run(4, 4, 0.80)
    stale = _run(2, 4, 0.799)
    stale.bwd_epochs[2] += 10  # one epoch's gradients above g3's
    runs = {"g3": [base], "g3+E1": [stale], "g3+A1": []}
    rows, _ = bench_staleness._rows(runs)
    failures = {"g3+A1": "`train` exited 2:\nerror: --staleness: only with broadcast"}
    bench_staleness._check_g3("s", rows, runs, failures)
    out = capsys.readouterr().out
    e1 = _line(out, "check [s] g3+E1")
    assert "train 6.000 vs 8.000 MiB/ep (-25.0%), test 0.7990 vs 0.8000" in e1
    assert e1.endswith("at most 10 B  NOT MET")
    a1 = _line(out, "check [s] g3+A1")
    assert a1.endswith("n/a (g3+A1 failed: error: --staleness: only with broadcast)")
    stale.bwd_epochs[2] -= 10
    bench_staleness._check_g3("s", rows, {"g3": [base], "g3+E1": [stale]}, {})
    assert capsys.readouterr().out.strip().endswith("at most 0 B  MET")


def test_a_runs_figures_come_from_every_ranks_training_tags(tmp_path) -> None:
    """Training tags summed over ranks (eval.* and sync.metrics left out),
    the largest rank's cache, and rank 0's epoch averaged over epochs 1..."""
    records = [{"kind": "config"}]
    tags = {"fwd.L1": 100, "bwd.L1": 50, "flags.L1": 2, "sync.grad": 10}
    tags |= {"eval.fwd.L1": 999, "sync.metrics": 7}
    for epoch in range(3):
        for rank in range(2):
            times = {"forward_s": 1.0, "backward_s": epoch, "sync_s": 0.5}
            stale = {"cache_bytes": [MIB * (rank + 1), 0]}
            records.append(
                {"kind": "epoch", "epoch": epoch, "rank": rank, "times": times}
                | {"test_acc": 0.1 * epoch, "comm": {"by_tag": tags}}
                | {"extra": {"staleness": stale}}
            )
    (tmp_path / "metrics.jsonl").write_text("\n".join(map(json.dumps, records)))
    summary = {"test_acc": "0.2", "best_epoch": "2", "epoch_s_median": "2.5"}
    result = bench_staleness._result(summary, 9.0, tmp_path)
    assert result.train_bytes == 2 * 162 and result.fwd_bytes == 200
    assert result.fwd_epochs == [200] * 3 and result.bwd_epochs == [100] * 3
    assert result.cache_mib == 2.0
    assert result.epoch_s == 3.0  # (2.5 + 3.5) / 2: epoch 0 left out
    assert result.curve == [0.0, 0.1, 0.2] and result.last_acc == 0.2


def test_timed_runs_are_two_workers_and_the_rounds_alternate() -> None:
    args = argparse.Namespace(
        workers=[2, 4], graphs=["synthetic", "cora"], seeds=[0], rounds=3,
        only=["CAGNET", "SCS-E1"], epochs=25, cora_epochs=100,
    )  # fmt: skip
    shaped, plain = bench_staleness._jobs(args)
    assert {j.workers for j in shaped} == {2} and {j.workers for j in plain} == {4}
    timing = [(j.round_index, j.variant, j.epochs) for j in shaped if j.round_index]
    assert timing == [
        (1, "SCS-E1", 13),
        (1, "CAGNET", 13),
        (2, "CAGNET", 13),
        (2, "SCS-E1", 13),
    ]
    assert {j.graph for j in shaped if j.round_index} == {"synthetic"}
    assert [j.epochs for j in plain] == [25, 25, 100, 100]


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--workers", "1,4"], "--workers: expected distinct integers >= 2"),
        (["--workers", "2,x"], "--workers: expected ints separated by commas"),
        (["--graphs", "cora,pubmed"], "--graphs: expected synthetic, cora or both"),
        (["--only", "CAGNET", "SCS-E9"], "--only: no variant named ['SCS-E9']"),
        (["--seeds", "-1"], "--seeds: expected integers >= 0"),
        (["--quick", "--epochs", "1"], "--epochs: expected an integer >= 2, got 1"),
        (["--rounds", "0"], "--rounds: expected an integer >= 1, got 0"),
        (["--dropout", "1"], "--dropout: expected a number in [0, 1), got 1.0"),
        (["--rate-mbit", "0"], "--rate-mbit: expected a number > 0, got 0.0"),
        (["--cora", "/nowhere/cora"], "--cora /nowhere/cora: no /nowhere/ind.cora.x"),
    ],
)
def test_bad_flag_is_refused_before_any_work(
    argv: list[str], message: str, capsys, monkeypatch
) -> None:
    def no_work(*args: object) -> int:
        raise AssertionError("the benchmark started")

    monkeypatch.setattr(bench_staleness, "in_work_folder", no_work)
    with pytest.raises(SystemExit) as exit_:
        bench_staleness.main(argv)
    assert exit_.value.code == 2
    assert message in capsys.readouterr().err


def test_quick_runs_a_few_variants_on_the_small_graph(monkeypatch) -> None:
    seen: list[argparse.Namespace] = []
    monkeypatch.setattr(bench_staleness, "netns_available", lambda: (True, ""))
    monkeypatch.setattr(
        bench_staleness, "in_work_folder", lambda _p, args, _b: seen.append(args) or 0
    )
    assert bench_staleness.main(["--quick"]) == 0
    assert bench_staleness.main(["--only", "g3", "g3+A1"]) == 0
    quick, full = seen
    assert (quick.nodes, quick.epochs, quick.rounds, quick.graphs) == (
        20_000,
        5,
        1,
        ["synthetic"],
    )
    assert quick.only == list(bench_staleness.QUICK_VARIANTS)
    assert (full.nodes, full.epochs, full.cora_epochs, full.graphs) == (
        200_000,
        25,
        100,
        ["synthetic", "cora"],
    )
    assert full.only == ["g3", "g3+A1"] and full.workers == [2, 4]


def test_checks_of_variants_not_run_print_nothing_or_say_what_is_missing(
    capsys,
) -> None:
    rows = _rows(g3=[_run(4, 4, 0.8)], **{"g3+E1": [_run(2, 4, 0.8)]})
    bench_staleness._check_broadcast_cut("s", rows)
    bench_staleness._check_skipg("s", rows)
    assert capsys.readouterr().out == ""
    bench_staleness._check_broadcast_cut("s", _rows(**{"SCS-E1": [_run(2, 4, 0.8)]}))
    assert capsys.readouterr().out.strip().endswith("n/a (needs CAGNET)")
