"""bench_simulate: bad flags refused before any work, and one quick section
end to end (halo on METIS against random parts, flow model)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
import bench_simulate  # noqa: E402


@pytest.mark.parametrize(
    ("flags", "why"),
    [
        (["--nodes", "10"], "--nodes >= 100"),
        (["--sweep", "4,x"], "--sweep: expected ints"),
        (["--sweep", "1"], "--sweep: 1 workers"),
        (["--only", "everything"], "invalid choice"),
    ],
)
def test_bad_flags_are_refused(
    flags: list[str], why: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exited:
        bench_simulate.main(["--quick", *flags])
    assert exited.value.code == 2
    assert why in capsys.readouterr().err


def test_the_quick_distdgl_section(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    figures = tmp_path / "figures.json"
    assert (
        bench_simulate.main(["--quick", "--only", "distdgl", "--json", str(figures)])
        == 0
    )
    out = capsys.readouterr().out
    assert "halo: metis against random parts" in out
    rows = json.loads(figures.read_text())["figures"]["distdgl"]
    assert [r["workers"] for r in rows] == [4, 8]
    for row in rows:  # random parts cut more edges: more bytes than METIS's
        assert row["random"]["bytes"] > row["metis"]["bytes"] > 0
