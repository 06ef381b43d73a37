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
        ({"nodes": 2**31 + 1}, "nodes"),  # the generator's limit
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


def test_a_failed_generator_child_is_one_line_naming_why(monkeypatch) -> None:
    """The generator benchmark's child failing (here: a bad seed got past)
    used to end in CalledProcessError, its whole script dumped; now the
    error is the child's last line."""
    from graphwire.bench import generator

    options = BenchOptions(nodes=200)
    options.seed = -5  # past the options' own check
    with pytest.raises(generator.GeneratorFailed) as caught:
        generator.run(options)
    message = str(caught.value)
    assert message.startswith("generator: generating 200 nodes failed: "), message
    assert "\n" not in message and "seed" in message
