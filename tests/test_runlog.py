"""metrics.jsonl is complete or absent; the summary line is machine-readable."""

from __future__ import annotations

import errno
import json
import os

import pytest

from graphwire.run.records import MetricsLog, format_summary
from graphwire.units import format_bytes


def test_summary_line_format() -> None:
    line = format_summary({"test_acc": 0.815, "epochs": 200, "epoch_s_median": 0.0123})
    assert line == "summary test_acc=0.8150 epochs=200 epoch_s_median=0.0123"
    fields = dict(item.split("=") for item in line.split()[1:])
    assert float(fields["test_acc"]) == pytest.approx(0.815)


@pytest.mark.parametrize(
    ("num_bytes", "text"),
    [
        (0, "0 B"),
        (999, "999 B"),
        (1000, "0.977 KiB"),
        (14.4 * 2**10, "14.4 KiB"),
        (999.6 * 2**10, "0.976 MiB"),
        (4.27 * 2**20, "4.27 MiB"),
        (1.5 * 2**30, "1.5 GiB"),
        (5000 * 2**40, "5000 TiB"),
    ],
)
def test_bytes_read_in_binary_units_to_three_digits(num_bytes, text) -> None:
    assert format_bytes(num_bytes) == text


def test_metrics_file_appears_only_on_success(tmp_path) -> None:
    with MetricsLog(tmp_path / "ok") as log:
        log.write("epoch", epoch=0, loss=1.5)
        log.write("summary", test_acc=0.5)
    records = [json.loads(x) for x in (tmp_path / "ok" / "metrics.jsonl").open()]
    assert [r["kind"] for r in records] == ["epoch", "summary"]
    assert records[-1]["test_acc"] == 0.5

    with pytest.raises(RuntimeError), MetricsLog(tmp_path / "bad") as log:
        log.write("epoch", epoch=0)
        raise RuntimeError("worker died")
    assert not (tmp_path / "bad" / "metrics.jsonl").exists()
    assert (tmp_path / "bad" / "metrics.jsonl.partial").exists()


def test_the_log_stays_strict_json_when_a_run_diverges(tmp_path) -> None:
    """A NaN or infinite loss (a diverged run) is ``null``: Python's json
    wrote ``NaN``, which strict readers (jq, JavaScript, Go) refuse."""
    nan, inf = float("nan"), float("inf")
    with MetricsLog(tmp_path / "run") as log:
        log.write("epoch", epoch=0, loss=nan, times={"a": inf}, extra=[1.5, -inf])

    def refuse(name: str) -> None:
        raise ValueError(f"not strict JSON: {name}")

    line = (tmp_path / "run" / "metrics.jsonl").read_text()
    record = json.loads(line, parse_constant=refuse)
    assert record["loss"] is None and record["times"] == {"a": None}
    assert record["extra"] == [1.5, None] and record["epoch"] == 0


@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="needs /dev/full")
def test_a_full_disk_names_the_file(tmp_path) -> None:
    """A full disk said only ``[Errno 28] No space left on device``, naming
    no file (here the log is linked to /dev/full, where every write fails
    so)."""
    (tmp_path / "run").mkdir()
    partial = tmp_path / "run" / "metrics.jsonl.partial"
    partial.symlink_to("/dev/full")
    with pytest.raises(OSError) as caught, MetricsLog(tmp_path / "run") as log:
        log.write("epoch", epoch=0, loss=1.5)
    assert caught.value.errno == errno.ENOSPC
    assert str(caught.value) == (
        f"[Errno 28] {partial}: could not be written (No space left on device)"
    )
    assert not (tmp_path / "run" / "metrics.jsonl").exists()


def _lines(path) -> list[dict]:
    """Every line of ``path`` parsed; a torn line fails here."""
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_a_record_cut_short_by_a_full_disk_is_taken_back(tmp_path, monkeypatch) -> None:
    """A write that stops part-way (ENOSPC after some of the line) left half a
    record, and every JSON-lines reader of the file failed on it; the close
    flushed the half again."""
    real_write = os.write

    def half_then_full(fd: int, data: bytes) -> int:
        if b'"epoch": 1' in bytes(data):
            real_write(fd, data[: len(data) // 2])
            raise OSError(errno.ENOSPC, "No space left on device")
        return real_write(fd, data)

    monkeypatch.setattr(os, "write", half_then_full)
    partial = tmp_path / "run" / "metrics.jsonl.partial"
    with pytest.raises(OSError) as caught, MetricsLog(tmp_path / "run") as log:
        log.write("epoch", epoch=0, loss=1.5)
        log.write("epoch", epoch=1, loss=1.25)
    said = str(caught.value)
    assert "\n" not in said and said == (
        f"[Errno 28] {partial}: could not be written (No space left on device)"
    )
    assert [r["epoch"] for r in _lines(partial)] == [0]
    assert not (tmp_path / "run" / "metrics.jsonl").exists()


def test_a_file_size_limit_leaves_whole_records(tmp_path) -> None:
    """The kernel's own short write: past RLIMIT_FSIZE a write stops at the
    limit and the next fails (EFBIG), as a disk that fills up mid-line does."""
    import resource
    import signal

    (tmp_path / "run").mkdir()
    partial = tmp_path / "run" / "metrics.jsonl.partial"
    soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    handler = signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # EFBIG, not death
    try:
        resource.setrlimit(resource.RLIMIT_FSIZE, (100, hard))
        with pytest.raises(OSError) as caught, MetricsLog(tmp_path / "run") as log:
            for epoch in range(10):
                log.write("epoch", epoch=epoch, loss=1.5)
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))
        signal.signal(signal.SIGXFSZ, handler)
    assert caught.value.errno == errno.EFBIG
    assert str(caught.value).startswith(f"[Errno 27] {partial}: could not be written")
    assert [r["epoch"] for r in _lines(partial)] == [0]


def test_a_full_file_system_leaves_whole_records(tmp_path) -> None:
    """A real full disk: a 16 KiB tmpfs, filled by records that do not fit
    its pages evenly, so the last one is cut short by the kernel. Mounting
    needs root with mount permission; elsewhere the test skips."""
    import shutil
    import subprocess

    if not shutil.which("mount"):
        pytest.skip("no mount command")
    small = tmp_path / "small"
    small.mkdir()
    mount = ["mount", "-t", "tmpfs", "-o", "size=16k", "tmpfs", str(small)]
    failed = subprocess.run(mount, capture_output=True).returncode
    if failed:
        pytest.skip("cannot mount a tmpfs here (needs root and mount permission)")
    try:
        partial = small / "run" / "metrics.jsonl.partial"
        with pytest.raises(OSError) as caught, MetricsLog(small / "run") as log:
            for epoch in range(1000):
                log.write("epoch", epoch=epoch, note="x" * 150)
        assert caught.value.errno == errno.ENOSPC
        assert str(partial) in str(caught.value)
        records = _lines(partial)
        assert [r["epoch"] for r in records] == list(range(len(records)))
        assert len(records) > 10
    finally:
        subprocess.run(["umount", str(small)], check=True)
