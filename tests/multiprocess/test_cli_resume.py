"""`graphwire train --workers N --resume`: the parts and epochs a resumed run
trains on and counts, and the checkpoints and parts it refuses, in one line,
with its output left as it was."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from tests.multiprocess.cli_runs import SPEC, _epoch_times, _summary, graphwire

Capture = pytest.CaptureFixture[str]


def test_a_resumed_run_keeps_its_parts_and_counts_its_own_epochs(
    tmp_path: Path, capfd: Capture
) -> None:
    """``--resume`` trains on the parts the run was split into (locality
    here, though the flag is left out), and its byte tables and summary say
    that they count the epochs from the checkpoint on."""
    out = str(tmp_path / "run")
    common = ["train", "--dataset", SPEC]
    common += ["--model", "gcn", "--workers", "2", "--seed", "1", "--quiet"]
    common += ["--timeout", "120", "--checkpoint-every", "1", "--out", out]

    def train(*flags: str):
        return graphwire(capfd, *common, *flags)

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
    # The parts were numbered rcm (the default), as their meta.json and the
    # run's config record say; resuming with another order is refused too.
    parts = json.loads((tmp_path / "run" / "partitions" / "meta.json").read_text())
    assert parts["node_order"] == "rcm"
    with (tmp_path / "run" / "metrics.jsonl").open() as records:
        config = json.loads(records.readline())
    assert (config["kind"], config["node_order"]) == ("config", "rcm")
    by_id = train("--epochs", "3", "--resume", "--node-order", "id")
    assert by_id.returncode == 2
    assert "the run's parts are numbered rcm, not --node-order id" in by_id.stderr
    # So is a resume with other training settings, before any worker starts,
    # naming each that differs (not torch's state_dict error).
    changed = train("--epochs", "4", "--resume", "--lr", "0.1", "--model", "sage")
    assert changed.returncode == 2, changed.stderr[-3000:]
    message = " ".join(changed.stderr.split())
    assert "the run was started with other settings:" in message
    assert "lr 0.01 (now 0.1)" in message and "model 'gcn' (now 'sage')" in message
    assert "Traceback" not in changed.stderr


def test_a_resume_splits_again_unless_a_checkpoint_needs_the_parts(
    tmp_path: Path, capfd: Capture
) -> None:
    """``--resume`` with no checkpoint yet is a fresh start: the dataset is
    split again, not trained on another dataset's parts left in ``OUT``; one
    with nothing left to train says so; with a checkpoint, the parts it
    trained on must still be there."""
    out = tmp_path / "run"
    argv = ["train", "--model", "gcn"]
    argv += ["--workers", "2", "--epochs", "2", "--seed", "1", "--quiet"]
    argv += ["--timeout", "120", "--partition", "random", "--out", str(out)]
    meta = out / "partitions" / "meta.json"
    graphwire(capfd, *argv, "--dataset", SPEC).summary()
    assert json.loads(meta.read_text())["num_nodes"] == 2000
    other = SPEC.replace("nodes=2000", "nodes=1500")
    done = graphwire(capfd, *argv, "--dataset", other, "--resume")
    assert done.returncode == 0, done.stderr[-3000:]
    assert "no checkpoint in" in done.stderr
    assert json.loads(meta.read_text())["num_nodes"] == 1500
    # A new run into the folder is refused, naming how to replace or resume
    # it, before any work; with --overwrite it replaces it. Every 5 epochs,
    # of 2: the last epoch is checkpointed as the run ends.
    fresh = [*argv, "--dataset", other, "--checkpoint-every", "5"]
    refused = graphwire(capfd, *fresh)
    assert refused.returncode == 2, refused.stderr[-3000:]
    said = " ".join(refused.stderr.split())
    assert "holds an earlier run (metrics.jsonl, checkpoints, partitions)" in said
    assert "pass --overwrite to replace it or --resume to continue it" in said
    graphwire(capfd, *fresh, "--overwrite").summary()
    again = graphwire(capfd, *argv, "--dataset", other, "--resume")
    said = "the checkpoint is of epoch 1, so --epochs 2 leaves nothing to train"
    assert said in " ".join(again.stderr.split())
    assert again.summary()["epochs"] == "2"
    shutil.rmtree(out / "partitions")
    gone = graphwire(capfd, *argv, "--dataset", other, "--resume", "--epochs", "3")
    assert gone.returncode == 2, gone.stderr[-3000:]
    assert "partitions is gone; the checkpoints hold state" in gone.stderr
    assert "Traceback" not in gone.stderr


def test_a_resume_on_parts_split_again_is_refused(
    tmp_path: Path, capfd: Capture
) -> None:
    """A partitioned ``--dataset`` split again (here randomly, where the run
    trained on METIS parts) has the same shapes, so the checkpoint would
    load and train on other nodes than the run's: refused before any worker
    starts, and the run's output is left as it was."""
    parts, out = tmp_path / "parts", tmp_path / "run"

    def partition(method: str) -> None:
        split = graphwire(
            capfd, "partition", "--dataset", SPEC, "--method", method,
            "--parts", "2", "--out", str(parts), "--overwrite",
        )  # fmt: skip
        assert split.returncode == 0, split.stderr[-3000:]

    argv = ["train", "--model", "gcn"]
    argv += ["--dataset", str(parts), "--workers", "2", "--seed", "1", "--quiet"]
    argv += ["--timeout", "120", "--out", str(out)]
    partition("metis")
    graphwire(capfd, *argv, "--epochs", "2", "--checkpoint-every", "1").summary()
    before = sorted(p.name for p in out.iterdir())
    partition("random")
    done = graphwire(capfd, *argv, "--epochs", "3", "--resume")
    assert done.returncode == 2, done.stderr[-3000:]
    assert "the run trained on other parts than these" in done.stderr
    assert "Traceback" not in done.stderr
    assert sorted(p.name for p in out.iterdir()) == before


