"""Each rank of more than two beats in the rendezvous store, so a survivor of
a failed collective can name the ranks that stopped (gloo names an address):
one whose beat did not move and that did not report a failure of its own.
A rank held up in a call says which rank it waits on (graphwire.comm.stall)."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta

import pytest
import torch.distributed as dist

from graphwire.comm import heartbeat as heartbeat_module
from graphwire.comm.context import WorkerContext
from graphwire.comm.launch import free_port
from graphwire.comm.stall import StallWatch


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
    # Both survivors ask at once, as after a failed collective (each asking
    # takes _SILENT_S).
    with ThreadPoolExecutor(2) as pool:
        asked = [pool.submit(beats[rank].lost) for rank in (0, 1)]
        assert [ask.result() for ask in asked] == [[2], [2]]


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


def _held_up(watch: StallWatch, lines: list[str], op: str, tag: str, peers=None):
    """Wait in ``op`` until ``watch`` tells of it (10 s at most)."""
    with watch.waiting(op, tag, peers):
        deadline = time.monotonic() + 10
        while not lines and time.monotonic() < deadline:
            time.sleep(0.05)
        time.sleep(0.5)  # a second notice of the same wait would come by now
    watch.stop()


def test_a_rank_held_up_in_a_call_says_once_which_rank_and_where(beats) -> None:
    """A call held up past the notice time gets one line: the rank that
    stopped beating (frozen or dead), where it was last seen, and how long
    the timeout leaves; a call that ends sooner gets none."""
    phases = {1: "epoch 4, waiting in all_to_all (fwd.L1)", 2: "epoch 4, computing"}
    for rank, where in phases.items():
        beats[rank].status = lambda where=where: where
    lines: list[str] = []
    watch = StallWatch(0, 3, 0.3, 60.0, beats[0], lambda: "epoch 4", lines.append)
    beats[0].status = watch.status
    with watch.waiting("all_to_all", "fwd.L0"):
        time.sleep(0.1)  # over before its notice
    time.sleep(0.3)  # every status published
    beats[2].stop()
    _held_up(watch, lines, "all_to_all", "fwd.L1")
    assert len(lines) == 1, lines
    assert lines[0].startswith("graphwire: rank 0 has waited ")
    assert " s in epoch 4 on all_to_all (fwd.L1): rank 2 stopped beating " in lines[0]
    assert "(frozen or dead; rank 2 last seen in epoch 4, computing)" in lines[0]
    left = int(lines[0].split("ends the run in ")[1].split()[0])
    assert 50 <= left <= 59 and lines[0].endswith(" s unless it moves")


def test_a_rank_held_up_by_live_peers_names_those_not_in_its_call(beats) -> None:
    """All beat: of a collective, the ranks that are elsewhere (slow or
    stuck) are named with where they are; of a receive, its peer."""
    beats[1].status = lambda: "epoch 2, waiting in all_to_all (bwd.L0)"
    beats[2].status = lambda: "epoch 2, computing"
    cases = {
        (None, "all_to_all"): "rank 2: epoch 2, computing",
        ((1,), "irecv from rank 1"): "rank 1: epoch 2, waiting in all_to_all (bwd.L0)",
    }

    def held_up(peers: tuple[int, ...] | None, op: str) -> list[str]:
        lines: list[str] = []
        watch = StallWatch(0, 3, 0.3, 9.0, beats[0], lambda: "epoch 2", lines.append)
        _held_up(watch, lines, op, "bwd.L0", peers)
        return lines

    with ThreadPoolExecutor(len(cases)) as pool:  # each case its own watch, at once
        told = {case: pool.submit(held_up, *case) for case in cases}
        for case, named in cases.items():
            lines = told[case].result()
            assert len(lines) == 1, lines
            rank = 2 if case[0] is None else 1
            assert f"waiting on rank {rank}, alive but not here ({named})" in lines[0]


def test_two_threads_held_up_by_one_rank_make_one_line(beats) -> None:
    """A trainer's collective and its loader's request to the same frozen
    rank are one stall: the rank says so once (the CI run of the stream
    test read two lines)."""
    lines: list[str] = []
    watch = StallWatch(0, 3, 0.3, 60.0, beats[0], lambda: "epoch 1", lines.append)
    beats[2].stop()

    def loader() -> None:  # held up long enough for two lines, one by one
        with watch.waiting("sample.hop request to rank 2", "sample.hop", [2]):
            time.sleep(4.5)

    thread = threading.Thread(target=loader)
    with watch.waiting("all_to_all", "fwd.L0"):
        thread.start()
        thread.join()
    watch.stop()
    assert len(lines) == 1, lines
    assert "stopped beating" in lines[0]
