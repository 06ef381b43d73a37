"""`graphwire train --workers N` and the same job under torchrun agree exactly."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import psutil
import pytest
import torch

from graphwire.comm.context import default_backend
from graphwire.comm.launch import free_port
from graphwire.run.checkpoint import parts_digest
from tests.comm.launchers import worker_children
from tests.multiprocess.cli_runs import (
    SPEC,
    _epoch_lines,
    _epoch_times,
    _run,
    _summary,
    _torchrun,
    graphwire,
)

Capture = pytest.CaptureFixture[str]

TRAIN = ["train", "--model", "sage", "--exchange", "g3", "--bin-rows", "64"]
TRAIN += ["--epochs", "4", "--seed", "1", "--quiet", "--timeout", "120"]


def _g3_on_parts(
    capfd: Capture, tmp_path: Path, workers: int, *flags: str
) -> list[str]:
    """METIS parts of SPEC for ``workers`` ranks (split in this process) and
    the ``graphwire train`` arguments to train on them: :data:`TRAIN`, and
    ``flags``."""
    parts = tmp_path / "parts"
    split = graphwire(
        capfd, "partition", "--dataset", SPEC, "--method", "metis",
        "--parts", str(workers), "--out", str(parts),
    )  # fmt: skip
    assert split.returncode == 0, split.stderr[-3000:]
    return [*TRAIN, "--dataset", str(parts), *flags]


def _spawned_g3(
    capfd: Capture, tmp_path: Path, workers: int, *flags: str
) -> tuple[list[str], dict[str, str]]:
    """:func:`_g3_on_parts`' arguments and the summary of their run with
    ``--workers`` (in this process)."""
    common = _g3_on_parts(capfd, tmp_path, workers, *flags)
    spawned = graphwire(
        capfd, *common, "--workers", str(workers), "--out", str(tmp_path / "spawned")
    ).summary()
    return common, spawned


# A fresh mini-batch run and a resumed full-graph one: both modes stream
# through one rank runner (graphwire.run.job), so the two cover it.
STREAMED = {
    "mini-batch": (["--mode", "minibatch", "--batch-size", "400"], False),
    "full-graph-resumed": (["--model", "gcn"], True),
}


def test_rank_0_streams_its_epochs_and_a_late_failure_leaves_them(
    tmp_path: Path, capfd: Capture
) -> None:
    """While a run trains, ``metrics.jsonl.partial`` grows with rank 0's
    epoch records. A worker frozen late (SIGSTOP) is named, once, by rank 0
    after ``--stall-notice`` seconds, with where it was last seen; killed
    then (as the OOM killer would) it ends the
    run promptly with one line naming it, no worker left, and the records
    kept (and no new ``metrics.jsonl``, which would look complete). A resumed run's file
    starts with the epochs its checkpoint restored, with their times, and the
    finished run's ``metrics.jsonl`` is left as it was. The runs of
    :data:`STREAMED` go at once."""
    outs = {name: tmp_path / name for name in STREAMED}
    argvs, earlier, finished = {}, {}, {}
    for name, (mode, resumed) in STREAMED.items():
        argv = ["train", "--dataset", SPEC, *mode, "--workers", "2", "--quiet"]
        argv += ["--timeout", "60", "--stall-notice", "2", "--out", str(outs[name])]
        if resumed:
            ran = graphwire(capfd, *argv, "--epochs", "2", "--checkpoint-every", "1")
            ran.summary()
            earlier[name] = _epoch_times(outs[name] / "metrics.jsonl")
            finished[name] = (outs[name] / "metrics.jsonl").read_bytes()
            argv += ["--resume", "--checkpoint-every", "1"]
        argvs[name] = argv
    errs = {name: (tmp_path / f"{name}.err").open("w+") for name in argvs}
    runs = {
        name: subprocess.Popen(
            [sys.executable, "-m", "graphwire", *argv, "--epochs", "100000"],
            stdout=subprocess.PIPE,
            stderr=errs[name],
            text=True,
        )
        for name, argv in argvs.items()
    }
    stderrs, ended = {}, {}
    workers: dict[str, list[psutil.Process]] = {}
    frozen: dict[str, psutil.Process] = {}
    try:
        deadline = time.monotonic() + 120
        for name, run in runs.items():
            partial = outs[name] / "metrics.jsonl.partial"
            while _epoch_lines(partial) < 3 + 2 * STREAMED[name][1]:
                assert run.poll() is None, _read(errs[name])[-3000:]
                assert time.monotonic() < deadline, f"{name}: no epochs in 120 s"
                time.sleep(0.2)
            # The worker not writing the file: rank 1.
            workers[name] = worker_children(run.pid)
            writing = [w for w in workers[name] if str(partial) in _open_paths(w)]
            assert len(workers[name]) == 2 and len(writing) == 1, name
            frozen[name] = next(w for w in workers[name] if w not in writing)
        # Both runs' rank 1 frozen, told of and killed at once (the waits overlap).
        time.sleep(1.0)  # two heartbeats: where it is, told (every 0.5 s)
        for worker in frozen.values():
            worker.suspend()
        for name in runs:
            while "stopped beating" not in _read(errs[name]):
                assert time.monotonic() < deadline + 60, f"{name}: no stall notice"
                time.sleep(0.2)
        time.sleep(2.5)  # a second notice of the same wait would come by now
        for worker in frozen.values():
            worker.kill()
        killed_at = time.monotonic()
        for name, run in runs.items():
            run.communicate(timeout=120)
            stderrs[name] = _read(errs[name])
            ended[name] = time.monotonic() - killed_at
    finally:
        for run in runs.values():
            if run.poll() is None:  # SIGTERM: the launcher stops its workers
                run.terminate()
                try:
                    run.communicate(timeout=30)
                except subprocess.TimeoutExpired:
                    run.kill()
                    run.communicate()
    for name in STREAMED:
        stderr = stderrs[name]
        assert runs[name].returncode == 1, (name, stderr[-3000:])
        notices = [line for line in stderr.splitlines() if "has waited" in line]
        assert len(notices) == 1, stderr
        assert notices[0].startswith("graphwire: rank 0 has waited "), notices
        assert (
            ": rank 1 stopped beating (frozen or dead; rank 1 last seen in epoch "
            in notices[0]
        )
        assert "the timeout (60 s) ends the run in " in notices[0]
        lines = [line for line in stderr.splitlines() if "graphwire: error" in line]
        assert len(lines) == 1, stderr
        assert lines[0].startswith("graphwire: error: rank 1 was killed by SIGKILL")
        assert ended[name] < 30.0, (name, ended[name])
        _, alive = psutil.wait_procs(workers[name], timeout=10)
        assert alive == [], name
    for name, (_, resumed) in STREAMED.items():
        _check_stream(
            outs[name], runs[name], stderrs[name], resumed, earlier, finished, name
        )


def _check_stream(
    out: Path,
    run: subprocess.Popen[str],
    stderr: str,
    resumed: bool,
    earlier: dict[str, dict[tuple[int, int], float]],
    finished: dict[str, bytes],
    name: str,
) -> None:
    assert run.returncode != 0 and "rank 1" in stderr, (name, stderr[-3000:])
    if resumed:
        assert (out / "metrics.jsonl").read_bytes() == finished[name]
    else:
        assert not (out / "metrics.jsonl").exists()
    records = [json.loads(line) for line in (out / "metrics.jsonl.partial").open()]
    assert records[0]["kind"] == "config" and records[0]["workers"] == 2
    epochs = records[1:]
    assert len(epochs) >= 3 + 2 * resumed
    assert {r["kind"] for r in epochs} == {"epoch"}
    assert {r["rank"] for r in epochs} == {0}
    assert [r["epoch"] for r in epochs] == list(range(len(epochs)))
    times = [r["time"] for r in epochs]
    if resumed:  # restored with the times the first run stamped
        assert times[:2] == [earlier[name][0, 0], earlier[name][1, 0]]
        times = times[2:]
    assert all(0 < a < b for a, b in zip(times, times[1:], strict=False))


def _read(err: Any) -> str:
    """All a run has written so far to ``err``, a file open for reading too."""
    err.seek(0)
    return err.read()


def _open_paths(process: psutil.Process) -> set[str]:
    try:
        return {f.path for f in process.open_files()}
    except psutil.NoSuchProcess:
        return set()


def test_sigterm_ends_a_run_with_workers_as_ctrl_c_does(tmp_path: Path) -> None:
    """SIGTERM to ``graphwire train --workers 2`` (``timeout``, a job
    scheduler, ``kill PID``) ended it with 143 and no message: the
    launcher's handler replaced the command line's. Now it ends as a
    single-process run does: its workers stopped, its scratch folder
    removed, ``graphwire: interrupted``, exit 130."""
    scratch = tmp_path / "tmp"
    scratch.mkdir()
    out = tmp_path / "run"
    argv = [sys.executable, "-m", "graphwire", "train", "--dataset", SPEC]
    argv += ["--mode", "minibatch", "--workers", "2", "--fanouts", "3,3"]
    argv += ["--epochs", "300", "--quiet", "--timeout", "120", "--out", str(out)]
    run = subprocess.Popen(
        argv,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "TMPDIR": str(scratch)},
    )
    try:
        deadline = time.monotonic() + 120
        while not (out / "metrics.jsonl.partial").exists():  # it trains
            assert run.poll() is None, run.communicate()[1][-3000:]
            assert time.monotonic() < deadline, "no epoch streamed in 120 s"
            time.sleep(0.1)
        workers = worker_children(run.pid)
        assert len(workers) == 2
        run.send_signal(signal.SIGTERM)
        _, stderr = run.communicate(timeout=60)
    finally:
        if run.poll() is None:
            run.kill()
            run.communicate()
    assert run.returncode == 130, stderr[-3000:]
    assert stderr.strip().splitlines()[-1] == "graphwire: interrupted"
    _, alive = psutil.wait_procs(workers, timeout=10)
    assert alive == []
    assert list(scratch.glob("graphwire-*")) == []


def test_minibatch_rapid_under_torchrun_equals_spawned_on_demand(
    tmp_path: Path, capfd: Capture
) -> None:
    """`--mode minibatch`: the summary line carries the fetch figures, and
    rapid (under torchrun) and on-demand (spawned) reach the same accuracy,
    the same batches giving the same weights."""
    torchrun = _torchrun()
    common = ["train", "--model", "sage", "--mode", "minibatch", "--dataset", SPEC]
    common += ["--epochs", "3", "--seed", "1", "--quiet", "--timeout", "120"]
    common += ["--batch-size", "40", "--fanouts", "4,6"]
    spawned = graphwire(
        capfd, *common, "--workers", "2", "--fetch", "on-demand",
        "--out", str(tmp_path / "spawned"),
    ).summary()  # fmt: skip
    launched = _run(
        [torchrun, "--nproc-per-node", "2", "--master-addr", "127.0.0.1"]
        + ["--master-port", str(free_port()), "-m", "graphwire", *common]
        + ["--fetch", "rapid", "--out", str(tmp_path / "torchrun")]
    )
    for key in ("seeds_per_s", "remote_rows", "remote_bytes", "cache_hit_rate"):
        assert key in spawned and key in launched, key
    assert spawned["test_acc"] == launched["test_acc"]
    assert float(spawned["cache_hit_rate"]) == 0.0
    assert float(launched["cache_hit_rate"]) > 0.0
    assert int(launched["remote_rows"]) < int(spawned["remote_rows"])
    # metrics.jsonl: every rank's set-up, epoch and teardown records add up
    # to the summary (rapid's first cache fill was in none of them).
    for out, summary in (("spawned", spawned), ("torchrun", launched)):
        records = [
            json.loads(line) for line in (tmp_path / out / "metrics.jsonl").open()
        ]
        kinds = [r["kind"] for r in records]
        ranks = ["setup"] * 2 + ["epoch"] * 6 + ["teardown"] * 2
        assert kinds == ["config", *ranks, "summary"], kinds
        windows = [r for r in records if r["kind"] in ("setup", "epoch", "teardown")]
        for key in ("bytes_sent", "bytes_recv"):
            assert sum(w["comm"][key] for w in windows) == int(summary[key]), key
        for key in ("remote_rows", "remote_bytes"):
            assert sum(w["extra"][key] for w in windows) == int(summary[key]), key


def _two_nodes(common: list[str], tmp_path: Path) -> list[str]:
    """``torchrun --nnodes 2`` of 2 processes each, as on two machines (here
    both on loopback), each with its own ``--out`` (``node0``, ``node1``);
    their stdouts."""
    torchrun = _torchrun()
    port = str(free_port())
    nodes = [
        subprocess.Popen(
            [torchrun, "--nnodes", "2", "--node-rank", str(node)]
            + ["--nproc-per-node", "2", "--master-addr", "127.0.0.1"]
            + ["--master-port", port, "-m", "graphwire", *common]
            + ["--out", str(tmp_path / f"node{node}")],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            start_new_session=True,  # its workers share its process group
        )
        for node in (0, 1)
    ]
    outputs = []
    try:
        for node in nodes:  # about 20 s; a wrong rank mapping hangs instead
            outputs.append(node.communicate(timeout=150))
    finally:
        for node in nodes:
            if node.poll() is None:
                os.killpg(node.pid, signal.SIGKILL)  # the launcher and its workers
                node.communicate()
    for node, (_, stderr) in zip(nodes, outputs, strict=True):
        assert node.returncode == 0, stderr[-3000:]
    return [stdout for stdout, _ in outputs]


def test_two_torchrun_nodes_give_the_same_run_as_four_workers(
    tmp_path: Path, capfd: Capture
) -> None:
    """``torchrun --nnodes 2``: two launchers (node ranks 0 and 1) make one
    4-rank job, global ranks from the launchers, equal to ``--workers 4``
    (a one-node torchrun is the same with one launcher). Global rank 0's
    ``metrics.jsonl`` holds every rank's records: the config (how the graph
    was split, every G3 setting, given or default), each rank's set-up, one
    record per epoch at the time its rank finished it, its teardown, adding up
    to the summary. The nodes share no ``--out``: each keeps its own ranks'
    checkpoints, marked complete and pruned by its first rank, with what a
    resume checks (node 1 used to get no ``latest.json``, and every rank
    refused to resume; a one-node resume under torchrun is run in
    tests/multiprocess/test_torchrun_failures.py)."""
    flags = ("--checkpoint-every", "1", "--g3-order", "priority")
    common, spawned = _spawned_g3(capfd, tmp_path, 4, *flags)
    stdouts = _two_nodes(common, tmp_path)
    # Global rank 0 (on node 0) prints the summary and writes every rank's records.
    launched = _summary(stdouts[0])
    assert launched["workers"] == spawned["workers"] == "4"
    for key in ("test_acc", "val_acc", "epochs", "bytes_sent", "bytes_recv"):
        assert spawned[key] == launched[key], key
    assert int(spawned["bytes_sent"]) > 0
    assert "summary " not in stdouts[1]
    _check_records(tmp_path / "node0", launched, world=4, epochs=4)
    # Node 1's local rank 0 (global rank 2) writes no records, but marks its
    # node's checkpoints: the newest epoch's, its own ranks' files only.
    # Both record the parts, which a resume checks (node 1's had none).
    assert not list((tmp_path / "node1").glob("metrics.jsonl*"))
    for node, own in ((0, {"rank0.pt", "rank1.pt"}), (1, {"rank2.pt", "rank3.pt"})):
        folder = tmp_path / f"node{node}" / "checkpoints"
        latest = json.loads((folder / "latest.json").read_text())
        assert latest["epoch"] == 3
        assert latest["parts"] == parts_digest(tmp_path / "parts")
        assert sorted(p.name for p in folder.glob("epoch*")) == ["epoch000003"]
        assert {p.name for p in (folder / "epoch000003").iterdir()} == own


def _check_records(out: Path, summary: dict[str, str], world: int, epochs: int) -> None:
    """``out/metrics.jsonl`` of a finished full-graph run (G3, TRAIN's
    settings with ``--g3-order priority``): see the test above."""
    records = [json.loads(line) for line in (out / "metrics.jsonl").open()]
    assert not (out / "metrics.jsonl.partial").exists()
    assert records[0]["kind"] == "config" and records[0]["workers"] == world
    assert records[0]["backend"] == default_backend(world)  # a GPU each, or gloo
    assert records[0]["partition"] == "metis"
    assert records[0]["parts"] == str(out.parent / "parts")
    assert records[0]["exchange_options"] == {
        "mode": "full",
        "bin_mb": 256.0,
        "bin_rows": 64,  # TRAIN's
        "order": "priority",
        "sync": "layer",
        "last": None,
        "staleness": "none",
        "staleness_norm": "relative",
    }
    kinds = [r["kind"] for r in records]
    ranks = ["setup"] * world + ["epoch"] * (epochs * world) + ["teardown"] * world
    assert kinds == ["config", *ranks, "summary"], kinds
    epoch_records = [r for r in records if r["kind"] == "epoch"]
    assert sorted((r["epoch"], r["rank"]) for r in epoch_records) == [
        (e, r) for e in range(epochs) for r in range(world)
    ]
    assert all(r["comm"]["bytes_sent"] > 0 for r in epoch_records)
    for rank in range(world):
        times = [r["time"] for r in epoch_records if r["rank"] == rank]
        assert all(0 < a < b for a, b in zip(times, times[1:], strict=False))
    assert records[-1]["time"] >= max(r["time"] for r in epoch_records)
    # Every rank's set-up, epoch and teardown records add up to the summary
    # (the set-up collectives and each epoch's table sum were in none).
    windows = [r for r in records if r["kind"] in ("setup", "epoch", "teardown")]
    for key in ("bytes_sent", "bytes_recv"):
        assert sum(w["comm"][key] for w in windows) == int(summary[key]), key


def test_replicate_reports_the_rows_it_holds_and_recomputes(
    tmp_path: Path, capfd: Capture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``--exchange replicate`` holds each part's whole 2-hop in-neighbourhood:
    the summary's ``replicated_rows`` counts it beyond the owned nodes, and
    ``redundant_rows`` the rows computed beyond them (layer 0's 1-hop halo,
    which ``remote_rows`` also counts), checked against the global graph.
    Its 2 workers on 2 cores say nothing of CPU sharing."""
    from graphwire.graph.datasets import load_dataset
    from graphwire.partition import load_part

    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1})  # 2 cores
    common = _g3_on_parts(capfd, tmp_path, 2)
    common[common.index("g3")] = "replicate"
    del common[common.index("--bin-rows") : common.index("--bin-rows") + 2]
    ran = graphwire(
        capfd, *common, "--workers", "2", "--out", str(tmp_path / "replicate")
    )
    summary = ran.summary()
    assert "warning" not in ran.stderr
    graph = load_dataset(SPEC)
    src, dst = graph.edge_index()
    held = halo = 0
    for rank in range(2):
        owned = torch.zeros(graph.num_nodes, dtype=torch.bool)
        owned[load_part(tmp_path / "parts", rank).orig_nid.to(torch.int64)] = True
        hop1 = owned.clone()
        hop1[src[owned[dst]]] = True
        hop2 = hop1.clone()
        hop2[src[hop1[dst]]] = True
        held += int(hop2.sum() - owned.sum())
        halo += int(hop1.sum() - owned.sum())
    assert int(summary["replicated_rows"]) == held > halo
    assert int(summary["redundant_rows"]) == int(summary["remote_rows"]) == halo


