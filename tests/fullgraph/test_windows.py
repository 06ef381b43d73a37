"""A distributed full-graph run's records add up to its ledger.

Each epoch's ``comm`` used to run from the epoch's start to its evaluation's
end: the set-up collectives (loading the parts, the engine's plans), the
sums behind each epoch's per-rank table and a checkpoint's collectives were
in no record, so the records added up to less than the summary's
``bytes_sent``. The set-up, epoch and teardown windows now tile the run.
"""

from __future__ import annotations

import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from graphwire.comm.local import run_local
from graphwire.fullgraph.distributed import train_distributed
from graphwire.partition import load_part
from graphwire.run.checkpoint import CheckpointConfig
from tests.fullgraph.dist_helpers import config_for, small_graph, write_parts

_WAYS = ("bytes_sent", "bytes_recv")


def _train(folder: Path, config, exchange, checkpoint=None, world: int = 3):
    def run(transport) -> dict[str, Any]:
        part = load_part(folder, transport.rank)
        result = train_distributed(
            part, transport, config, exchange, checkpoint=checkpoint
        )
        return {
            "records": [r.as_dict() for r in result.result.records],
            "phases": result.counters["phases"],
            "ledger": result.ledger,
            "first": result.first_epoch,
        }

    return run_local(run, world)


def _windows(rank: dict[str, Any]) -> list[dict[str, Any]]:
    """The set-up, the epochs this process ran and the teardown."""
    epochs = [r["comm"] for r in rank["records"] if r["epoch"] >= rank["first"]]
    phases = rank["phases"]
    return [phases["setup"]["comm"], *epochs, phases["teardown"]["comm"]]


def _check_adds_up(rank: dict[str, Any]) -> None:
    windows = _windows(rank)
    ledger = rank["ledger"]
    totals = {
        "bytes_sent": sum(row[3] for row in ledger["sent"]),
        "bytes_recv": sum(row[3] for row in ledger["recv"]),
    }
    assert {way: sum(w[way] for w in windows) for way in _WAYS} == totals
    by_tag: dict[str, int] = {}
    for window in windows:
        assert sum(window["by_tag"].values()) == window["bytes_sent"]
        assert sum(window["by_peer"].values()) == window["bytes_sent"]
        for tag, num_bytes in window["by_tag"].items():
            by_tag[tag] = by_tag.get(tag, 0) + num_bytes
    want: dict[str, int] = {}
    for _, _, tag, num_bytes, _ in ledger["sent"]:
        want[tag] = want.get(tag, 0) + num_bytes
    assert by_tag == want


@pytest.mark.parametrize("exchange", ["halo", "g3"])
def test_set_up_epochs_and_teardown_add_up_to_the_ledger(
    tmp_path: Path, exchange: str
) -> None:
    folder = write_parts(small_graph(), 3, tmp_path, "metis")
    config = replace(config_for("gcn"), epochs=4)
    saving = CheckpointConfig(folder=str(tmp_path / "ckpt"), every=2)
    whole = _train(folder, config, exchange, saving)
    for rank in whole:
        _check_adds_up(rank)
        # Each epoch's CPU seconds (the benchmark's CPU floor) are recorded.
        assert all(r["extra"]["cpu_s"] > 0 for r in rank["records"])
        setup = rank["phases"]["setup"]["comm"]["by_tag"]
        assert any(tag.startswith("setup.") for tag in setup), setup
        # set-up ends in a barrier: epoch 0 waits for no peer's set-up
        assert "meta.barrier" in setup, setup
        epochs = [r["comm"]["by_tag"] for r in rank["records"]]
        assert all(any(tag.startswith("sync.grad") for tag in e) for e in epochs)
        # the last checkpoint's collectives come after the last epoch
        assert rank["phases"]["teardown"]["comm"]["bytes_sent"] > 0
    # Resumed at epoch 2: its ledger counts from there, and so do its
    # set-up, the records of epochs 2 and 3, and its teardown.
    half = replace(config, epochs=2)
    _train(folder, half, exchange, replace(saving, folder=str(tmp_path / "c2")))
    resume = replace(saving, folder=str(tmp_path / "c2"), resume=True)
    resumed = _train(folder, config, exchange, resume)
    for rank in resumed:
        assert rank["first"] == 2
        assert [r["epoch"] for r in rank["records"]] == [0, 1, 2, 3]
        _check_adds_up(rank)


def test_the_optimizer_step_is_timed_in_backward_as_one_process_does(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``sync_s`` used to hold the optimizer step; it is the gradients' sum
    now, and ``backward_s`` holds the step, as a single process's does."""
    import graphwire.fullgraph.distributed as distributed

    pause = 0.2
    made = distributed.make_optimizer

    def slow_optimizer(model, config):
        optimizer = made(model, config)
        step = optimizer.step

        def slow_step(*args, **kwargs):
            time.sleep(pause)
            return step(*args, **kwargs)

        optimizer.step = slow_step  # type: ignore[method-assign]
        return optimizer

    monkeypatch.setattr(distributed, "make_optimizer", slow_optimizer)
    folder = write_parts(small_graph(), 2, tmp_path, "metis")
    config = replace(config_for("gcn"), epochs=2)
    for rank in _train(folder, config, "halo", None, world=2):
        for record in rank["records"]:
            assert record["times"]["backward_s"] >= pause
