"""Each rank of more than two beats in the rendezvous store, so a survivor of
a failed collective can name the ranks that stopped (gloo names an address):
one whose beat did not move and that did not report a failure of its own."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import timedelta

import pytest
import torch.distributed as dist

from graphwire.comm import heartbeat as heartbeat_module
from graphwire.comm.context import WorkerContext
from graphwire.comm.launch import free_port


@pytest.fixture
def beats(monkeypatch) -> Iterator[list]:
    """Three ranks' heartbeats on one store (faster than a run's)."""
    monkeypatch.setattr(heartbeat_module, "_BEAT_S", 0.05)
    # 30 beats' time (10 failed once on a machine running 16 test
    # processes at once, likely a live beat held up that long)
    monkeypatch.setattr(heartbeat_module, "_SILENT_S", 1.5)
    port = free_port()
    store = dist.TCPStore(  # noqa: F841 (the server lives as long as it)
        "127.0.0.1",
        port,
        is_master=True,
        wait_for_workers=False,
        timeout=timedelta(seconds=5),
    )
    hearts = [
        heartbeat_module.Heartbeat.start(
            WorkerContext(rank, 3, rank, "127.0.0.1", port, "gloo")
        )
        for rank in range(3)
    ]
    yield hearts
    for heart in hearts:
        heart.stop()


def test_a_rank_that_stops_beating_is_lost(beats) -> None:
    beats[2].stop()  # as a rank that was killed, or is stopped
    assert beats[0].lost() == [2]
    assert beats[1].lost() == [2]


def test_ranks_that_beat_or_failed_themselves_are_not_lost(beats) -> None:
    assert beats[0].lost() == []  # slow or stuck, not gone
    beats[1].mark_failed()
    beats[1].stop()  # a survivor that has given up and exited
    assert beats[0].lost() == []


def test_when_the_store_went_with_its_host_nothing_is_told(monkeypatch) -> None:
    """Rank 0 (or node 0's torchrun agent) holds the store: when it is gone,
    no rank can be named, and the heartbeat says so rather than blame all."""
    monkeypatch.setattr(heartbeat_module, "_SILENT_S", 0.2)
    port = free_port()
    store = dist.TCPStore(
        "127.0.0.1",
        port,
        is_master=True,
        wait_for_workers=False,
        timeout=timedelta(seconds=5),
    )
    heart = heartbeat_module.Heartbeat.start(
        WorkerContext(1, 3, 1, "127.0.0.1", port, "gloo")
    )
    assert heart is not None
    del store
    assert heart.lost() is None
    heart.stop()
