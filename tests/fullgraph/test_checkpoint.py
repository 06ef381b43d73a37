"""Checkpoint index: a resume is refused, naming why, when the run that wrote
the checkpoints had other settings or another number of ranks."""

from __future__ import annotations

import json
import zipfile

import pytest

from graphwire.run.checkpoint import (
    CheckpointConfig,
    check_resume,
    load_checkpoint,
    mark_complete,
    save_checkpoint,
    saved_epochs,
)

RUN = {"dataset": "planetoid:cora", "model": "gcn", "lr": 0.01, "fanouts": [10, 25]}


def _state(epoch: int) -> dict:
    """A training loop's state after ``epoch``, as far as the files care."""
    return {
        "epoch": epoch,
        "model": {},
        "optimizer": {},
        "rng": None,
        "best": {},
        "records": [],
    }


def test_a_resume_with_the_same_settings_finds_the_latest_epoch(tmp_path) -> None:
    config = CheckpointConfig(str(tmp_path), every=1, run=RUN)
    assert check_resume(config, 2) is None  # nothing written yet
    mark_complete(config, 3, 2)
    mark_complete(config, 5, 2)
    assert check_resume(CheckpointConfig(str(tmp_path), run=dict(RUN)), 2) == 5


def test_a_resume_with_other_settings_is_refused_naming_them(tmp_path) -> None:
    mark_complete(CheckpointConfig(str(tmp_path), run=RUN), 3, 2)
    changed = {**RUN, "lr": 0.1, "model": "sage"}
    with pytest.raises(ValueError) as caught:
        check_resume(CheckpointConfig(str(tmp_path), run=changed), 2)
    message = str(caught.value)
    assert "the run was started with other settings:" in message
    assert "lr 0.01 (now 0.1), model 'gcn' (now 'sage')" in message
    assert "dataset" not in message and "fanouts" not in message
    added = {**RUN, "heads": 8}  # a setting the writer did not have
    with pytest.raises(ValueError, match=r"heads None \(now 8\)"):
        check_resume(CheckpointConfig(str(tmp_path), run=added), 2)
    with pytest.raises(ValueError, match="written by 2 ranks, resuming with 3"):
        check_resume(CheckpointConfig(str(tmp_path), run=RUN), 3)


def test_a_resume_on_other_parts_is_refused(tmp_path) -> None:
    """The same settings on other parts (the graph split again, or another
    graph in the same folder) would load weights trained on other nodes,
    or fail in ``load_state_dict``: refused, naming the parts."""
    mark_complete(CheckpointConfig(str(tmp_path), run=RUN, parts="a" * 64), 3, 2)
    same = CheckpointConfig(str(tmp_path), run=RUN, parts="a" * 64)
    assert check_resume(same, 2) == 3
    assert check_resume(CheckpointConfig(str(tmp_path), run=RUN), 2) == 3
    other = CheckpointConfig(str(tmp_path), run=RUN, parts="b" * 64)
    with pytest.raises(ValueError, match="the run trained on other parts"):
        check_resume(other, 2)


def test_ranks_that_find_different_checkpoints_all_refuse_to_resume(
    tmp_path,
) -> None:
    """Two machines that do not share ``--out``: rank 1 finds no
    ``latest.json`` and would train on from fresh weights, in step with rank
    0 (restored) until the run ends apart. Every rank refuses, naming what
    each found; ranks that agree resume."""
    from graphwire.comm.local import run_local
    from graphwire.run.state import load_on_every_rank

    shared = CheckpointConfig(str(tmp_path / "shared"), every=1, run=RUN)
    for rank in (0, 1):
        save_checkpoint(shared, 3, rank, _state(3))
    mark_complete(shared, 3, 2)
    elsewhere = CheckpointConfig(str(tmp_path / "node1"), every=1, run=RUN)

    def resume(transport, configs) -> object:
        config = configs[transport.rank]
        return load_on_every_rank(
            CheckpointConfig(config.folder, run=RUN, resume=True), transport
        )

    states = run_local(lambda t: resume(t, [shared, shared]), 2)
    assert [state["epoch"] for state in states] == [3, 3]
    with pytest.raises(ValueError) as caught:
        run_local(lambda t: resume(t, [shared, elsewhere]), 2)
    assert "the ranks found different checkpoints there (rank 0 epoch 3, " in str(
        caught.value
    )
    assert "rank 1 none)" in str(caught.value)


