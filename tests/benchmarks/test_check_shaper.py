"""check_shaper: a bad flag is refused, naming it, before any namespace."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
import check_shaper  # noqa: E402


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (
            ["--rates", "100", "0"],
            "--rates: expected numbers >= 0.001 (tc's 1 kbit/s), got [0.0]",
        ),
        (["--seconds", "0"], "--seconds: expected a number > 0, got 0.0"),
        (["--burst-kb", "10"], "--burst-kb: expected >= 256"),
        (["--mtu", "100"], "--mtu: expected 1280..65536, got 100"),
    ],
)
def test_bad_flag_is_refused_before_any_namespace(
    argv: list[str], message: str, capsys, monkeypatch
) -> None:
    def no_namespace() -> tuple[bool, str]:
        raise AssertionError("a namespace was about to be made")

    monkeypatch.setattr(check_shaper, "netns_available", no_namespace)
    with pytest.raises(SystemExit) as exit_:
        check_shaper.main(argv)
    assert exit_.value.code == 2
    assert message in capsys.readouterr().err
