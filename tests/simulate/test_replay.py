"""Traces to task graphs: program order, matched messages, overlap, the switch."""

from __future__ import annotations

import numpy as np
import pytest

from graphwire.simulate.capture import Capture, Event, RankTrace
from graphwire.simulate.flow import simulate_flows
from graphwire.simulate.replay import layer_of, workload_from_traces
from graphwire.simulate.topology import Topology

RATE = 8e9
MB = 1_000_000


def _trace(rank: int, events: list[Event], cpu: float) -> RankTrace:
    return RankTrace(rank, events, cpu, cpu)


def test_layer_of_tags() -> None:
    assert layer_of("fwd.L2") == 2
    assert layer_of("eval.bwd.L0") == 0
    assert layer_of("sync.grad.L1") == 1
    assert layer_of("sync.grad") == -1


def test_a_receive_holds_up_what_follows_it() -> None:
    traces = [
        _trace(0, [Event("send", 1, "fwd.L1", MB, 1e-3, 0.0)], 1e-3),
        _trace(1, [Event("recv", 0, "fwd.L1", MB, 0.0, 0.0)], 2e-3),
    ]
    workload = workload_from_traces(Capture(traces))
    assert workload.bytes_between() == {(0, 1, "fwd.L1"): MB}
    result = simulate_flows(workload, Topology("star", 2, RATE, 0.0))
    transfer = MB * 8 / RATE
    assert result.makespan == pytest.approx(1e-3 + transfer + 2e-3, rel=0.01)


def test_a_posted_receive_overlaps_until_its_wait() -> None:
    # Rank 1 posts, computes 5 ms, then waits: the 1 ms transfer hides.
    traces = [
        _trace(0, [Event("send", 1, "fwd.L1", MB, 0.0, 0.0)], 0.0),
        _trace(
            1,
            [
                Event("posted", 0, "fwd.L1", MB, 0.0, 0.0),
                Event("wait", 0, "fwd.L1", 0, 5e-3, 0.0, ref=0),
            ],
            6e-3,
        ),
    ]
    result = simulate_flows(
        workload_from_traces(Capture(traces)), Topology("star", 2, RATE, 0.0)
    )
    assert result.makespan == pytest.approx(6e-3, rel=1e-6)


def test_back_to_back_sends_are_one_message_and_scaling_applies() -> None:
    traces = [
        _trace(
            0,
            [Event("send", 1, "fwd.L1", 100, 1e-3, 0.0)] * 3
            + [Event("send", 1, "bwd.L1", 50, 1e-3, 0.0)],
            2e-3,
        ),
        _trace(1, [Event("recv", 0, "fwd.L1", 300, 0.0, 0.0)], 0.0),
    ]
    workload = workload_from_traces(Capture(traces), compute_scale=2.0)
    sends = [t for t in workload.tasks if t.is_send]
    assert [(t.tag, t.nbytes) for t in sends] == [("fwd.L1", 300), ("bwd.L1", 50)]
    assert sum(t.seconds for t in workload.tasks if t.node == 0) == pytest.approx(4e-3)
    calibrated = workload_from_traces(Capture(traces), compute_s=[1e-3, 0.0])
    assert sum(t.seconds for t in calibrated.tasks if t.node == 0) == pytest.approx(
        1e-3
    )


def test_the_switchs_messages_wait_for_the_frames_it_needed() -> None:
    # Rank 0 uploads frames 3 (rows, header), rank 1 frames 5 and 6; the
    # switch's frame 0 to rank 0 needed 0's frame 3 and 1's frame 6.
    traces = [
        _trace(
            0,
            [
                Event("send", 2, "fwd.L1", MB, 0.0, 0.0, frame=3),
                Event("send", 2, "switch.L1", 24, 0.0, 0.0, frame=3),
                Event("recv", 2, "fwd.L1", MB, 0.0, 0.0, frame=0),
            ],
            0.0,
        ),
        _trace(
            1,
            [
                Event("send", 2, "fwd.L1", MB, 1e-3, 0.0, frame=5),
                Event("send", 2, "fwd.L1", MB, 2e-3, 0.0, frame=6),
            ],
            2e-3,
        ),
    ]
    switch = np.array([[0, 0, 3, 6]])
    star = Topology("star", 2, RATE, 0.0)
    with pytest.raises(ValueError, match="no aggregator"):
        workload_from_traces(Capture(traces, switch))
    with pytest.raises(ValueError, match="kept no trace"):
        workload_from_traces(Capture(traces), aggregator=star.aggregator)
    workload = workload_from_traces(Capture(traces, switch), aggregator=star.aggregator)
    assert workload.bytes_between() == {
        (0, 2, "fwd.L1"): MB,
        (0, 2, "switch.L1"): 24,
        (1, 2, "fwd.L1"): 2 * MB,
        (2, 0, "fwd.L1"): MB,
    }
    down = next(i for i, t in enumerate(workload.tasks) if t.node == star.aggregator)
    frame6 = max(i for i, t in enumerate(workload.tasks) if t.node == 1 and t.is_send)
    frame3 = next(i for i, t in enumerate(workload.tasks) if t.node == 0 and t.is_send)
    assert set(workload.tasks[down].deps) == {frame3, frame6}
    result = simulate_flows(workload, star)
    assert result.start[down] == pytest.approx(result.finish[frame6])


def test_a_receive_without_its_send_is_refused() -> None:
    traces = [
        _trace(0, [], 0.0),
        _trace(1, [Event("recv", 0, "fwd.L1", 8, 0.0, 0.0)], 0.0),
    ]
    with pytest.raises(ValueError, match="never sent"):
        workload_from_traces(Capture(traces))
