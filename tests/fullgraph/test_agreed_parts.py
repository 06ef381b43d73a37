"""Every rank of a job loads its part of the same parts, or every rank
refuses alike (:func:`~graphwire.run.job.load_agreed_part`): on two
machines that do not share ``--out``, the parts rank 0 wrote are not on the
other, whose ranks would fail alone while the others waited on them."""

from __future__ import annotations

from pathlib import Path

import pytest

from graphwire.comm.local import run_local
from graphwire.run.job import load_agreed_part
from tests.fullgraph.dist_helpers import small_graph, write_parts


def _load(folders: list[Path]) -> list[int]:
    """Each rank's owned count, each loading from its own folder."""
    return run_local(
        lambda t: load_agreed_part(str(folders[t.rank]), t).num_owned, len(folders)
    )


def test_ranks_that_load_the_same_parts_get_their_own_part(tmp_path: Path) -> None:
    folder = write_parts(small_graph(), 3, tmp_path, "metis")
    owned = _load([folder] * 3)
    assert sum(owned) == 600 and min(owned) > 0


def test_ranks_that_cannot_load_their_part_are_named_on_every_rank(
    tmp_path: Path,
) -> None:
    folder = write_parts(small_graph(), 3, tmp_path, "metis")
    missing = tmp_path / "node1" / "partitions"
    said: list[str] = []

    def load(transport) -> None:
        where = folder if transport.rank == 0 else missing
        try:
            load_agreed_part(str(where), transport, spans_machines=True)
        except ValueError as error:
            said.append(str(error))
            raise

    with pytest.raises(ValueError):
        run_local(load, 3)
    assert len(said) == 3, "a rank that loaded its part went on alone"
    assert len(set(said)) == 1, said
    assert said[0].startswith(
        f"the parts could not be loaded on ranks 1, 2: {missing}: not a folder"
    )
    assert "give them an --out they share" in said[0]


def test_ranks_that_load_different_parts_are_named(tmp_path: Path) -> None:
    """Copies that differ (one split again, another way) are refused: the
    plans would not match, or match and train on other nodes."""
    graph = small_graph()
    metis = write_parts(graph, 2, tmp_path, "metis")
    chunk = write_parts(graph, 2, tmp_path, "chunk")
    with pytest.raises(ValueError) as caught:
        _load([metis, chunk])
    said = str(caught.value)
    assert said.startswith("the ranks loaded different parts: rank 0 (meta.json")
    assert "), rank 1 (meta.json SHA-256 " in said


def test_a_part_cut_short_is_named_with_its_rank(tmp_path: Path) -> None:
    """On one machine the fix is to write the parts again: it was told to
    share --out between machines, or give each machine a copy."""
    folder = write_parts(small_graph(), 2, tmp_path, "metis")
    labels = folder / "part_1" / "y.npy"
    labels.write_bytes(labels.read_bytes()[:-8])
    with pytest.raises(ValueError) as caught:
        _load([folder, folder])
    said = str(caught.value)
    assert said.startswith(f"the parts could not be loaded on rank 1: {labels}: ")
    assert said.endswith(
        f". Write {folder} again: graphwire partition --dataset GRAPH --parts 2 "
        f"--out {folder} --overwrite (a run's own OUT/partitions is written anew "
        "by a run without --resume)"
    ), said
    assert "machine" not in said

    def on_two_machines(transport) -> int:
        return load_agreed_part(str(folder), transport, spans_machines=True).num_owned

    with pytest.raises(ValueError, match="on several machines, give them an --out"):
        run_local(on_two_machines, 2)


def _spoil_features(folder: Path, part: int) -> Path:
    """Another finite value in the last feature of ``part``, its size, shape
    and dtype kept: only its SHA-256 tells it from the one written."""
    import numpy as np

    path = folder / f"part_{part}" / "x.npy"
    data = bytearray(path.read_bytes())
    data[-4:] = np.float32(0.5).tobytes()
    path.write_bytes(bytes(data))
    return path


def test_a_part_that_fails_its_checksum_is_named_only_when_verified(
    tmp_path: Path,
) -> None:
    """Without ``verify`` the damaged part loads (its checksum is not read),
    as DistDGL's does; with it, every rank refuses, naming rank and file."""
    folder = write_parts(small_graph(), 2, tmp_path, "metis")
    spoiled = _spoil_features(folder, 1)
    assert sum(_load([folder, folder])) == 600

    def verified(transport) -> int:
        return load_agreed_part(str(folder), transport, verify=True).num_owned

    with pytest.raises(ValueError) as caught:
        run_local(verified, 2)
    said = str(caught.value)
    assert said.startswith(
        f"the parts could not be loaded on rank 1: {spoiled}: checksum mismatch"
    )
