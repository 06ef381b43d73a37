"""`graphwire train --workers N` and the same job under torchrun agree exactly."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
import torch

from graphwire.comm.launch import free_port
from graphwire.fullgraph.checkpoint import parts_digest
from tests.comm.launchers import worker_children

SPEC = "synthetic:products?nodes=2000&degree=8&features=16&classes=4&seed=3"
TRAIN = ["train", "--model", "sage", "--exchange", "g3", "--bin-rows", "64"]
TRAIN += ["--epochs", "4", "--seed", "1", "--quiet", "--timeout", "120"]


def _run(argv: list[str]) -> dict[str, str]:
    done = subprocess.run(argv, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    return _summary(done.stdout)


def _summary(stdout: str) -> dict[str, str]:
    """The fields of the summary line, the last line of a run's output."""
    line = stdout.strip().splitlines()[-1]
    assert line.startswith("summary "), stdout[-2000:]
    return dict(pair.split("=", 1) for pair in line.split()[1:])


def _torchrun() -> str:
    """The torchrun beside this interpreter (the test is skipped without it)."""
    torchrun = shutil.which("torchrun", path=str(Path(sys.executable).parent))
    if torchrun is None:
        pytest.skip("torchrun is not installed beside this interpreter")
    return torchrun


def _spawned_g3(
    tmp_path: Path, workers: int, *flags: str
) -> tuple[list[str], dict[str, str]]:
    """METIS parts of SPEC for ``workers`` ranks; the ``graphwire train``
    arguments (:data:`TRAIN` on them, and ``flags``) and the summary of the
    run with ``--workers``."""
    parts = tmp_path / "parts"
    subprocess.run(
        [sys.executable, "-m", "graphwire", "partition", "--dataset", SPEC]
        + ["--method", "metis", "--parts", str(workers), "--out", str(parts)],
        check=True,
        capture_output=True,
    )
    common = [*TRAIN, "--dataset", str(parts), *flags]
    spawned = _run(
        [sys.executable, "-m", "graphwire", *common, "--workers", str(workers)]
        + ["--out", str(tmp_path / "spawned")]
    )
    return common, spawned


def test_workers_and_torchrun_give_the_same_run(tmp_path: Path) -> None:
    torchrun = _torchrun()
    common, spawned = _spawned_g3(tmp_path, 2)
    launched = _run(
        [torchrun, "--nproc-per-node", "2", "--master-addr", "127.0.0.1"]
        + ["--master-port", str(free_port()), "-m", "graphwire", *common]
        + ["--out", str(tmp_path / "torchrun")]
    )
    assert spawned["workers"] == launched["workers"] == "2"
    for key in ("test_acc", "val_acc", "epochs", "bytes_sent", "bytes_recv"):
        assert spawned[key] == launched[key], key
    assert int(spawned["bytes_sent"]) > 0
    # metrics.jsonl: the config, one epoch record per rank and epoch, each
    # at the time its rank finished it, then the summary; the partial file
    # rank 0 streamed while it trained is gone.
    records = [
        json.loads(line) for line in (tmp_path / "torchrun" / "metrics.jsonl").open()
    ]
    assert not (tmp_path / "torchrun" / "metrics.jsonl.partial").exists()
    assert records[0]["kind"] == "config" and records[0]["workers"] == 2
    epochs = [r for r in records if r["kind"] == "epoch"]
    assert sorted((r["epoch"], r["rank"]) for r in epochs) == [
        (e, r) for e in range(4) for r in range(2)
    ]
    assert all(r["comm"]["bytes_sent"] > 0 for r in epochs)
    for rank in (0, 1):
        times = [r["time"] for r in epochs if r["rank"] == rank]
        assert 0 < times[0] < times[1] < times[2] < times[3]
    assert records[-1]["kind"] == "summary"
    assert records[-1]["time"] >= max(r["time"] for r in epochs)
    # Every rank's set-up, epoch and teardown records add up to the summary
    # (the set-up collectives and each epoch's table sum were in none).
    kinds = [r["kind"] for r in records]
    ranks = ["setup"] * 2 + ["epoch"] * 8 + ["teardown"] * 2
    assert kinds == ["config", *ranks, "summary"], kinds
    windows = [r for r in records if r["kind"] in ("setup", "epoch", "teardown")]
    for key in ("bytes_sent", "bytes_recv"):
        assert sum(w["comm"][key] for w in windows) == int(launched[key]), key


