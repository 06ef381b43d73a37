"""Atomic output: what an overwrite may replace, that a refusal deletes
nothing, and the modes of what is written."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from graphwire.fsutil import atomic_dir, check_replaceable, write_json


def graphwire_folder(path: Path) -> Path:
    path.mkdir()
    (path / "meta.json").write_text(json.dumps({"format": "graphwire.graph"}))
    return path


def test_missing_empty_and_graphwire_targets_may_be_replaced(tmp_path: Path) -> None:
    check_replaceable(tmp_path / "new", overwrite=False)
    (tmp_path / "empty").mkdir()
    check_replaceable(tmp_path / "empty", overwrite=True)
    check_replaceable(graphwire_folder(tmp_path / "g"), overwrite=True)
    with pytest.raises(FileExistsError, match="g: already exists"):
        check_replaceable(tmp_path / "g", overwrite=False)


@pytest.mark.parametrize(
    ("make", "found"),
    [
        (lambda p: p.write_text("keep me"), "not a folder"),
        (lambda p: (p.mkdir(), (p / "notes.txt").write_text("keep me")), "without"),
        (
            lambda p: (p.mkdir(), (p / "meta.json").write_text('{"format": "x"}')),
            "without a graphwire meta.json",
        ),
        (lambda p: p.symlink_to(graphwire_folder(p.with_name("real"))), "symbolic"),
    ],
    ids=["file", "foreign folder", "foreign meta", "symlink"],
)
def test_overwrite_never_deletes_what_graphwire_did_not_write(
    tmp_path: Path, make, found: str
) -> None:
    target = tmp_path / "out"
    make(target)
    before = sorted(p.name for p in tmp_path.rglob("*"))
    with pytest.raises(ValueError, match=f"out: .*{found}.*refusing to replace"):
        with atomic_dir(target, overwrite=True) as tmp:
            (tmp / "new.txt").write_text("new")
    assert sorted(p.name for p in tmp_path.rglob("*")) == before  # no temp left


def test_atomic_dir_replaces_a_graphwire_folder(tmp_path: Path) -> None:
    target = graphwire_folder(tmp_path / "out")
    with atomic_dir(target, overwrite=True) as tmp:
        (tmp / "new.txt").write_text("new")
    assert [p.name for p in tmp_path.iterdir()] == ["out"]
    assert [p.name for p in target.iterdir()] == ["new.txt"]


def test_a_target_under_a_file_is_named_before_anything_is_made(
    tmp_path: Path,
) -> None:
    """From Python as from the CLI: not pathlib's bare ``[Errno 17]``."""
    from graphwire.graph.graph import Graph
    from graphwire.graph.native import save_graph

    (tmp_path / "afile").write_text("keep me")
    target = tmp_path / "afile" / "deeper" / "g"
    with pytest.raises(ValueError, match=r"g: is under .*afile, which is a file"):
        save_graph(Graph(indptr=[0, 0], indices=[]), target)
    assert [p.name for p in tmp_path.iterdir()] == ["afile"]


@pytest.mark.parametrize("umask", [0o022, 0o027])
def test_what_is_written_has_the_modes_of_the_umask(tmp_path: Path, umask) -> None:
    """A graph or parts folder is shared (by other users, or a container's
    other uid): mkdtemp's 0700 and mkstemp's 0600 made it private to the
    writer whatever the umask said."""
    before = os.umask(umask)
    try:
        with atomic_dir(tmp_path / "graph") as folder:
            (folder / "x.npy").write_bytes(b"x")
        write_json(tmp_path / "graph" / "meta.json", {"a": 1})
    finally:
        os.umask(before)
    assert (tmp_path / "graph").stat().st_mode & 0o777 == 0o777 & ~umask
    meta = tmp_path / "graph" / "meta.json"
    assert meta.stat().st_mode & 0o777 == 0o666 & ~umask