@pytest.mark.parametrize(
    ("field", "value"), [("run", "abc"), ("run", ["a"]), ("parts", 7)]
)
def test_a_latest_json_with_a_malformed_field_is_named(tmp_path, field, value) -> None:
    """A ``run`` that is no object used to end in AttributeError."""
    config = CheckpointConfig(str(tmp_path), run=RUN, parts="a" * 64)
    mark_complete(config, 3, 2)
    latest = tmp_path / "latest.json"
    latest.write_text(json.dumps(json.loads(latest.read_text()) | {field: value}))
    with pytest.raises(
        ValueError, match=f"not a graphwire checkpoint index: its '{field}'"
    ):
        check_resume(config, 2)


def test_checkpoints_written_without_settings_still_resume(tmp_path) -> None:
    """An index that records no settings (written by an earlier graphwire)
    constrains nothing; nor does a caller that states none."""
    mark_complete(CheckpointConfig(str(tmp_path)), 4, 2)
    assert check_resume(CheckpointConfig(str(tmp_path), run=RUN), 2) == 4
    mark_complete(CheckpointConfig(str(tmp_path), run=RUN), 6, 2)
    assert check_resume(CheckpointConfig(str(tmp_path)), 2) == 6


def _cli_checkpoint(tmp_path, *flags: str) -> CheckpointConfig:
    """The CheckpointConfig ``graphwire train`` builds from ``flags``."""
    from graphwire.cli import build_parser
    from graphwire.commands.train import flag_table, given_values
    from graphwire.run.build import build_spec
    from graphwire.run.parts import checkpoint_config

    argv = ["train", "--dataset", str(tmp_path), "--workers", "2", *flags]
    table = flag_table()
    spec = build_spec(table, *given_values(table, build_parser().parse_args(argv)))
    config = checkpoint_config(spec, tmp_path / "out")
    assert config is not None
    return config


def test_a_resume_may_change_speed_settings_and_keeps_the_schedule(tmp_path) -> None:
    """G3's bins (speed and memory) and mini-batch settings a full-graph run
    does not use are not part of what a resume must keep; the dataset path is
    compared resolved; a resume without --checkpoint-every keeps the run's."""
    first = _cli_checkpoint(tmp_path, "--exchange", "g3", "--checkpoint-every", "3")
    assert {"bin_rows", "fanouts", "batch_size", "options"}.isdisjoint(first.run)
    assert first.run["dataset"] == str(tmp_path.resolve())
    mark_complete(first, 5, 2)
    again = _cli_checkpoint(
        tmp_path, "--exchange", "g3", "--resume", "--bin-rows", "64", "--bin-mb", "8"
    )
    assert again.every == 3
    assert check_resume(again, 2) == 5
    assert again.keep == 1  # the default, as the run was started
    other = _cli_checkpoint(tmp_path, "--exchange", "halo", "--resume")
    with pytest.raises(ValueError, match=r"exchange 'g3' \(now 'halo'\)"):
        check_resume(other, 2)


@pytest.mark.parametrize(
    ("keep", "left"), [(1, [8]), (2, [6, 8]), (0, [0, 2, 4, 6, 8])]
)
def test_only_the_newest_checkpoints_are_kept(tmp_path, keep, left) -> None:
    """Completing an epoch removes the checkpoints before it but the newest
    ``keep`` (0: none removed); the latest still resumes."""
    config = CheckpointConfig(str(tmp_path), every=2, run=RUN, keep=keep)
    for epoch in (0, 2, 4, 6, 8):
        for rank in (0, 1):
            save_checkpoint(config, epoch, rank, _state(epoch))
        mark_complete(config, epoch, 2)
        assert saved_epochs(tmp_path)[-1] == epoch
    assert saved_epochs(tmp_path) == left
    assert load_checkpoint(config, 1, 2) == _state(8) | {"rank": 1}
    # A run resumed from epoch 2 that completes epoch 4 removes the folders
    # of later epochs the attempt before it left (it has not got there).
    for rank in (0, 1):
        save_checkpoint(config, 4, rank, _state(4))
    mark_complete(config, 4, 2)
    assert saved_epochs(tmp_path) == ([0, 2, 4] if keep == 0 else [4])
    with pytest.raises(ValueError, match="checkpoints to keep: expected >= 0"):
        CheckpointConfig(str(tmp_path), keep=-1)


