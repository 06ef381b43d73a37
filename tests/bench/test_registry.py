"""`BenchOptions` names a bad value; `target_note` says when the targets do
not apply; every registered benchmark's summary names what it compared."""

from __future__ import annotations

import pytest

from graphwire.bench.registry import (
    TARGET_NODES,
    BenchOptions,
    run_benchmark,
    target_note,
)


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"nodes": 0}, "nodes"),
        ({"repeat": 0}, "repeat"),
        ({"seed": -1}, "seed"),
        ({"seed": 2**63}, "seed"),
    ],
)
def test_options_name_a_bad_value(kwargs: dict, field: str) -> None:
    with pytest.raises(ValueError, match=f"^{field}: "):
        BenchOptions(**kwargs)


def test_target_note_only_off_the_target_size() -> None:
    assert target_note(BenchOptions()) == ""
    assert f"{TARGET_NODES:,} nodes" in target_note(BenchOptions(nodes=2000))


def test_unknown_benchmark_is_named() -> None:
    with pytest.raises(ValueError, match="unknown benchmark 'nope'; known: "):
        run_benchmark("nope", BenchOptions(nodes=200))
