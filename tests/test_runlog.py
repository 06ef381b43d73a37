"""metrics.jsonl is complete or absent; the summary line is machine-readable."""

from __future__ import annotations

import json

import pytest

from graphwire.runlog import MetricsLog, format_summary


def test_summary_line_format() -> None:
    line = format_summary({"test_acc": 0.815, "epochs": 200, "epoch_s_median": 0.0123})
    assert line == "summary test_acc=0.8150 epochs=200 epoch_s_median=0.0123"
    fields = dict(item.split("=") for item in line.split()[1:])
    assert float(fields["test_acc"]) == pytest.approx(0.815)


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
