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
