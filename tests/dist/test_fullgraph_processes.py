"""Distributed full-graph training over real processes (gloo): parity with one
process, Cora accuracy, a worker killed mid-epoch, and resume from a checkpoint.

Tolerance for parity: 1e-5 relative / 1e-6 absolute, as in
tests/fullgraph/test_parity.py (only float summation order differs).
"""

from __future__ import annotations

import time
from pathlib import Path

import psutil
import pytest
import torch

from graphwire.comm.launch import WorkerFailed, launch_local
from graphwire.fullgraph.checkpoint import CheckpointConfig
from graphwire.fullgraph.trainer import train_fullgraph
from graphwire.graph.planetoid import load_planetoid
from graphwire.partition import get_partitioner, write_partitioned
from graphwire.testing.dist_probes import one_step, train_and_report
from graphwire.training import TrainConfig
from tests.fullgraph.dist_helpers import (
    DROPOUT_SEED,
    config_for,
    single_step,
    small_graph,
    write_parts,
)

TOL = {"rtol": 1e-5, "atol": 1e-6}


def _workers_left() -> list[str]:
    """Child processes other than multiprocessing's resource tracker (which
    lives as long as this interpreter once any spawn has happened)."""
    left = []
    for child in psutil.Process().children(recursive=True):
        try:
            command = " ".join(child.cmdline())
        except psutil.NoSuchProcess:
            continue
        if "resource_tracker" not in command:
            left.append(f"{child.pid}: {command[:120]}")
    return left


def _no_children_left() -> None:
    deadline = time.monotonic() + 10
    while left := _workers_left():
        assert time.monotonic() < deadline, f"workers outlived the run: {left}"
        time.sleep(0.1)


@pytest.mark.parametrize(
    ("model", "num_parts", "exchange", "options"),
    [
        ("gcn", 3, "g3", {"bin_rows": 16}),  # pipelined isend/irecv for real
        ("sage", 2, "halo", {}),
        ("gat", 3, "replicate", {}),
    ],
)
def test_processes_match_single_process(tmp_path, model, num_parts, exchange, options):
    graph = small_graph()
    config = config_for(model)
    oracle = single_step(graph, config)
    method = "random" if num_parts == 3 else "metis"
    folder = write_parts(graph, num_parts, tmp_path, method)
    ranks = launch_local(
        one_step, num_parts, str(folder), config, exchange, options, DROPOUT_SEED
    )
    logits = torch.empty_like(oracle["logits"])
    for rank in ranks:
        logits[rank["orig_nid"]] = rank["logits"]
    torch.testing.assert_close(logits, oracle["logits"], **TOL)
    assert sum(r["loss"] for r in ranks) == pytest.approx(oracle["loss"], rel=1e-5)
    for rank in ranks:
        for name, grad in oracle["grads"].items():
            torch.testing.assert_close(rank["grads"][name], grad, **TOL)


def test_cora_on_four_workers_matches_one_process(tmp_path, cora_dir: Path) -> None:
    cora = load_planetoid(cora_dir, "cora")
    config = TrainConfig(model="gcn", epochs=100, seed=0)
    single = train_fullgraph(cora, config)
    partition = get_partitioner("metis").partition(cora, 4, seed=0)
    folder = write_partitioned(cora, partition, tmp_path / "cora4")
    ranks = launch_local(train_and_report, 4, str(folder), config, "g3", {})
    # Same model, same hashed dropout: only float summation order differs, so
    # the best-validation epoch and its test accuracy agree.
    assert {r["test_acc"] for r in ranks} == {single.test_acc}
    assert single.test_acc >= 0.79
    for name, value in single.state_dict.items():
        torch.testing.assert_close(ranks[0]["state_dict"][name], value, **TOL)


def test_killed_worker_ends_the_run_promptly(tmp_path) -> None:
    folder = write_parts(small_graph(), 3, tmp_path, "metis")
    config = TrainConfig(model="gcn", epochs=50, seed=0)
    start = time.monotonic()
    with pytest.raises(WorkerFailed, match="rank 1") as failure:
        launch_local(
            train_and_report,
            3,
            str(folder),
            config,
            "g3",
            {},
            None,
            (1, 3),
            timeout_s=120,
        )
    assert time.monotonic() - start < 30  # a bound against hanging, not a timing
    assert failure.value.rank == 1
    assert "SIGKILL" in str(failure.value)
    _no_children_left()


def test_resume_after_a_kill_ends_with_the_uninterrupted_parameters(tmp_path):
    folder = write_parts(small_graph(), 2, tmp_path, "metis")
    config = TrainConfig(model="sage", epochs=12, seed=3)
    straight = launch_local(
        train_and_report,
        2,
        str(folder),
        config,
        "g3",
        {"bin_rows": 32},
        CheckpointConfig(str(tmp_path / "ckpt-a"), every=4),
    )
    interrupted = CheckpointConfig(str(tmp_path / "ckpt-b"), every=4)
    with pytest.raises(WorkerFailed):  # rank 1 dies after epoch 9 (last save: 7)
        launch_local(
            train_and_report,
            2,
            str(folder),
            config,
            "g3",
            {"bin_rows": 32},
            interrupted,
            (1, 9),
        )
    resumed_config = CheckpointConfig(interrupted.folder, every=4, resume=True)
    resumed = launch_local(
        train_and_report,
        2,
        str(folder),
        config,
        "g3",
        {"bin_rows": 32},
        resumed_config,
    )
    assert resumed[0]["epochs_run"] == straight[0]["epochs_run"] == 12
    for name, value in straight[0]["state_dict"].items():
        torch.testing.assert_close(resumed[0]["state_dict"][name], value, **TOL)
    # The resumed run really started from the checkpoint: it ran 4 epochs, not 12.
    fwd = [r for r in resumed[0]["ledger"]["sent"] if r[2] == "fwd.L1"]
    full = [r for r in straight[0]["ledger"]["sent"] if r[2] == "fwd.L1"]
    assert sum(r[3] for r in fwd) * 3 == sum(r[3] for r in full)