def test_gat_flags_reach_every_worker(
    tmp_path: Path, capfd: Capture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """--heads and --out-heads shape every rank's GAT (its checkpoint's
    attention vectors are [heads, hidden]); --attn-dropout is in the run's
    config record. On a machine of 1 core, its 2 workers are warned of, once,
    and the run goes on."""
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0})  # 1 core
    out = tmp_path / "run"
    argv = ["train", "--dataset", SPEC]
    argv += ["--model", "gat", "--hidden", "5", "--heads", "3", "--out-heads", "2"]
    argv += ["--attn-dropout", "0.25", "--workers", "2", "--epochs", "1"]
    argv += ["--checkpoint-every", "1", "--quiet", "--timeout", "60"]
    ran = graphwire(capfd, *argv, "--out", str(out))
    ran.summary()
    warned = [line for line in ran.stderr.splitlines() if "warning" in line]
    assert warned == [
        "graphwire: warning: 2 workers on this machine's 1 core: they take "
        "turns on the CPUs, so the run's times measure CPU sharing, not "
        "communication"
    ]
    for rank in (0, 1):
        state = torch.load(
            out / "checkpoints" / "epoch000000" / f"rank{rank}.pt", weights_only=False
        )["model"]
        assert state["layers.0.att_src"].shape == (3, 5)
        assert state["layers.1.att_src"].shape == (2, 4)
    config = json.loads((out / "metrics.jsonl").open().readline())
    assert (config["heads"], config["out_heads"], config["attn_dropout"]) == (
        3,
        2,
        0.25,
    )
