"""A worker under torchrun, when its agent goes: killed, it goes too; stopped
(SIGTERM, as torchrun stops its workers), it cleans up as on Ctrl-C."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

import psutil
import pytest

from graphwire.comm.launch import free_port
from tests.multiprocess.cli_runs import (
    SPEC,
    _epoch_lines,
    _streamed_epochs,
    _torchrun,
)


def _start(
    out: Path, *flags: str, env: dict[str, str] | None = None, restarts: int = 0
) -> subprocess.Popen:
    """``torchrun --nproc-per-node 2 [--max-restarts N] -m graphwire train``
    on :data:`SPEC` into ``out``, in a session of its own."""
    return subprocess.Popen(
        [_torchrun(), "--nproc-per-node", "2", "--master-addr", "127.0.0.1"]
        + ["--max-restarts", str(restarts)]
        + ["--master-port", str(free_port()), "-m", "graphwire", "train"]
        + ["--dataset", SPEC, "--quiet", "--timeout", "60", "--out", str(out)]
        + list(flags),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
        env=env,
    )


def _workers_once_training(
    agent: subprocess.Popen, out: Path, epochs: int = 2
) -> list[psutil.Process]:
    """The agent's two workers, once rank 0 has streamed ``epochs`` epochs."""
    deadline = time.monotonic() + 120
    while _epoch_lines(out / "metrics.jsonl.partial") < epochs:
        assert agent.poll() is None, "torchrun ended before training"
        assert time.monotonic() < deadline, "no epochs streamed in 120 s"
        # Cora's epochs take milliseconds: a longer nap overshot a test's
        # window between two checkpoints (13 of 10..19 seen at 20).
        time.sleep(0.02)
    workers = psutil.Process(agent.pid).children()
    assert len(workers) == 2
    return workers


def _stop_all(agent: subprocess.Popen, workers: list[psutil.Process]) -> None:
    if agent.poll() is None:
        os.killpg(agent.pid, signal.SIGKILL)  # the agent and its workers
    for process in workers:
        try:
            process.kill()
        except psutil.NoSuchProcess:
            pass
    agent.communicate()


def test_a_worker_dies_with_its_killed_agent_and_cleans_up_when_stopped(
    tmp_path: Path,
) -> None:
    """Two agents at once, one per way a worker's agent goes:

    - killed (SIGKILL, the OOM killer): torchrun stops its workers when it is
      stopped, not when it is killed, and a worker must not train on alone
      (nor keep the other nodes' agents waiting for its node), so each dies
      with its agent;
    - stopping its workers (another failed, or the agent was told to stop:
      SIGTERM): each ends as on Ctrl-C, rapid's presampled batches leave the
      temporary folder with it, and it says so.
    """
    killed_out, stopped_out = tmp_path / "killed", tmp_path / "stopped"
    scratch = tmp_path / "tmp"
    scratch.mkdir()
    flags = ["--model", "sage", "--mode", "minibatch", "--fetch", "rapid"]
    flags += ["--batch-size", "100", "--fanouts", "4,4", "--epochs", "200"]
    killed = _start(killed_out, "--model", "gcn", "--epochs", "100000")
    stopped = _start(stopped_out, *flags, env={**os.environ, "TMPDIR": str(scratch)})
    workers: dict[str, list[psutil.Process]] = {"killed": [], "stopped": []}
    try:
        workers["killed"] = _workers_once_training(killed, killed_out)
        killed.kill()
        killed.wait()
        workers["stopped"] = _workers_once_training(stopped, stopped_out)
        assert len(list(scratch.glob("graphwire-presample-*"))) == 2
        workers["stopped"][1].terminate()
        _, stderr = stopped.communicate(timeout=120)
        _, alive = psutil.wait_procs(workers["killed"], timeout=60)
        assert not alive, f"workers {[p.pid for p in alive]} outlived their agent"
    finally:
        _stop_all(killed, workers["killed"])
        _stop_all(stopped, workers["stopped"])
    assert stopped.returncode != 0
    assert "graphwire: interrupted" in stderr, stderr[-3000:]
    assert list(scratch.glob("graphwire-presample-*")) == []


