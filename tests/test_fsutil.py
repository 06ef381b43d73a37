"""Atomic output: what an overwrite may replace, that a refusal deletes
nothing, the modes of what is written, and what a killed writer leaves."""

from __future__ import annotations

import fcntl
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from graphwire.fsutil import (
    atomic_dir,
    atomic_file,
    check_creatable,
    check_replaceable,
    write_json,
)


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


def test_write_json_refuses_nan_and_writes_nothing(tmp_path: Path) -> None:
    """json.dump wrote NaN and Infinity, which are not JSON."""
    target = tmp_path / "meta.json"
    for bad in (float("nan"), float("inf")):
        with pytest.raises(ValueError, match="Out of range float values"):
            write_json(target, {"params": {"limit": bad}})
    assert list(tmp_path.iterdir()) == []


_KILLED_WRITER = """
import sys, time
from pathlib import Path
from graphwire.fsutil import atomic_dir, atomic_file
target, kind = Path(sys.argv[1]), sys.argv[2]
opened = atomic_dir(target, overwrite=True) if kind == "dir" else atomic_file(target)
with opened as tmp:
    if kind == "dir":
        (tmp / "part0.npy").write_bytes(b"x" * 4096)
    else:
        tmp.write("half")
    print("writing", flush=True)
    time.sleep(600)
"""


