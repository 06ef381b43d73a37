"""The sampler benchmark's report says how many seeds its batches held."""

from __future__ import annotations

from graphwire.bench.registry import BenchOptions
from graphwire.bench.sampler import BATCH, run


def test_small_graph_reports_the_seeds_its_batches_held(capsys) -> None:
    # 2,000 nodes have 160 training nodes: no batch holds BATCH seeds.
    result = run(BenchOptions(nodes=2000, repeat=1))
    out = capsys.readouterr().out
    assert f"batch {BATCH}," not in out
    assert "seeds per batch on average (batches of up to 1000 from 160 " in out
    assert 0 < result["seeds_per_batch"] <= 160
    assert "the targets are for 1,000,000 nodes" in out
