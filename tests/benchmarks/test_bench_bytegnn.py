"""bench_bytegnn's report and flags: each schedule against serial on the
same parts and link; bad flags refused before any work."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
import bench_bytegnn  # noqa: E402

from graphwire.graph.synthetic import ProductsConfig, products_graph  # noqa: E402
from graphwire.partition import (  # noqa: E402
    get_partitioner,
    load_partition_meta,
    write_partitioned,
)


def _run(rate: float, cpu: float) -> dict[str, float]:
    return {"seeds_per_s": rate, "cpu_util": cpu, "queue": 0.5, "inflight": 1.0}


def test_the_report_compares_each_schedule_with_serial(capsys) -> None:
    args = argparse.Namespace(
        partitions=["metis", "blocks"],
        schedules=["serial", "bytegnn"],
        tasks=["node", "link"],
    )
    results = {
        "unshaped node metis serial": [_run(100, 40), _run(120, 42)],
        "unshaped node metis bytegnn": [_run(150, 70), _run(120, 60)],
        "unshaped node blocks serial": [_run(90, 40)],
        "unshaped link metis serial": [_run(50, 40)],
        "unshaped link metis bytegnn": [_run(100, 80)],
    }
    ratios = bench_bytegnn._report(args, ["unshaped"], results)
    bytegnn = ratios["unshaped node metis bytegnn"]
    assert bytegnn["over_serial"] == pytest.approx(135 / 110)
    assert bytegnn["cpu_util"] == pytest.approx(65)
    assert ratios["unshaped link metis bytegnn"]["over_serial"] == pytest.approx(2)
    assert "unshaped node blocks bytegnn" not in ratios  # not run
    assert "1.23x" in capsys.readouterr().out


def test_link_parts_hold_the_training_edges_and_the_pairs(tmp_path) -> None:
    graph = products_graph(ProductsConfig(nodes=300, degree=6, features=2, classes=3))
    folder = bench_bytegnn._link_parts(tmp_path, "metis", graph)
    assert (folder / "held_out.npz").exists()
    assert load_partition_meta(folder)["task"] == "link"


def test_a_partitioned_folder_gives_back_its_assignment(tmp_path) -> None:
    graph = products_graph(ProductsConfig(nodes=300, degree=6, features=2, classes=3))
    partition = get_partitioner("metis").partition(graph, 2, seed=0)
    folder = write_partitioned(graph, partition, tmp_path / "parts")
    got = bench_bytegnn._assignment(Path(folder), graph.num_nodes)
    assert torch.equal(got, partition.assignment)


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--schedules", "bytegnn"], "--schedules: the ratios need serial"),
        (["--schedules", "serial,lifo"], "--schedules: unknown ['lifo']"),
        (["--partitions", "spectral"], "--partitions: unknown ['spectral']"),
        (["--epochs", "1", "--no-shaped"], "--epochs: expected >= 2"),
        (["--threads", "0", "--no-shaped"], "--threads: expected >= 1"),
        (["--prefetch", "0", "--no-shaped"], "--prefetch: expected >= 1"),
        (["--tasks", "edge", "--no-shaped"], "--tasks: unknown ['edge']"),
        (["--no-shaped", "--only-shaped"], "nothing to run"),
    ],
)
def test_bad_flags_are_refused_before_any_work(argv, message, capsys) -> None:
    with pytest.raises(SystemExit):
        bench_bytegnn.main(argv)
    assert message in capsys.readouterr().err
