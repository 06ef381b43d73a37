"""bench_locality: bad flags are refused naming the flag, and the report says
what its columns compare and which way is better."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
import bench_locality  # noqa: E402


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--parts", "1"], "--parts: expected counts >= 2, got [1]"),
        (["--parts", "4", "0"], "--parts: expected counts >= 2, got [4, 0]"),
        (["--nodes", "50", "--parts", "60"], "--parts: expected at most the 50 "),
        (["--nodes", "0"], "--nodes: need at least 2, got 0"),
        (["--degree", "-3"], "--degree: must be in (0, nodes), got -3.0"),
        (["--seed", "-1"], "--seed: expected an int in [0, 2**63), got -1"),
        (["--dataset", "/no/such/graph"], "dataset '/no/such/graph': not a known"),
    ],
)
def test_bad_flag_is_refused(argv: list[str], message: str, capsys) -> None:
    with pytest.raises(SystemExit) as exit_:
        bench_locality.main(argv)
    assert exit_.value.code == 2
    assert message in capsys.readouterr().err


def test_report_has_a_row_per_method_and_a_legend(capsys) -> None:
    bench_locality.main(["--nodes", "600", "--parts", "3"])
    out = capsys.readouterr().out
    methods = [line.split()[1] for line in out.splitlines() if line.startswith("    3")]
    assert methods == ["metis", "locality/gain", "locality/paper"]
    assert "METIS's (below 1: less to fetch)" in out
    assert "max/min <= 1.05 with cut +% <= 10" in out