def test_a_resume_keeps_the_count_of_checkpoints_the_run_keeps(tmp_path) -> None:
    """``--keep-checkpoints K`` reaches the config and ``latest.json``; a
    resume without the flag keeps K (a run that kept every checkpoint does
    not lose them on resuming), and one with it takes the new count."""
    flags = ("--exchange", "g3", "--checkpoint-every", "2")
    first = _cli_checkpoint(tmp_path, *flags, "--keep-checkpoints", "0")
    assert first.keep == 0
    for epoch in (1, 3):
        for rank in (0, 1):
            save_checkpoint(first, epoch, rank, {"epoch": epoch})
        mark_complete(first, epoch, 2)
    resumed = _cli_checkpoint(tmp_path, "--exchange", "g3", "--resume")
    assert (resumed.keep, resumed.every) == (0, 2)
    for rank in (0, 1):
        save_checkpoint(resumed, 5, rank, {"epoch": 5})
    mark_complete(resumed, 5, 2)
    assert saved_epochs(tmp_path / "out" / "checkpoints") == [1, 3, 5]
    fewer = _cli_checkpoint(tmp_path, *flags, "--resume", "--keep-checkpoints", "2")
    assert fewer.keep == 2
    mark_complete(fewer, 5, 2)
    assert saved_epochs(tmp_path / "out" / "checkpoints") == [3, 5]


