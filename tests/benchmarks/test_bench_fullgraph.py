"""bench_fullgraph's flags: a bad value is refused before any work, naming
the flag, and --quick leaves the sizes the command line gives."""

from __future__ import annotations

import argparse
import dataclasses
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
import bench_fullgraph  # noqa: E402
import shaped_bench  # noqa: E402


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--rate-mbit", "0"], "--rate-mbit: expected a number > 0, got 0.0"),
        (["--workers", "1"], "--workers: expected an integer >= 2, got 1"),
        (["--rounds", "0"], "--rounds: expected an integer >= 1, got 0"),
        (["--nodes", "-5"], "--nodes: expected an integer >= 100, got -5"),
        (["--quick", "--epochs", "1"], "--epochs: expected an integer >= 2, got 1"),
        (["--rate-mbit", "0.0004"], "--rate-mbit: expected >= 0.001"),
        (["--collective-timeout", "2e9"], "--collective-timeout: expected <= 1e+09"),
        (["--run-timeout", "nan"], "--run-timeout: expected a number > 0, got nan"),
    ],
)
def test_bad_flag_is_refused_before_any_work(
    argv: list[str], message: str, capsys, monkeypatch
) -> None:
    def no_work(*args: object) -> int:
        raise AssertionError("the benchmark started")

    monkeypatch.setattr(bench_fullgraph, "in_work_folder", no_work)
    with pytest.raises(SystemExit) as exit_:
        bench_fullgraph.main(argv)
    assert exit_.value.code == 2
    assert message in capsys.readouterr().err


def test_quick_keeps_the_sizes_given(monkeypatch) -> None:
    seen: list[argparse.Namespace] = []
    monkeypatch.setattr(bench_fullgraph, "netns_available", lambda: (True, ""))
    monkeypatch.setattr(
        bench_fullgraph, "in_work_folder", lambda _p, args, _b: seen.append(args) or 0
    )
    assert bench_fullgraph.main(["--quick", "--epochs", "5"]) == 0
    assert (seen[0].nodes, seen[0].epochs, seen[0].rounds) == (20_000, 5, 1)
    assert bench_fullgraph.main([]) == 0
    assert (seen[1].nodes, seen[1].epochs, seen[1].rounds) == (200_000, 6, 2)


@pytest.mark.parametrize("order", ["rcm", "id"])
def test_node_order_reaches_the_parts_and_the_one_process_runs(
    monkeypatch, tmp_path, order: str
) -> None:
    seen: list[argparse.Namespace] = []
    monkeypatch.setattr(bench_fullgraph, "netns_available", lambda: (True, ""))
    monkeypatch.setattr(
        bench_fullgraph, "in_work_folder", lambda _p, args, _b: seen.append(args) or 0
    )
    flags = [] if order == "rcm" else ["--node-order", order]  # rcm: the default
    assert bench_fullgraph.main(flags) == 0
    (args,) = seen
    assert args.node_order == order
    # The graph's one-process runs lay their rows out in that order; the
    # distributed ones read parts numbered so by `graphwire partition`.
    configs = {c.name: c.argv for c in bench_fullgraph._configs(args, tmp_path, [])}
    single = configs["single process"]
    assert single[single.index("--node-order") + 1] == order
    assert "--node-order" not in configs["g3 (metis)"]
    commands: list[list[str]] = []
    monkeypatch.setattr(
        shaped_bench, "cli", lambda argv, _timeout: commands.append(argv)
    )
    shaped_bench.prepare_graph(args, tmp_path, [("metis", 4, "parts-metis")])
    (partition,) = [c for c in commands if c[0] == "partition"]
    assert partition[partition.index("--node-order") + 1] == order


def _runs(epoch_s: float) -> list[bench_fullgraph.Result]:
    zero = {f.name: 0 for f in dataclasses.fields(bench_fullgraph.Result)}
    return [bench_fullgraph.Result(**{**zero, "epoch_s": epoch_s, "steady_s": 1})]


