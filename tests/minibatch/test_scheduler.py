"""ByteGNN's scheduler: task order, the launch score, and the runner.

- priority order (DAG, cost, sequence) runs a DAG's end before a later
  DAG's hops, FIFO after them (the paper's example), and a DAG's cheaper
  task first;
- f(0) = 100, f(100) = 0, decreasing; Q_size = 0 or an untimed trainer
  launches at once; otherwise the score is T_gap f(C) balance against σ;
- the runner hands out every batch, in key order, with either schedule,
  never more DAGs alive than its depth, and a task's error in ``get``.
"""

from __future__ import annotations

import math
import threading
import time

import pytest

from graphwire.minibatch.scheduler import (
    DagRunner,
    LaunchPolicy,
    Task,
    TaskPool,
    utilisation_factor,
)


def _order(policy: str) -> list[str]:
    """One thread; DAG 0 (a hop, then its end) and DAG 1 (two hops, costs 5
    and 1) all ready before the thread starts."""
    gate = threading.Event()
    done = threading.Event()
    pool = TaskPool(
        1,
        policy,
        on_done=lambda dag: done.set() if dag == 1 else None,
        on_error=lambda dag, task, error: None,
    )
    pool.order = []
    pool.submit([Task(-1, 0, lambda: gate.wait() and None, "gate")])
    end0 = Task(0, 0, lambda: None, "end0")
    pool.submit([Task(0, 9, lambda: [end0], "hop0")])
    pool.submit([Task(1, 5, lambda: None, "hop1a"), Task(1, 1, lambda: None, "hop1b")])
    gate.set()
    assert done.wait(5)
    pool.close()
    return pool.order


def test_a_dags_end_is_not_stuck_behind_a_later_dags_hops() -> None:
    assert _order("bytegnn") == ["gate", "hop0", "end0", "hop1b", "hop1a"]
    assert _order("fifo") == ["gate", "hop0", "hop1a", "hop1b", "end0"]


def test_the_utilisation_factor_falls_from_100_to_0() -> None:
    assert utilisation_factor(0) == pytest.approx(100)
    assert utilisation_factor(100) == pytest.approx(0, abs=1e-9)
    values = [utilisation_factor(c) for c in range(0, 101, 5)]
    assert all(a > b for a, b in zip(values, values[1:], strict=False))
    assert utilisation_factor(-5) == utilisation_factor(0)
    assert utilisation_factor(130) == utilisation_factor(100)


def test_the_launch_score_and_its_empty_queue() -> None:
    policy = LaunchPolicy(sigma=1.0)
    assert policy.score(0.0, 100.0, q_size=3) == math.inf  # untimed: launch
    policy.sampled(0.1)
    policy.trained(0.05)
    assert policy.launch(0.0, 100.0, q_size=0)  # nothing waits: launch now
    # balance = 0.1 / (0.05 * 2) = 1; f(0) = 100: the score is 100 T_gap.
    assert policy.score(0.02, 0.0, q_size=2) == pytest.approx(2.0)
    assert policy.launch(0.02, 0.0, q_size=2)
    assert not policy.launch(0.005, 0.0, q_size=2)  # 0.5 < σ
    assert not policy.launch(10.0, 100.0, q_size=2)  # the CPUs are full
    assert LaunchPolicy(fifo=True).launch(0.0, 100.0, q_size=9)


@pytest.mark.parametrize(
    ("params", "message"),
    [
        ({"sigma": 0.0}, "sigma: expected a number > 0"),
        ({"sigma": math.nan}, "sigma: expected a number > 0"),
        ({"window": 0}, "window: expected >= 1"),
    ],
)
def test_bad_launch_settings_are_refused(params: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        LaunchPolicy(**params)


def test_zero_sampler_threads_are_refused() -> None:
    with pytest.raises(ValueError, match="sampler threads: expected >= 1"):
        TaskPool(0, "bytegnn", lambda dag: None, lambda dag, task, error: None)


def _dag(key: int, dag: int, finish, fail_at: int | None = None):
    """seed -> two hops -> end: the batch is ``key``'s squares summed."""
    parts: list[int] = []
    lock = threading.Lock()
    remaining = [2]

    def hop(values: list[int]):
        def run():
            if fail_at == key:
                raise ValueError(f"hop of batch {key} failed")
            time.sleep(0.001)
            with lock:
                parts.extend(v * v for v in values)
                remaining[0] -= 1
                last = remaining[0] == 0
            return [Task(dag, 0, lambda: finish(sum(parts)), "end")] if last else None

        return run

    def seed():
        return [
            Task(dag, 2, hop([key, key + 1]), "hop"),
            Task(dag, 1, hop([key + 2]), "hop"),
        ]

    return [Task(dag, 0, seed, "seed")]


@pytest.mark.parametrize("schedule", ["bytegnn", "fifo"])
def test_the_runner_hands_out_every_batch_in_order(schedule: str) -> None:
    keys = list(range(30))
    runner = DagRunner(
        keys,
        _dag,
        threads=3,
        schedule=schedule,
        policy=LaunchPolicy(fifo=schedule == "fifo", sigma=0.01),
        depth=4,
        cpu=lambda: 50.0,
    )
    got = []
    for key in keys:
        got.append(runner.get(key))
        runner.release(0.001)
    runner.close()
    assert got == [k * k + (k + 1) ** 2 + (k + 2) ** 2 for k in keys]
    assert runner.counters["launched"] == len(keys)
    assert runner.counters["peak_inflight"] <= 4


def test_a_failed_task_ends_the_trainers_wait_with_its_error() -> None:
    runner = DagRunner(
        range(5),
        lambda k, d, f: _dag(k, d, f, fail_at=2),
        threads=2,
        schedule="bytegnn",
        policy=LaunchPolicy(),
        depth=3,
        cpu=lambda: 0.0,
    )
    taken = []
    with pytest.raises(Exception, match="hop of batch 2 failed"):
        for key in range(5):  # the error ends the wait for any batch, at once
            runner.get(key)
            taken.append(key)
            runner.release(0.001)
    assert taken in ([], [0], [0, 1])  # never batch 2 itself, nor later ones
    runner.close()