def test_a_run_that_fails_before_its_first_epoch_leaves_the_output_as_it_was(
    tmp_path: Path, capfd: Capture
) -> None:
    """A bad part file, or a checkpoint file truncated under a resume, is
    named; the run writes no ``metrics.jsonl.partial``, so the one an earlier
    killed attempt left (its epochs past the checkpoint included) stays."""
    parts, out = tmp_path / "parts", tmp_path / "run"
    split = graphwire(
        capfd, "partition", "--dataset", SPEC, "--method", "metis",
        "--parts", "2", "--out", str(parts),
    )  # fmt: skip
    assert split.returncode == 0, split.stderr[-3000:]
    argv = ["train", "--model", "gcn"]
    argv += ["--workers", "2", "--seed", "1", "--quiet", "--timeout", "120"]
    graphwire(
        capfd, *argv, "--dataset", str(parts), "--epochs", "2", "--out", str(out),
        "--checkpoint-every", "1",
    ).summary()  # fmt: skip
    partial, finished = out / "metrics.jsonl.partial", out / "metrics.jsonl"
    earlier, records = b'{"kind": "config"}\n', finished.read_bytes()
    partial.write_bytes(earlier)
    rank_file = out / "checkpoints" / "epoch000001" / "rank1.pt"
    rank_file.write_bytes(rank_file.read_bytes()[:1000])
    done = graphwire(
        capfd, *argv, "--dataset", str(parts), "--epochs", "4", "--out", str(out),
        "--resume",
    )  # fmt: skip
    assert done.returncode != 0 and f"{rank_file}: not a readable" in done.stderr
    assert partial.read_bytes() == earlier and finished.read_bytes() == records
    halo = parts / "part_1" / "halo_nid.npy"
    halo.write_bytes(halo.read_bytes()[:200])
    fresh = tmp_path / "fresh"
    done = graphwire(
        capfd, *argv, "--dataset", str(parts), "--epochs", "2", "--out", str(fresh)
    )
    assert done.returncode == 2 and f"{halo}: truncated" in done.stderr
    assert not list(fresh.glob("metrics.jsonl*"))