def test_a_worker_killed_under_max_restarts_resumes_to_the_same_run(
    tmp_path: Path,
) -> None:
    """``torchrun --max-restarts 1``: a worker killed mid-run, torchrun
    restarts both, and with ``--resume`` (which a job script may always
    pass) they go on from the last checkpoint: the epochs the killed
    attempt had trained past it are trained again to the same losses. The
    restarted workers could not join: gloo found the addresses of the
    killed attempt in the agent's store (tests/comm/test_restart.py)."""
    import json

    out = tmp_path / "run"
    flags = ["--model", "gcn", "--epochs", "40", "--checkpoint-every", "10"]
    agent = _start(out, *flags, "--resume", restarts=1)  # none yet: epoch 0
    workers: list[psutil.Process] = []
    try:
        workers = _workers_once_training(agent, out, epochs=13)
        for worker in workers:  # frozen, so what rank 0 streamed is final
            worker.suspend()
        streamed = _streamed_epochs(out / "metrics.jsonl.partial")
        workers[1].kill()
        workers[0].resume()
        _, stderr = agent.communicate(timeout=300)
    finally:
        _stop_all(agent, workers)
    assert agent.returncode == 0, stderr[-3000:]
    records = [json.loads(line) for line in (out / "metrics.jsonl").open()]
    summary = records[-1]
    assert summary["kind"] == "summary" and summary["epochs"] == 40
    first = summary["resumed_at"]
    assert first % 10 == 0 and first >= 10, first
    losses = {
        r["epoch"]: r["loss"]
        for r in records
        if r["kind"] == "epoch" and r["rank"] == 0
    }
    assert sorted(losses) == list(range(40))
    killed = {r["epoch"]: r["loss"] for r in map(json.loads, streamed)}
    again = [epoch for epoch in killed if epoch >= first]
    assert again, f"the attempt was killed at its checkpoint ({sorted(killed)})"
    for epoch in killed:
        assert losses[epoch] == pytest.approx(killed[epoch], rel=1e-5), epoch


def test_nodes_without_a_shared_out_refuse_alike(tmp_path: Path) -> None:
    """``torchrun --nnodes 2`` of a dataset that is not split yet, each node
    with its own ``--out``: rank 0 splits it into node 0's folder, which node
    1 does not see. Every rank of both nodes says so and how to mend it (node
    0's ranks had failed with gloo's "Connection closed by peer")."""
    port = str(free_port())
    nodes = [
        subprocess.Popen(
            [_torchrun(), "--nnodes", "2", "--node-rank", str(node)]
            + ["--nproc-per-node", "2", "--master-addr", "127.0.0.1"]
            + ["--master-port", port, "-m", "graphwire", "train"]
            + ["--dataset", SPEC, "--model", "gcn", "--epochs", "2", "--quiet"]
            + ["--timeout", "60", "--out", str(tmp_path / f"node{node}")],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
            start_new_session=True,
        )
        for node in (0, 1)
    ]
    errors = []
    try:
        for node in nodes:
            errors.append(node.communicate(timeout=120)[1])
    finally:
        for node in nodes:
            if node.poll() is None:
                os.killpg(node.pid, signal.SIGKILL)
                node.communicate()
    missing = tmp_path / "node1" / "partitions"
    said = f"graphwire: error: the parts could not be loaded on ranks 2, 3: {missing}"
    for node, stderr in zip(nodes, errors, strict=True):
        assert node.returncode != 0
        lines = [line for line in stderr.splitlines() if "graphwire: error" in line]
        assert len(lines) == 2, stderr[-3000:]  # one whole line per rank
        assert all(line.startswith(said) for line in lines), lines
