"""Freed memory kept for reuse (glibc malloc's thresholds): set in each
worker, left alone where the user chose otherwise, refused out of range."""

from __future__ import annotations

import platform
import sys

import pytest

from graphwire.allocator import keep_freed_memory, user_set_allocator
from graphwire.cli import main
from graphwire.comm.launch import launch_local
from tests.cli_helpers import TINY
from tests.comm.probes import refault_pages

_GLIBC = sys.platform.startswith("linux") and platform.libc_ver()[0] == "glibc"
_PAGES = 3 * (48 << 20) // 4096  # refault_pages: three 48 MiB blocks


@pytest.fixture
def no_user_choice(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("GLIBC_TUNABLES", "")
    monkeypatch.setenv("LD_PRELOAD", "")


@pytest.mark.skipif(not _GLIBC, reason="glibc's malloc only")
@pytest.mark.usefixtures("no_user_choice")
def test_a_worker_keeps_freed_blocks_for_reuse() -> None:
    # glibc maps every block above 32 MiB afresh: its pages fault again.
    (default,) = launch_local(refault_pages, 1)
    (kept,) = launch_local(refault_pages, 1, keep_freed_mb=1024)
    assert default > _PAGES // 2, default
    assert kept < _PAGES // 20, kept


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("MALLOC_TRIM_THRESHOLD_", "1048576"),
        ("MALLOC_MMAP_THRESHOLD_", "1048576"),
        ("GLIBC_TUNABLES", "glibc.malloc.trim_threshold=1048576"),
        ("LD_PRELOAD", "/usr/lib/x86_64-linux-gnu/libjemalloc.so.2"),
    ],
)
def test_the_users_own_choice_is_left_alone(
    monkeypatch: pytest.MonkeyPatch, no_user_choice: None, name: str, value: str
) -> None:
    assert user_set_allocator() is None
    monkeypatch.setenv(name, value)
    assert user_set_allocator() == name
    assert keep_freed_memory(1024) is False


@pytest.mark.usefixtures("no_user_choice")
def test_zero_leaves_malloc_as_it_is() -> None:
    assert keep_freed_memory(0) is False


@pytest.mark.parametrize("mb", [-1, 2048, 1.5, True])
def test_out_of_range_is_refused(mb: object) -> None:
    with pytest.raises(ValueError, match="keep_freed_mb"):
        keep_freed_memory(mb)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="keep_freed_mb"):
        launch_local(refault_pages, 1, keep_freed_mb=mb)  # type: ignore[arg-type]


@pytest.mark.parametrize("mb", ["-1", "2048"])
def test_the_flag_is_refused_out_of_range(tmp_path, capsys, mb: str) -> None:
    argv = ["train", "--dataset", TINY, "--epochs", "1", "--keep-freed-mb", mb]
    assert main([*argv, "--out", str(tmp_path / "run")]) == 2
    assert "--keep-freed-mb: expected >= 0 and <= 2047" in capsys.readouterr().err
    assert not (tmp_path / "run").exists()


def test_a_single_process_run_sets_and_records_it(
    tmp_path, capsys, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls: list[int] = []
    monkeypatch.setattr(
        "graphwire.run.single.keep_freed_memory", lambda mb: calls.append(mb)
    )
    out = tmp_path / "run"
    argv = ["train", "--dataset", TINY, "--epochs", "1", "--quiet"]
    assert main([*argv, "--keep-freed-mb", "256", "--out", str(out)]) == 0
    assert calls == [256]
    config = (out / "metrics.jsonl").read_text().splitlines()[0]
    assert '"keep_freed_mb": 256' in config