def test_a_resumed_minibatch_run_says_its_counts_start_at_the_checkpoint(
    tmp_path: Path, capfd: Capture
) -> None:
    """``--mode minibatch --resume``: the traffic table and the summary
    (``resumed_at=``) say that the rows and bytes count the epochs from the
    checkpoint on, as the full-graph report does."""
    argv = ["train", "--dataset", SPEC]
    argv += ["--mode", "minibatch", "--model", "sage", "--workers", "2"]
    argv += ["--batch-size", "40", "--fanouts", "4,6", "--seed", "1", "--quiet"]
    # Every 3 epochs, of 2: the last epoch is checkpointed as the run ends.
    argv += ["--timeout", "120", "--checkpoint-every", "3"]
    argv += ["--out", str(tmp_path / "run")]
    metrics = tmp_path / "run" / "metrics.jsonl"
    first = graphwire(capfd, *argv, "--epochs", "2").summary()
    assert "resumed_at" not in first
    before = _epoch_times(metrics)
    assert set(before) == {(e, r) for e in range(2) for r in range(2)}
    assert all(before[0, r] < before[1, r] for r in range(2))
    done = graphwire(capfd, *argv, "--epochs", "3", "--resume")
    resumed = done.summary()
    assert "epochs 2-2, resumed" in " ".join(done.stdout.split())
    assert resumed["resumed_at"] == "2" and resumed["epochs"] == "3"
    # The epochs restored from the checkpoint keep the times their run
    # stamped; the new one has its own.
    after = _epoch_times(metrics)
    assert {k: v for k, v in after.items() if k[0] < 2} == before
    assert after[2, 0] > 0 and after[2, 1] > 0


def test_a_setting_a_worker_refuses_is_one_line_of_error(
    tmp_path: Path, capfd: Capture
) -> None:
    """A bad input found in the workers (here rank 1's checkpoint file, cut
    short or swapped for an older epoch's) ends the run with exit code 2 and
    the worker's one-line reason, no traceback, and no rank trains on. Both
    damages are tried on one trained run, its file put back between them."""
    out = tmp_path / "run"
    argv = ["train", "--dataset", SPEC]
    argv += ["--model", "gcn", "--workers", "2", "--quiet", "--timeout", "60"]
    argv += ["--checkpoint-every", "1", "--keep-checkpoints", "0", "--out", str(out)]
    graphwire(capfd, *argv, "--epochs", "2").summary()
    latest = out / "checkpoints" / "epoch000001" / "rank1.pt"
    intact = latest.read_bytes()
    partial = out / "metrics.jsonl.partial"  # (rank 0 may be stopped sooner)
    for damage in ("truncated", "older"):
        latest.write_bytes(intact)
        partial.unlink(missing_ok=True)
        if damage == "truncated":
            latest.write_bytes(intact[:1000])
            said = f"rank 1 raised ValueError: {latest}: not a readable checkpoint"
        else:
            shutil.copy(out / "checkpoints" / "epoch000000" / "rank1.pt", latest)
            said = (
                "holds the state of rank 1 after epoch 0, not of rank 1 after epoch 1"
            )
        done = graphwire(capfd, *argv, "--epochs", "4", "--resume")
        assert done.returncode == 2, (damage, done.stderr[-3000:])
        assert said in " ".join(done.stderr.split()), damage
        assert "Traceback" not in done.stderr, damage
        assert "traceback of rank" not in done.stderr, damage
        lines = partial.read_text().splitlines() if partial.exists() else []
        assert all(json.loads(line).get("epoch", 0) <= 1 for line in lines), damage