@pytest.mark.parametrize("kind", ["dir", "file"])
def test_a_killed_writers_temporary_is_removed_by_the_next_write(
    tmp_path: Path, kind: str
) -> None:
    """SIGKILL (the OOM killer) runs no clean-up: ``graphwire partition``
    killed mid-write left a hidden ``.p4.*.tmp`` of hundreds of MB beside
    its target for good. The next write of that target removes it."""
    target = tmp_path / ("p4" if kind == "dir" else "meta.json")
    if kind == "dir":
        graphwire_folder(target)  # killed while replacing it: it stays
    writer = subprocess.Popen(
        [sys.executable, "-c", _KILLED_WRITER, str(target), kind],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert writer.stdout is not None
        assert writer.stdout.readline() == "writing\n"
        (left,) = tmp_path.glob(f".{target.name}.*.tmp")
        with atomic_file(tmp_path / "other.json") as other:  # another target's
            other.write("{}")
        assert left.exists()  # its writer runs: kept
    finally:
        writer.send_signal(signal.SIGKILL)
        writer.wait(timeout=30)
    assert left.exists()
    if kind == "dir":
        with atomic_dir(target, overwrite=True) as tmp:
            (tmp / "new.txt").write_text("new")
        assert [p.name for p in target.iterdir()] == ["new.txt"]
    else:
        write_json(target, {"a": 1})
        assert json.loads(target.read_text()) == {"a": 1}
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(
        [target.name, "other.json"]
    )


def test_a_running_writers_temporary_is_kept(tmp_path: Path) -> None:
    """Two writers of one target at once: neither removes the other's
    temporary (each is locked while its writer runs), and what is not
    graphwire's locked kind is never touched."""
    target = tmp_path / "g"
    unlocked = tmp_path / ".g.older.tmp"  # no .lock: not ours to judge
    unlocked.mkdir()
    held = tmp_path / ".g.held.tmp"  # its .lock held by another open file
    held.mkdir()
    lock = open(held / ".lock", "w")  # noqa: SIM115 - closed below
    fcntl.flock(lock, fcntl.LOCK_EX)
    try:
        with atomic_dir(target) as first:
            with atomic_dir(target) as second:
                (second / "second.txt").write_text("2")
            assert first.is_dir() and held.is_dir() and unlocked.is_dir()
            assert [p.name for p in target.iterdir()] == ["second.txt"]
            (first / "meta.json").write_text('{"format": "graphwire.graph"}')
    finally:
        lock.close()
    assert [p.name for p in target.iterdir()] == ["meta.json"]  # the last wins
    with atomic_dir(target, overwrite=True) as tmp:
        (tmp / "third.txt").write_text("3")
    assert not held.exists() and unlocked.is_dir()  # its lock is free now
    assert sorted(p.name for p in tmp_path.iterdir()) == [".g.older.tmp", "g"]


def test_a_failed_write_removes_the_folders_it_made(tmp_path: Path) -> None:
    """``--out big/g`` that fails (a full disk) left an empty ``big``."""
    (tmp_path / "kept").mkdir()
    for target in (tmp_path / "big" / "deeper" / "g", tmp_path / "kept" / "g"):
        with pytest.raises(OSError, match="disk full"):
            with atomic_dir(target):
                raise OSError("disk full")
        with pytest.raises(OSError, match="disk full"):
            with atomic_file(target.with_name("meta.json")):
                raise OSError("disk full")
    assert [p.name for p in tmp_path.iterdir()] == ["kept"]
    assert list((tmp_path / "kept").iterdir()) == []


def test_out_dot_replaces_the_current_folder(tmp_path: Path, monkeypatch) -> None:
    """``--out . --overwrite`` renamed ``.`` (EBUSY), with a traceback and a
    ``..*.tmp`` left in it."""
    here = graphwire_folder(tmp_path / "here")
    monkeypatch.chdir(here)
    with atomic_dir(".", overwrite=True) as tmp:
        (tmp / "new.txt").write_text("new")
    assert [p.name for p in tmp_path.iterdir()] == ["here"]
    assert [p.name for p in here.iterdir()] == ["new.txt"]


def test_a_target_that_cannot_be_moved_aside_is_named(
    tmp_path: Path, monkeypatch
) -> None:
    """A mount point cannot be renamed (EBUSY): the error names it and what
    to do, and nothing of the attempt is left beside it."""
    target = graphwire_folder(tmp_path / "mnt")
    real_replace = os.replace

    def busy(src, dst) -> None:
        if Path(src) == target:
            raise OSError(16, "Device or resource busy")
        real_replace(src, dst)

    monkeypatch.setattr(os, "replace", busy)
    with pytest.raises(OSError, match=r"mnt: cannot be moved aside .* mount point"):
        with atomic_dir(target, overwrite=True) as tmp:
            (tmp / "new.txt").write_text("new")
    assert [p.name for p in tmp_path.iterdir()] == ["mnt"]
    assert [p.name for p in target.iterdir()] == ["meta.json"]


def test_overwrite_keeps_what_was_put_into_a_graphwire_folder(tmp_path: Path) -> None:
    """A graph's parts written inside its folder, or notes beside its
    arrays, went with it when the graph was written again."""
    target = tmp_path / "g"
    target.mkdir()
    meta = {"format": "graphwire.graph", "arrays": {"x": {}, "y": {}}}
    (target / "meta.json").write_text(json.dumps(meta))
    for name in ("x.npy", "y.npy"):
        (target / name).write_bytes(b"npy")
    check_replaceable(target, overwrite=True)  # what meta.json lists: fine
    (target / "parts2").mkdir()
    (target / "notes.txt").write_text("keep me")
    with pytest.raises(
        ValueError, match=r"g: holds notes.txt, parts2, which graphwire did not"
    ):
        with atomic_dir(target, overwrite=True) as tmp:
            (tmp / "new.txt").write_text("new")
    assert sorted(p.name for p in target.iterdir()) == [
        "meta.json",
        "notes.txt",
        "parts2",
        "x.npy",
        "y.npy",
    ]
    parts = tmp_path / "p"
    parts.mkdir()
    (parts / "meta.json").write_text(
        '{"format": "graphwire.partitioned", "parts": [{}]}'
    )
    (parts / "part_0").mkdir()
    check_replaceable(parts, overwrite=True)
    (parts / "part_1").mkdir()  # not in meta.json
    with pytest.raises(ValueError, match=r"p: holds part_1, which graphwire did not"):
        check_replaceable(parts, overwrite=True)


def test_a_folder_that_cannot_be_made_is_named_before_any_work(tmp_path) -> None:
    """Permission bits do not say it all: root may write where they allow,
    and /proc (or a read-only mount) still refuses a new folder. Such an
    ``--out`` failed only after loading and partitioning, with ENOENT and no
    flag named; now it is named at once, and the probe leaves nothing."""
    if not Path("/proc/self").is_dir():
        pytest.skip("no /proc here")
    said = r"^--out /proc/gw: (/proc cannot be written|no folder can be made in /proc)"
    with pytest.raises(ValueError, match=said) as caught:
        check_creatable("/proc/gw/run", "--out /proc/gw")
    assert "\n" not in str(caught.value)
    check_creatable(tmp_path / "a" / "b", "--out x")
    assert list(tmp_path.iterdir()) == []