def test_ratio_lines_say_which_way_and_quote_the_paper(capsys) -> None:
    results = {
        "halo (metis)": _runs(2.0),
        "g3 (metis)": _runs(1.0),
        "g3 (locality)": _runs(0.8),
    }
    bench_fullgraph._print_ratios(results)
    out = capsys.readouterr().out
    assert "A / B: A's median epoch time over B's (below 1: A is faster)" in out
    (g3_halo,) = [line for line in out.splitlines() if line.startswith("g3 / halo")]
    assert " 0.50x " in g3_halo and g3_halo.endswith("MET")
    assert "paper, Fig. 11: G3 1.08-2.24x faster" in g3_halo
    (locality,) = [line for line in out.splitlines() if line.startswith("locality")]
    assert (
        " 0.80x " in locality
        and "paper, Fig. 16: G3's partition up to 4.3x" in locality
    )


def test_a_json_path_that_cannot_be_written_is_refused_before_any_work(
    tmp_path, capsys, monkeypatch
) -> None:
    """--json was written only after the runs (39 s and more), and a path
    it could not take ended there in a FileNotFoundError traceback."""
    (tmp_path / "file").touch()
    monkeypatch.setattr(bench_fullgraph, "netns_available", lambda: (True, ""))
    monkeypatch.setattr(bench_fullgraph, "in_work_folder", lambda *_: 0)
    for path, said in [
        (tmp_path / "file" / "x.json", f"is under {tmp_path / 'file'}, which is a"),
        (tmp_path, "is a folder, not a file"),
    ]:
        with pytest.raises(SystemExit) as exit_:
            bench_fullgraph.main(["--json", str(path)])
        assert exit_.value.code == 2
        assert f"error: --json {path}: {said}" in capsys.readouterr().err
    assert bench_fullgraph.main(["--json", str(tmp_path / "new" / "x.json")]) == 0


def test_ledger_over_qdisc_is_each_runs_own_ratio(capsys) -> None:
    """ledg/qd divided the median ledger bytes by the median qdisc bytes,
    which can come from different rounds: here 300 / 200 = 1.5, where the
    rounds' own ratios are 1, 1 and 2.5 (median 1)."""
    zero = {f.name: 0 for f in dataclasses.fields(bench_fullgraph.Result)}
    runs = [
        bench_fullgraph.Result(**{**zero, "bytes_sent": sent, "qdisc_bytes": qdisc})
        for sent, qdisc in ((100, 100), (300, 300), (500, 200))
    ]
    bench_fullgraph._print_table({"g3 (metis)": runs}, {}, epochs=2)
    (row,) = [line for line in capsys.readouterr().out.splitlines() if "g3" in line]
    assert row.split()[12] == "1.000"


def test_the_ceiling_is_two_copies_at_once_over_one_alone(capsys) -> None:
    """Two copies of the 1-worker run at once against one alone: 2 x (one's
    epoch time / each copy's), from the medians and round by round; a scaling
    target above it says so."""
    zero = {f.name: 0 for f in dataclasses.fields(bench_fullgraph.Result)}

    def run(epoch_s: float, round_index: int) -> bench_fullgraph.Result:
        fields = {"epoch_s": epoch_s, "steady_s": epoch_s, "round_index": round_index}
        return bench_fullgraph.Result(**{**zero, **fields})

    results = {
        "unshaped 1 worker": [run(1.0, 0), run(1.2, 1)],
        "unshaped 2 workers g3": [run(0.75, 0), run(0.75, 1)],
        bench_fullgraph.AT_ONCE: [run(1.4, 0), run(1.6, 0), run(1.6, 1), run(1.6, 1)],
    }
    bench_fullgraph._print_ratios(results)
    lines = capsys.readouterr().out.splitlines()
    (at,) = [i for i, line in enumerate(lines) if line.startswith("ceiling")]
    # medians: one alone 1.1, each copy 1.6 -> 2 x 1.1 / 1.6
    assert " 1.38x throughput " in lines[at]
    # round 0: 2 x 1.0 / mean(1.4, 1.6); round 1: 2 x 1.2 / 1.6
    assert "per round: 1.33 1.50 " in lines[at + 1]
    (g3,) = [line for line in lines if line.startswith("unshaped 2 workers g3")]
    assert " 1.47x throughput " in g3
    assert g3.endswith("NOT MET (the machine's own ceiling is below 1.6 too: 1.38x)")


