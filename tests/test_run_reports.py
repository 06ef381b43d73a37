"""The end-of-run report of a distributed run: its time tables and summary
count the epochs the run trained, not those a resume restored."""

from __future__ import annotations

from typing import Any

from graphwire.run import summary as run_summary
from graphwire.run import tables
from graphwire.run.job import RankReport


def _report(rank: int, records: list[dict[str, Any]], first_epoch: int) -> RankReport:
    return RankReport(
        rank=rank,
        records=records,
        ledger={"sent": [], "recv": []},
        counters={"store": {}},
        num_owned=10,
        num_halo=5,
        test_acc=0.5,
        val_acc=0.5,
        best_epoch=0,
        epochs_run=len(records),
        seconds=1.0,
        first_epoch=first_epoch,
    )


def _lines(out: str) -> list[str]:
    return [" ".join(line.strip("│ ").split()) for line in out.splitlines()]


def _full_graph(epoch: int, seconds: float) -> dict[str, Any]:
    times = {"forward_s": seconds, "backward_s": seconds, "sync_s": 0.0}
    return {"epoch": epoch, "times": times | {"comm_s": 0.0, "eval_s": 0.0}}


def test_a_resumed_full_graph_run_times_only_the_epochs_it_trained(capsys) -> None:
    """Resumed at epoch 2: epochs 0-1 (10 s each, timed by the run it
    resumed) were summed into the time split and ``epoch_s_median`` beside
    epochs 2-3 (1 s each), under the title "all epochs"."""
    records = [_full_graph(e, 5.0 if e < 2 else 0.5) for e in range(4)]
    reports = [_report(0, records, first_epoch=2)]
    tables._fullgraph_time_split(reports)
    lines = _lines(capsys.readouterr().out)
    assert "time split per rank (epochs 2-3, resumed, seconds)" in lines
    assert "0 │ 10 │ 5 │ 2 │ 0 │ 0 │ 0" in lines
    summary = run_summary.fullgraph_summary(reports, {"bytes_sent": 0, "bytes_recv": 0})
    assert summary["epoch_s_median"] == 1.0 and summary["resumed_at"] == 2
    reports[0].first_epoch = 0  # not resumed: every epoch is its own
    tables._fullgraph_time_split(reports)
    lines = _lines(capsys.readouterr().out)
    assert "time split per rank (4 epochs, seconds)" in lines
    assert "0 │ 10 │ 5 │ 22 │ 0 │ 0 │ 0" in lines


def _mini_batch(epoch: int, seconds: float, seeds: int) -> dict[str, Any]:
    names = ("sample_s", "fetch_s", "wait_s", "forward_s", "backward_s")
    times = dict.fromkeys(names, seconds) | {"sync_s": 0.0, "eval_s": 0.0}
    extra = {"seeds": seeds, "train_s": seconds, "cache_hits": 0, "missed_rows": 0}
    return {"epoch": epoch, "times": times, "extra": extra}


def test_a_resumed_mini_batch_run_times_only_the_epochs_it_trained(capsys) -> None:
    """Resumed at epoch 1: epoch 0 (timed by the run it resumed, 100 seeds
    in 10 s) was counted in the time table and in the median rate."""
    records = [_mini_batch(0, 10.0, 100), _mini_batch(1, 1.0, 100)]
    reports = [_report(0, records, first_epoch=1)]
    tables._minibatch_time_split(reports)
    lines = _lines(capsys.readouterr().out)
    assert any(
        line.startswith("time split per rank (epochs 1-1, resumed,") for line in lines
    )
    assert "0 │ 100 │ 1 │ 1 │ 1 │ 2 │ 0 │ 0" in lines
    summary = run_summary.minibatch_summary(reports)
    assert summary["seeds_per_s"] == 100.0 and summary["epoch_s_median"] == 1.0


def test_the_first_epoch_is_reported_alone_not_in_the_medians() -> None:
    """The first epoch pays the start-up: ``first_epoch_s`` gives it, and
    ``epoch_s_median`` and ``seeds_per_s`` are over the later epochs (of a
    one-epoch run, that epoch's), in both modes."""
    slow_first = [(0, 9.0), (1, 1.0), (2, 2.0), (3, 1.0)]
    ranks = [
        _report(rank, [_mini_batch(e, s, 100) for e, s in slow_first], 0)
        for rank in range(2)
    ]
    summary = run_summary.minibatch_summary(ranks)
    assert summary["first_epoch_s"] == 9.0 and summary["epoch_s_median"] == 1.0
    assert summary["seeds_per_s"] == 200.0  # 2 ranks x 100 seeds / 1 s
    full = [_report(0, [_full_graph(e, s / 2) for e, s in slow_first], 0)]
    summary = run_summary.fullgraph_summary(full, {"bytes_sent": 0, "bytes_recv": 0})
    assert (summary["first_epoch_s"], summary["epoch_s_median"]) == (9.0, 1.0)
    one = run_summary.minibatch_summary([_report(0, [_mini_batch(0, 4.0, 100)], 0)])
    assert (one["first_epoch_s"], one["epoch_s_median"], one["seeds_per_s"]) == (
        4.0,
        4.0,
        25.0,
    )
