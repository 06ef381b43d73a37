"""Checkpoint index: a resume is refused, naming why, when the run that wrote
the checkpoints had other settings or another number of ranks."""

from __future__ import annotations

import pytest

from graphwire.fullgraph.checkpoint import (
    CheckpointConfig,
    check_resume,
    mark_complete,
)

RUN = {"dataset": "planetoid:cora", "model": "gcn", "lr": 0.01, "fanouts": [10, 25]}


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


def test_checkpoints_written_without_settings_still_resume(tmp_path) -> None:
    """An index that records no settings (written by an earlier graphwire)
    constrains nothing."""
    mark_complete(CheckpointConfig(str(tmp_path)), 4, 2)
    assert check_resume(CheckpointConfig(str(tmp_path), run=RUN), 2) == 4