@pytest.mark.parametrize(
    ("mode", "resumed"),
    [
        (["--model", "gcn"], False),
        (["--mode", "minibatch", "--batch-size", "400"], False),
        (["--model", "gcn"], True),
        (["--mode", "minibatch", "--batch-size", "400"], True),
    ],
    ids=["full-graph", "mini-batch", "full-graph-resumed", "mini-batch-resumed"],
)
def test_rank_0_streams_its_epochs_and_a_late_failure_leaves_them(
    tmp_path: Path, mode: list[str], resumed: bool
) -> None:
    """While a run trains, ``metrics.jsonl.partial`` grows with rank 0's
    epoch records; a worker killed late ends the run with them kept (and no
    new ``metrics.jsonl``, which would look complete). A resumed run's file
    starts with the epochs its checkpoint restored, with their times, and the
    finished run's ``metrics.jsonl`` is left as it was."""
    out = tmp_path / "run"
    partial = out / "metrics.jsonl.partial"
    argv = [sys.executable, "-m", "graphwire", "train", "--dataset", SPEC, *mode]
    argv += ["--workers", "2", "--quiet", "--timeout", "60", "--out", str(out)]
    earlier: dict[tuple[int, int], float] = {}
    if resumed:
        _run([*argv, "--epochs", "2", "--checkpoint-every", "1"])
        earlier = _epoch_times(out / "metrics.jsonl")
        finished = (out / "metrics.jsonl").read_bytes()
        argv += ["--resume", "--checkpoint-every", "1"]
    run = subprocess.Popen(
        [*argv, "--epochs", "100000"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + 120
        while _epoch_lines(partial) < 3 + 2 * resumed:
            assert run.poll() is None, run.communicate()[1][-3000:]
            assert time.monotonic() < deadline, "no epochs streamed in 120 s"
            time.sleep(0.2)
        # The worker not writing the file: rank 1.
        workers = [
            child
            for child in psutil.Process(run.pid).children(recursive=True)
            if any("spawn_main" in part for part in child.cmdline())
        ]
        writing = [w for w in workers if str(partial) in _open_paths(w)]
        assert len(workers) == 2 and len(writing) == 1
        next(w for w in workers if w not in writing).kill()
        _, stderr = run.communicate(timeout=120)
    finally:
        if run.poll() is None:  # SIGTERM: the launcher stops its workers
            run.terminate()
            try:
                run.communicate(timeout=30)
            except subprocess.TimeoutExpired:
                run.kill()
                run.communicate()
    assert run.returncode != 0 and "rank 1" in stderr, stderr[-3000:]
    if resumed:
        assert (out / "metrics.jsonl").read_bytes() == finished
    else:
        assert not (out / "metrics.jsonl").exists()
    records = [json.loads(line) for line in partial.open()]
    assert records[0]["kind"] == "config" and records[0]["workers"] == 2
    epochs = records[1:]
    assert len(epochs) >= 3 + 2 * resumed
    assert {r["kind"] for r in epochs} == {"epoch"}
    assert {r["rank"] for r in epochs} == {0}
    assert [r["epoch"] for r in epochs] == list(range(len(epochs)))
    times = [r["time"] for r in epochs]
    if resumed:  # restored with the times the first run stamped
        assert times[:2] == [earlier[0, 0], earlier[1, 0]]
        times = times[2:]
    assert all(0 < a < b for a, b in zip(times, times[1:], strict=False))


def _epoch_lines(path: Path) -> int:
    """Complete epoch lines in ``path`` so far (0 while it does not exist)."""
    try:
        text = path.read_text()
    except FileNotFoundError:
        return 0
    return sum(1 for line in text.splitlines(keepends=True)[1:] if line.endswith("\n"))


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
    tmp_path: Path,
) -> None:
    """`--mode minibatch`: the summary line carries the fetch figures, and
    rapid (under torchrun) and on-demand (spawned) reach the same accuracy,
    the same batches giving the same weights."""
    torchrun = _torchrun()
    common = ["train", "--model", "sage", "--mode", "minibatch", "--dataset", SPEC]
    common += ["--epochs", "3", "--seed", "1", "--quiet", "--timeout", "120"]
    common += ["--batch-size", "40", "--fanouts", "4,6"]
    spawned = _run(
        [sys.executable, "-m", "graphwire", *common, "--workers", "2"]
        + ["--fetch", "on-demand", "--out", str(tmp_path / "spawned")]
    )
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


def _two_nodes(common: list[str], tmp_path: Path, *flags: str) -> list[str]:
    """``torchrun --nnodes 2`` of 2 processes each, as on two machines (here
    both on loopback), each with its own ``--out`` (``node0``, ``node1``);
    their stdouts."""
    torchrun = _torchrun()
    port = str(free_port())
    nodes = [
        subprocess.Popen(
            [torchrun, "--nnodes", "2", "--node-rank", str(node)]
            + ["--nproc-per-node", "2", "--master-addr", "127.0.0.1"]
            + ["--master-port", port, "-m", "graphwire", *common, *flags]
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


def test_two_torchrun_nodes_give_the_same_run_as_four_workers(tmp_path: Path) -> None:
    """``torchrun --nnodes 2``: two launchers (node ranks 0 and 1) make one
    4-rank job, global ranks from the launchers, equal to ``--workers 4``.
    The nodes share no ``--out``: each keeps its own ranks' checkpoints,
    marked complete and pruned by its first rank, and a resume reads them
    (node 1 used to get no ``latest.json``, and every rank refused)."""
    common, spawned = _spawned_g3(tmp_path, 4, "--checkpoint-every", "1")
    stdouts = _two_nodes(common, tmp_path)
    # Global rank 0 (on node 0) prints the summary and writes every rank's records.
    launched = _summary(stdouts[0])
    assert launched["workers"] == spawned["workers"] == "4"
    for key in ("test_acc", "val_acc", "epochs", "bytes_sent", "bytes_recv"):
        assert spawned[key] == launched[key], key
    records = [
        json.loads(line) for line in (tmp_path / "node0" / "metrics.jsonl").open()
    ]
    ranks = {r["rank"] for r in records if r["kind"] == "epoch"}
    assert ranks == {0, 1, 2, 3}
    assert "summary " not in stdouts[1]
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
    resumed = _summary(_two_nodes(common, tmp_path, "--resume", "--epochs", "6")[0])
    assert (resumed["resumed_at"], resumed["epochs"]) == ("4", "6")


def test_a_resumed_run_keeps_its_parts_and_counts_its_own_epochs(
    tmp_path: Path,
) -> None:
    """``--resume`` trains on the parts the run was split into (locality
    here, though the flag is left out), and its byte tables and summary say
    that they count the epochs from the checkpoint on."""
    out = str(tmp_path / "run")
    common = [sys.executable, "-m", "graphwire", "train", "--dataset", SPEC]
    common += ["--model", "gcn", "--workers", "2", "--seed", "1", "--quiet"]
    common += ["--timeout", "120", "--checkpoint-every", "1", "--out", out]

    def train(*flags: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [*common, *flags], capture_output=True, text=True, timeout=300
        )

    first = train("--epochs", "2", "--partition", "locality")
    assert first.returncode == 0, first.stderr[-3000:]
    assert first.stdout.count("locality refinement:") == 1  # printed once
    resumed = train("--epochs", "3", "--resume")
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    text = " ".join(resumed.stdout.split())
    assert "partition: " not in text  # not split again
    assert "bytes by tag (all ranks, epochs 2-2, resumed)" in text
    before, after = _summary(first.stdout), _summary(resumed.stdout)
    assert after["resumed_at"] == "2" and after["epochs"] == "3"
    assert after["remote_rows"] == before["remote_rows"]
    # Only the newest checkpoint is kept (the default --keep-checkpoints 1).
    assert sorted(p.name for p in (tmp_path / "run" / "checkpoints").iterdir()) == [
        "epoch000002",
        "latest.json",
    ]
    # Resuming with another partitioner is refused, saying why.
    other = train("--epochs", "3", "--resume", "--partition", "metis")
    assert other.returncode == 2
    assert "partitioned with locality, not --partition metis" in other.stderr
    # So is a resume with other training settings, before any worker starts,
    # naming each that differs (not torch's state_dict error).
    changed = train("--epochs", "4", "--resume", "--lr", "0.1", "--model", "sage")
    assert changed.returncode == 2, changed.stderr[-3000:]
    message = " ".join(changed.stderr.split())
    assert "the run was started with other settings:" in message
    assert "lr 0.01 (now 0.1)" in message and "model 'gcn' (now 'sage')" in message
    assert "Traceback" not in changed.stderr


def test_a_resume_splits_again_unless_a_checkpoint_needs_the_parts(
    tmp_path: Path,
) -> None:
    """``--resume`` with no checkpoint yet is a fresh start: the dataset is
    split again, not trained on another dataset's parts left in ``OUT``; one
    with nothing left to train says so; with a checkpoint, the parts it
    trained on must still be there."""
    out = tmp_path / "run"
    argv = [sys.executable, "-m", "graphwire", "train", "--model", "gcn"]
    argv += ["--workers", "2", "--epochs", "2", "--seed", "1", "--quiet"]
    argv += ["--timeout", "120", "--partition", "random", "--out", str(out)]
    meta = out / "partitions" / "meta.json"
    _run([*argv, "--dataset", SPEC])
    assert json.loads(meta.read_text())["num_nodes"] == 2000
    other = SPEC.replace("nodes=2000", "nodes=1500")
    done = subprocess.run(
        [*argv, "--dataset", other, "--resume"], capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert "no checkpoint in" in done.stderr
    assert json.loads(meta.read_text())["num_nodes"] == 1500
    _run([*argv, "--dataset", other, "--checkpoint-every", "1"])
    again = subprocess.run(
        [*argv, "--dataset", other, "--resume"], capture_output=True, text=True
    )
    assert again.returncode == 0, again.stderr[-3000:]
    said = "the checkpoint is of epoch 1, so --epochs 2 leaves nothing to train"
    assert said in " ".join(again.stderr.split())
    assert _summary(again.stdout)["epochs"] == "2"
    shutil.rmtree(out / "partitions")
    gone = subprocess.run(
        [*argv, "--dataset", other, "--resume", "--epochs", "3"],
        capture_output=True,
        text=True,
    )
    assert gone.returncode == 2, gone.stderr[-3000:]
    assert "partitions is gone; the checkpoints hold state" in gone.stderr
    assert "Traceback" not in gone.stderr


def test_a_resume_on_parts_split_again_is_refused(tmp_path: Path) -> None:
    """A partitioned ``--dataset`` split again (here randomly, where the run
    trained on METIS parts) has the same shapes, so the checkpoint would
    load and train on other nodes than the run's: refused before any worker
    starts, and the run's output is left as it was."""
    parts, out = tmp_path / "parts", tmp_path / "run"

    def partition(method: str) -> None:
        subprocess.run(
            [sys.executable, "-m", "graphwire", "partition", "--dataset", SPEC]
            + ["--method", method, "--parts", "2", "--out", str(parts)]
            + ["--overwrite"],
            check=True,
            capture_output=True,
        )

    argv = [sys.executable, "-m", "graphwire", "train", "--model", "gcn"]
    argv += ["--dataset", str(parts), "--workers", "2", "--seed", "1", "--quiet"]
    argv += ["--timeout", "120", "--out", str(out)]
    partition("metis")
    _run([*argv, "--epochs", "2", "--checkpoint-every", "1"])
    before = sorted(p.name for p in out.iterdir())
    partition("random")
    done = subprocess.run(
        [*argv, "--epochs", "3", "--resume"], capture_output=True, text=True
    )
    assert done.returncode == 2, done.stderr[-3000:]
    assert "the run trained on other parts than these" in done.stderr
    assert "Traceback" not in done.stderr
    assert sorted(p.name for p in out.iterdir()) == before


def test_a_run_that_fails_before_its_first_epoch_leaves_the_output_as_it_was(
    tmp_path: Path,
) -> None:
    """A bad part file, or a checkpoint file truncated under a resume, is
    named; the run writes no ``metrics.jsonl.partial``, so the one an earlier
    killed attempt left (its epochs past the checkpoint included) stays."""
    parts, out = tmp_path / "parts", tmp_path / "run"
    subprocess.run(
        [sys.executable, "-m", "graphwire", "partition", "--dataset", SPEC]
        + ["--method", "metis", "--parts", "2", "--out", str(parts)],
        check=True,
        capture_output=True,
    )
    argv = [sys.executable, "-m", "graphwire", "train", "--model", "gcn"]
    argv += ["--workers", "2", "--seed", "1", "--quiet", "--timeout", "120"]
    _run(
        [*argv, "--dataset", str(parts), "--epochs", "2", "--out", str(out)]
        + ["--checkpoint-every", "1"]
    )
    partial, finished = out / "metrics.jsonl.partial", out / "metrics.jsonl"
    earlier, records = b'{"kind": "config"}\n', finished.read_bytes()
    partial.write_bytes(earlier)
    rank_file = out / "checkpoints" / "epoch000001" / "rank1.pt"
    rank_file.write_bytes(rank_file.read_bytes()[:1000])
    done = subprocess.run(
        [*argv, "--dataset", str(parts), "--epochs", "4", "--out", str(out)]
        + ["--resume"],
        capture_output=True,
        text=True,
    )
    assert done.returncode != 0 and f"{rank_file}: not a readable" in done.stderr
    assert partial.read_bytes() == earlier and finished.read_bytes() == records
    halo = parts / "part_1" / "halo_nid.npy"
    halo.write_bytes(halo.read_bytes()[:200])
    fresh = tmp_path / "fresh"
    done = subprocess.run(
        [*argv, "--dataset", str(parts), "--epochs", "2", "--out", str(fresh)],
        capture_output=True,
        text=True,
    )
    assert done.returncode == 2 and f"{halo}: truncated" in done.stderr
    assert not list(fresh.glob("metrics.jsonl*"))


def test_a_resumed_minibatch_run_says_its_counts_start_at_the_checkpoint(
    tmp_path: Path,
) -> None:
    """``--mode minibatch --resume``: the traffic table and the summary
    (``resumed_at=``) say that the rows and bytes count the epochs from the
    checkpoint on, as the full-graph report does."""
    argv = [sys.executable, "-m", "graphwire", "train", "--dataset", SPEC]
    argv += ["--mode", "minibatch", "--model", "sage", "--workers", "2"]
    argv += ["--batch-size", "40", "--fanouts", "4,6", "--seed", "1", "--quiet"]
    argv += ["--timeout", "120", "--checkpoint-every", "1"]
    argv += ["--out", str(tmp_path / "run")]
    metrics = tmp_path / "run" / "metrics.jsonl"
    first = _run([*argv, "--epochs", "2"])
    assert "resumed_at" not in first
    before = _epoch_times(metrics)
    assert set(before) == {(e, r) for e in range(2) for r in range(2)}
    assert all(before[0, r] < before[1, r] for r in range(2))
    done = subprocess.run(
        [*argv, "--epochs", "3", "--resume"], capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert "epochs 2-2, resumed" in " ".join(done.stdout.split())
    resumed = _summary(done.stdout)
    assert resumed["resumed_at"] == "2" and resumed["epochs"] == "3"
    # The epochs restored from the checkpoint keep the times their run
    # stamped; the new one has its own.
    after = _epoch_times(metrics)
    assert {k: v for k, v in after.items() if k[0] < 2} == before
    assert after[2, 0] > 0 and after[2, 1] > 0


def _epoch_times(metrics: Path) -> dict[tuple[int, int], float]:
    """(epoch, rank) -> the record's ``time``, from a finished run's file."""
    records = [json.loads(line) for line in metrics.open()]
    assert not metrics.with_suffix(".jsonl.partial").exists()
    return {(r["epoch"], r["rank"]): r["time"] for r in records if r["kind"] == "epoch"}


@pytest.mark.parametrize("damage", ["truncated", "older"])
def test_a_setting_a_worker_refuses_is_one_line_of_error(
    tmp_path: Path, damage: str
) -> None:
    """A bad input found in the workers (here rank 1's checkpoint file, cut
    short or swapped for an older epoch's) ends the run with exit code 2 and
    the worker's one-line reason, no traceback, and no rank trains on."""
    out = tmp_path / "run"
    argv = [sys.executable, "-m", "graphwire", "train", "--dataset", SPEC]
    argv += ["--model", "gcn", "--workers", "2", "--quiet", "--timeout", "60"]
    argv += ["--checkpoint-every", "1", "--keep-checkpoints", "0", "--out", str(out)]
    _run([*argv, "--epochs", "2"])
    latest = out / "checkpoints" / "epoch000001" / "rank1.pt"
    if damage == "truncated":
        latest.write_bytes(latest.read_bytes()[:1000])
        said = f"rank 1 raised ValueError: {latest}: not a readable checkpoint"
    else:
        shutil.copy(out / "checkpoints" / "epoch000000" / "rank1.pt", latest)
        said = "holds the state of rank 1 after epoch 0, not of rank 1 after epoch 1"
    done = subprocess.run(
        [*argv, "--epochs", "4", "--resume"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 2, done.stderr[-3000:]
    assert said in " ".join(done.stderr.split())
    assert "Traceback" not in done.stderr and "traceback of rank" not in done.stderr
    partial = out / "metrics.jsonl.partial"  # (rank 0 may be stopped sooner)
    lines = partial.read_text().splitlines() if partial.exists() else []
    assert all(json.loads(line).get("epoch", 0) <= 1 for line in lines)


def test_replicate_reports_the_rows_it_holds_and_recomputes(tmp_path: Path) -> None:
    """``--exchange replicate`` holds each part's whole 2-hop in-neighbourhood:
    the summary's ``replicated_rows`` counts it beyond the owned nodes, and
    ``redundant_rows`` the rows computed beyond them (layer 0's 1-hop halo,
    which ``remote_rows`` also counts), checked against the global graph."""
    from graphwire.graph.datasets import load_dataset
    from graphwire.partition import load_part

    common, _ = _spawned_g3(tmp_path, 2)
    common[common.index("g3")] = "replicate"
    del common[common.index("--bin-rows") : common.index("--bin-rows") + 2]
    summary = _run(
        [sys.executable, "-m", "graphwire", *common, "--workers", "2"]
        + ["--out", str(tmp_path / "replicate")]
    )
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


def test_gat_flags_reach_every_worker(tmp_path: Path) -> None:
    """--heads and --out-heads shape every rank's GAT (its checkpoint's
    attention vectors are [heads, hidden]); --attn-dropout is in the run's
    config record."""
    out = tmp_path / "run"
    argv = [sys.executable, "-m", "graphwire", "train", "--dataset", SPEC]
    argv += ["--model", "gat", "--hidden", "5", "--heads", "3", "--out-heads", "2"]
    argv += ["--attn-dropout", "0.25", "--workers", "2", "--epochs", "1"]
    argv += ["--checkpoint-every", "1", "--quiet", "--timeout", "60"]
    _run([*argv, "--out", str(out)])
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
