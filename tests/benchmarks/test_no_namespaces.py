"""The network benchmarks on a machine without network namespaces: one line
on stderr that says why and to run as root, exit 1, and no work done."""

from __future__ import annotations

import importlib
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))


@pytest.mark.parametrize(
    "script",
    [
        "bench_fullgraph",
        "bench_minibatch",
        "bench_staleness",
        "bench_switch",
        "check_shaper",
    ],
)
def test_without_namespaces_the_benchmark_says_so_and_exits_1(
    script: str, capsys, monkeypatch
) -> None:
    module = importlib.import_module(script)
    monkeypatch.setattr(module, "netns_available", lambda: (False, "no CAP_SYS_ADMIN"))
    try:
        code = module.main([])
    except SystemExit as exit_:
        code = 1 if isinstance(exit_.code, str) else exit_.code
        print(exit_.code, file=sys.stderr)  # as the interpreter prints it
    out, err = capsys.readouterr()
    assert code == 1
    assert err.strip() == (
        f"{script}: needs network namespaces (run as root): no CAP_SYS_ADMIN"
    )
    assert out == ""