def test_a_damaged_or_swapped_checkpoint_file_is_refused_naming_it(tmp_path) -> None:
    """A rank's file that is truncated, not a torch file, not a training
    state, or another epoch's or rank's (copied in by hand) is an error naming
    the file, not a torch traceback or ranks resuming at different epochs."""
    import shutil

    config = CheckpointConfig(str(tmp_path), every=1, run=RUN)
    for epoch in (2, 3):
        for rank in (0, 1):
            save_checkpoint(config, epoch, rank, _state(epoch))
    mark_complete(CheckpointConfig(str(tmp_path), every=1, run=RUN, keep=0), 3, 2)
    resume = CheckpointConfig(str(tmp_path), every=1, run=RUN, resume=True)
    assert load_checkpoint(resume, 1, 2)["epoch"] == 3
    latest = tmp_path / "epoch000003"
    shutil.copy(tmp_path / "epoch000002" / "rank1.pt", latest / "rank1.pt")
    with pytest.raises(
        ValueError,
        match=r"rank1.pt: holds the state of rank 1 after"
        r" epoch 2, not of rank 1 after epoch 3",
    ):
        load_checkpoint(resume, 1, 2)
    shutil.copy(latest / "rank0.pt", latest / "rank1.pt")
    with pytest.raises(
        ValueError, match="state of rank 0 after epoch 3, not of rank 1"
    ):
        load_checkpoint(resume, 1, 2)
    whole = (latest / "rank0.pt").read_bytes()
    for damaged, why in (
        (whole[: len(whole) // 2], "cut short or damaged: "),
        (whole[:1000], "cut short or damaged: "),
        (b"", "the file is empty"),
        (b"not a checkpoint\n", "not a torch.save file of tensors and plain"),
    ):
        (latest / "rank1.pt").write_bytes(damaged)
        with pytest.raises(ValueError, match=r"rank1.pt: not a readable checkpoint"):
            load_checkpoint(resume, 1, 2)
        with pytest.raises(ValueError) as caught:
            load_checkpoint(resume, 1, 2)
        message = str(caught.value)
        assert why in message and "\n" not in message, message
        assert "weights_only" not in message, message  # torch's advice, not ours
    import torch

    torch.save(_state(3), latest / "rank1.pt")  # an older graphwire's: no rank
    assert load_checkpoint(resume, 1, 2)["epoch"] == 3
    torch.save({"epoch": 3}, latest / "rank1.pt")
    with pytest.raises(ValueError, match=r"rank1.pt: not a checkpoint \(no best, "):
        load_checkpoint(resume, 1, 2)
    torch.save([1, 2], latest / "rank1.pt")
    with pytest.raises(ValueError, match=r"rank1.pt: not a checkpoint"):
        load_checkpoint(resume, 1, 2)
    # Bytes damaged inside a tensor's record: torch.load read the file (it
    # checks no CRC), and the ranks resumed with models that differ.
    state = _state(3) | {"rank": 1, "model": {"w": torch.arange(4096.0)}}
    torch.save(state, latest / "rank1.pt")
    whole = bytearray((latest / "rank1.pt").read_bytes())
    with zipfile.ZipFile(latest / "rank1.pt") as archive:
        record = max(archive.infolist(), key=lambda info: info.file_size)
    start = record.header_offset + 30 + len(record.filename) + len(record.extra)
    middle = start + record.file_size // 2
    whole[middle : middle + 64] = bytes(64)
    (latest / "rank1.pt").write_bytes(whole)
    assert torch.load(latest / "rank1.pt", weights_only=True)["epoch"] == 3
    with pytest.raises(ValueError) as caught:
        load_checkpoint(resume, 1, 2)
    assert str(caught.value) == (
        f"{latest / 'rank1.pt'}: not a readable checkpoint (damaged: its record "
        f"{record.filename} fails its CRC-32 check)"
    )


def test_a_rank_file_another_run_wrote_is_refused_naming_it(tmp_path) -> None:
    """A run started into the same folder with other settings or on other
    parts, which died before its ``latest.json``, leaves its files under the
    first run's index: refused, where one with the same shapes resumed with
    the ranks' weights apart, and one with others ended in a torch
    traceback."""
    from dataclasses import replace

    config = CheckpointConfig(str(tmp_path), every=1, run=RUN, parts="a" * 64)
    for rank in (0, 1):
        save_checkpoint(config, 3, rank, _state(3))
    mark_complete(config, 3, 2)
    resume = replace(config, resume=True)
    assert load_checkpoint(resume, 1, 2)["epoch"] == 3
    for other in (replace(config, run={**RUN, "seed": 5}), replace(config, parts="b")):
        save_checkpoint(other, 3, 1, _state(3))
        with pytest.raises(
            ValueError, match=r"rank1.pt: written by another run than the one latest"
        ):
            load_checkpoint(resume, 1, 2)
        assert load_checkpoint(resume, 0, 2)["epoch"] == 3


def test_a_state_that_does_not_fit_the_model_is_refused_in_a_line() -> None:
    """A file changed by hand so its weights fit another model: one line
    naming the rank and epoch, not torch's size-mismatch paragraph."""
    from graphwire.run.collective import seeded_model
    from graphwire.run.config import TrainConfig
    from graphwire.run.state import restore_training_state, training_state
    from graphwire.run.training import BestEpoch, make_optimizer

    def fresh(hidden: int):
        config = TrainConfig(model="gcn", hidden=hidden)
        model = seeded_model(6, 3, config)
        return model, make_optimizer(model, config), BestEpoch(config.patience)

    wide = fresh(16)
    state = training_state(4, *wide, []) | {"rank": 1}
    model, optimizer, best = fresh(8)
    with pytest.raises(ValueError) as caught:
        restore_training_state(state, model, optimizer, best, [])
    message = str(caught.value)
    assert message.startswith(
        "the checkpoint of rank 1 after epoch 4 does not fit this model: "
    )
    assert "\n" not in message
    assert restore_training_state(training_state(4, *fresh(8), []), *fresh(8), []) == 5


def test_machines_sharing_the_folder_mark_and_prune_it_together(tmp_path) -> None:
    """The first rank of each machine marks every checkpoint complete: where
    the machines share the folder, they write the same ``latest.json`` and
    remove the same old epochs at once, neither failing on what the other
    removed first."""
    import threading

    config = CheckpointConfig(str(tmp_path), every=1, run=RUN)
    together = threading.Barrier(2)
    errors: list[BaseException] = []

    def machine() -> None:
        try:
            for epoch in range(12):
                together.wait()
                if threading.current_thread().name == "m0":
                    for rank in range(40):  # many files: removals overlap
                        save_checkpoint(config, epoch, rank, _state(epoch))
                together.wait()
                mark_complete(config, epoch, 40)
        except BaseException as error:  # noqa: BLE001 - reported below
            errors.append(error)
            together.abort()

    threads = [threading.Thread(target=machine, name=f"m{i}") for i in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []
    assert saved_epochs(tmp_path) == [11]
    assert check_resume(config, 40) == 11