def test_a_scaling_line_names_no_ceiling_without_its_runs(capsys) -> None:
    results = {"unshaped 1 worker": _runs(1.0), "unshaped 2 workers g3": _runs(0.5)}
    bench_fullgraph._print_ratios(results)
    out = capsys.readouterr().out
    assert "ceiling" not in out
    (g3,) = [line for line in out.splitlines() if line.startswith("unshaped 2")]
    assert g3.endswith("  MET")


def test_cpu_seconds_and_their_floor_come_from_every_ranks_records(
    tmp_path, monkeypatch, capsys
) -> None:
    """CPU s is every rank's ``extra.cpu_s`` summed per epoch, the median
    epoch's (epoch 0's set-up work left out as the epoch time's median
    leaves it); the floor spreads it over the CPUs the ranks can use: here 4
    ranks of 1 thread on 2 CPUs, then on 8 CPUs with 1 and 4 threads."""
    import json

    records = [{"kind": "config"}]
    for epoch in range(3):
        for rank in range(4):
            times = {"forward_s": 1.0, "backward_s": 1.0, "sync_s": 0.0}
            # 0.5 + 0.75 + 1.0 + 1.25 = 3.5 an epoch, but 11.5 in epoch 0
            extra = {"cpu_s": 0.5 + rank / 4 + (2.0 if epoch == 0 else 0.0)}
            records.append(
                {"kind": "epoch", "epoch": epoch, "rank": rank, "times": times}
                | {"extra": extra}
            )
    (tmp_path / "metrics.jsonl").write_text("\n".join(map(json.dumps, records)))
    summary = {"epoch_s_median": "2.0", "test_acc": "0.5", "bytes_sent": "8"}
    monkeypatch.setattr(bench_fullgraph, "usable_cores", lambda: 2)
    four = bench_fullgraph._result(summary, 9.0, tmp_path, 0)
    assert (four.cpu_s, four.floor_s) == (3.5, 1.75)
    monkeypatch.setattr(bench_fullgraph, "usable_cores", lambda: 8)
    assert (
        bench_fullgraph._result(summary, 9.0, tmp_path, 0, threads=1).floor_s == 3.5 / 4
    )
    assert (
        bench_fullgraph._result(summary, 9.0, tmp_path, 0, threads=4).floor_s == 3.5 / 8
    )
    # Beside g3 / halo: g3's floor over halo's epoch time.
    monkeypatch.setattr(bench_fullgraph, "usable_cores", lambda: 2)
    halo = dataclasses.replace(four, epoch_s=2.5, cpu_s=3.0)
    bench_fullgraph._print_ratios({"halo (metis)": [halo], "g3 (metis)": [four]})
    (line,) = [x for x in capsys.readouterr().out.splitlines() if "CPU floor" in x]
    assert "g3 (metis)'s CPU floor over halo (metis)'s epoch: 0.70x" in line
    assert "(CPU s per epoch: 3.50 vs 3.00, on 2 CPUs)" in line
    assert (
        bench_fullgraph._flag(
            ("--threads", "2", "--x", "--threads", "3"), "--threads", "1"
        )
        == "3"
    )


def test_the_unshaped_runs_say_how_much_of_the_link_each_engine_hides(capsys) -> None:
    """g3 and halo on the same parts with no shaping: g3 shaped over g3
    unshaped (1.0: the link hidden entirely), and g3 unshaped over halo
    shaped (the least g3 / halo the machine allows); they are targets' runs."""
    assert set(bench_fullgraph.UNSHAPED) <= set(bench_fullgraph.TARGETS)
    results = {
        "halo (metis)": _runs(2.0),
        "g3 (metis)": _runs(1.5),
        "halo unshaped (metis)": _runs(1.25),
        "g3 unshaped (metis)": _runs(1.2),
    }
    bench_fullgraph._print_ratios(results)
    lines = capsys.readouterr().out.splitlines()

    def line(label: str) -> str:
        (found,) = [x for x in lines if x.startswith(label)]
        return found

    assert " 1.25x " in line("g3 shaped / g3 unshaped")
    assert line("g3 shaped / g3 unshaped").endswith("1.00: g3 hides the link entirely")
    assert " 0.60x " in line("g3 unshaped / halo shaped")
    assert " 1.60x " in line("halo shaped / halo unshaped")
