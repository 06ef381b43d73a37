"""``graphwire report``: the table's figures are the records', the plots are
PNGs of their stated size, and bad input is refused in a line naming the file.

A full-graph and a mini-batch run (2 workers, a tiny graph) are trained once
for the module, in this process (:func:`graphwire.cli.main`, as
``tests/multiprocess/cli_runs.py`` runs them); each test reports on copies of
their ``metrics.jsonl`` alone, in a folder of its own.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from matplotlib.image import imread

from graphwire.cli import main
from graphwire.run.plots import DPI, PLOTS, figure_inches
from graphwire.run.report import read_run
from graphwire.run.summary import TRAINING_TAGS
from graphwire.units import format_bytes
from tests.multiprocess.cli_runs import SPEC

TRAIN = ["train", "--dataset", SPEC, "--workers", "2", "--quiet", "--timeout", "120"]
RUNS = {
    "full": ["--epochs", "3", "--exchange", "g3"],
    "mini": ["--epochs", "2", "--mode", "minibatch", "--batch-size", "64"],
}
# Tags a report does not count as training traffic: evaluation, bookkeeping.
NOT_TRAINING = ("eval.", "meta.", "sync.metrics")


@pytest.fixture(scope="module")
def trained(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Each run's ``metrics.jsonl``, trained once for the module."""
    root = tmp_path_factory.mktemp("trained")
    for name, flags in RUNS.items():
        assert main([*TRAIN, *flags, "--out", str(root / name)]) == 0
    return {name: root / name / "metrics.jsonl" for name in RUNS}


def _copy(trained: dict[str, Path], name: str, where: Path) -> Path:
    """A run folder holding only ``name``'s ``metrics.jsonl``."""
    folder = where / name
    folder.mkdir()
    shutil.copy(trained[name], folder / "metrics.jsonl")
    return folder


def _records(folder: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (folder / "metrics.jsonl").open()]


def _table(markdown: str) -> list[dict[str, str]]:
    """The rows of the first Markdown table in ``markdown``, by column."""
    lines = [line for line in markdown.splitlines() if line.startswith("|")]
    cells = [[c.strip() for c in line.strip("|").split(" | ")] for line in lines]
    header, rows = cells[0], cells[2:]
    return [dict(zip(header, row, strict=True)) for row in rows]


def _expected_bytes(records: list[dict[str, Any]]) -> dict[str, float]:
    """Training tag -> bytes over every epoch record (all ranks) / epochs."""
    epochs = [r for r in records if r["kind"] == "epoch"]
    totals: dict[str, int] = {}
    for record in epochs:
        for tag, num_bytes in record["comm"]["by_tag"].items():
            if not tag.startswith(NOT_TRAINING):
                totals[tag] = totals.get(tag, 0) + num_bytes
    num_epochs = len({r["epoch"] for r in epochs})
    return {tag: totals[tag] / num_epochs for tag in sorted(totals)}


def _check_row(row: dict[str, str], records: list[dict[str, Any]]) -> None:
    """The row's figures are those of the run's records."""
    summary = next(r for r in records if r["kind"] == "summary")
    config = records[0]
    assert row["mode"] == config["mode"] and row["workers"] == "2"
    assert row["exchange/fetch"] == config.get("exchange", config.get("fetch"))
    assert row["test acc"] == f"{summary['test_acc']:.4f}"
    assert row["epoch s (median)"] == f"{summary['epoch_s_median']:.4g}"
    assert row["remote rows"] == f"{summary['remote_rows']:,}"
    expected = _expected_bytes(records)
    assert row["by tag"] == "; ".join(
        f"{tag} {format_bytes(num_bytes)}" for tag, num_bytes in expected.items()
    )
    assert row["train bytes/epoch"] == format_bytes(sum(expected.values()))
    shares = [float(v[:-1]) for k, v in row.items() if k.endswith(" %") and v != "-"]
    assert sum(shares) == pytest.approx(100, abs=0.1 * len(shares))
    if config["mode"] == "minibatch":
        assert row["cache hit rate"] == f"{summary['cache_hit_rate']:.1%}"
    else:
        assert row["cache hit rate"] == "-"


def _check_plots(folder: Path, num_runs: int) -> None:
    for name in PLOTS:
        image = imread(folder / name)
        width, height = figure_inches(name, num_runs)
        assert image.shape[:2] == (round(height * DPI), round(width * DPI)), name
        assert np.ptp(image[..., :3]) > 0.5, f"{name} is blank"


@pytest.mark.parametrize("name", list(RUNS))
def test_a_run_s_report_holds_its_records_figures(
    trained: dict[str, Path], tmp_path: Path, name: str, capsys
) -> None:
    folder = _copy(trained, name, tmp_path)
    assert main(["report", str(folder)]) == 0
    out = capsys.readouterr().out
    markdown = (folder / "report.md").read_text()
    assert _table(out) == _table(markdown)
    (row,) = _table(markdown)
    assert row["run"] == name
    records = _records(folder)
    _check_row(row, records)
    _check_plots(folder, 1)
    phases = {k[:-2] for k, v in row.items() if k.endswith(" %")}
    if name == "full":
        assert phases == {"compute", "comm", "sync", "eval"}
    else:
        assert phases == {"sample", "fetch", "wait", "compute", "sync", "eval"}


def test_the_heat_map_s_bytes_are_the_epoch_records(
    trained: dict[str, Path], tmp_path: Path
) -> None:
    """Full-graph: per rank and layer kind, the bytes of every record's
    ``by_rank`` (sent), per epoch; the peers' bytes, each rank's ``by_peer``."""
    folder = _copy(trained, "full", tmp_path)
    run = read_run(folder)
    records = [r for r in _records(folder) if r["kind"] == "epoch"]
    lead = [r for r in records if r["rank"] == 0]
    for kind in ("fwd.L1", "bwd.L1"):
        sent = np.sum([r["comm"]["by_rank"][kind]["sent"] for r in lead], axis=0)
        assert run.bytes_by_rank[kind] == pytest.approx(sent / len(lead))
    assert all(tag.startswith(TRAINING_TAGS) for tag in run.bytes_by_rank)
    for src in range(2):
        sent = sum(
            r["comm"]["by_peer"][str(1 - src)] for r in records if r["rank"] == src
        )
        assert run.bytes_by_peer[src] == pytest.approx(
            [0, sent / 3] if src == 0 else [sent / 3, 0]
        )
    assert run.bytes_per_epoch() == pytest.approx(_expected_bytes(_records(folder)))


def test_two_runs_go_to_the_first_run_s_folder(
    trained: dict[str, Path], tmp_path: Path, capsys
) -> None:
    full, mini = (_copy(trained, name, tmp_path) for name in RUNS)
    assert main(["report", str(full), str(mini)]) == 0
    rows = _table(capsys.readouterr().out)
    assert [row["run"] for row in rows] == ["full", "mini"]
    assert _table((full / "report.md").read_text()) == rows
    for row, folder in zip(rows, (full, mini), strict=True):
        _check_row(row, _records(folder))
    assert rows[1]["comm %"] == "-"  # a column of the full-graph run's only
    _check_plots(full, 2)
    assert sorted(p.name for p in mini.iterdir()) == ["metrics.jsonl"]


def test_out_takes_the_report_elsewhere(
    trained: dict[str, Path], tmp_path: Path, capsys
) -> None:
    folder = _copy(trained, "mini", tmp_path)
    assert main(["report", str(folder), "--out", str(tmp_path / "cmp")]) == 0
    _check_plots(tmp_path / "cmp", 1)
    assert (tmp_path / "cmp" / "report.md").is_file()
    assert sorted(p.name for p in folder.iterdir()) == ["metrics.jsonl"]


def test_a_one_process_run_has_dashes_and_no_traffic(tmp_path: Path, capsys) -> None:
    """Hand-made records of one process: no rank, no comm, a diverged loss
    (null); the run has no exchange, remote rows or cache."""
    records = [
        {"kind": "config", "mode": "fullgraph", "model": "gcn", "dataset": "x"},
        *(
            {
                "kind": "epoch",
                "epoch": e,
                "loss": None if e else 1.0,
                "val_acc": 0.5,
                "times": {"sample_s": 0.0, "forward_s": 0.3, "backward_s": 0.1}
                | {"eval_s": 0.1},
                "comm": {},
            }
            for e in range(2)
        ),
        {"kind": "summary", "test_acc": 0.25, "epoch_s_median": 0.4},
    ]
    (tmp_path / "metrics.jsonl").write_text(
        "".join(json.dumps(r) + "\n" for r in records)
    )
    assert main(["report", str(tmp_path)]) == 0
    (row,) = _table(capsys.readouterr().out)
    assert row["workers"] == "1" and row["test acc"] == "0.2500"
    assert row["compute %"] == "80.0%" and row["eval %"] == "20.0%"
    for column in ("exchange/fetch", "by tag", "remote rows", "cache hit rate"):
        assert row[column] == "-"
    _check_plots(tmp_path, 1)


def _refused(argv: list[str], capsys) -> str:
    """The one line ``graphwire`` says, exiting 2, when it refuses ``argv``."""
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1, err
    return err.strip()


def test_bad_input_is_named_and_nothing_is_written(
    trained: dict[str, Path], tmp_path: Path, capsys
) -> None:
    full = _copy(trained, "full", tmp_path)
    metrics = full / "metrics.jsonl"
    missing = tmp_path / "missing"
    said = _refused(["report", str(full), str(missing)], capsys)
    named = f"{missing}/metrics.jsonl: not found (is RUN a run folder?)"
    assert said == f"graphwire: error: {named}"
    assert sorted(p.name for p in full.iterdir()) == ["metrics.jsonl"]

    missing.mkdir()
    (missing / "metrics.jsonl.partial").write_text("")
    said = _refused(["report", str(missing)], capsys)
    assert said.endswith("metrics.jsonl: not found (the run did not finish)")

    lines = metrics.read_text().splitlines(keepends=True)
    metrics.write_text("".join(lines[:-1]) + lines[-1][:20])  # cut short
    said = _refused(["report", str(full)], capsys)
    assert said.startswith(f"graphwire: error: {metrics}: line {len(lines)}: truncated")

    metrics.write_text("".join(lines[:2]) + "{oops\n" + "".join(lines[3:]))
    said = _refused(["report", str(full)], capsys)
    assert said.startswith(f"graphwire: error: {metrics}: line 3: not valid JSON")

    kept = [line for line in lines if json.loads(line)["kind"] != "epoch"]
    metrics.write_text("".join(kept))
    said = _refused(["report", str(full)], capsys)
    assert (
        said
        == f"graphwire: error: {metrics}: no epoch records (the run trained no epochs)"
    )
    assert sorted(p.name for p in full.iterdir()) == ["metrics.jsonl"]

    metrics.write_text("".join(lines))
    (tmp_path / "file").write_text("")
    said = _refused(["report", str(full), "--out", str(tmp_path / "file")], capsys)
    assert (
        said == f"graphwire: error: --out {tmp_path / 'file'}: is a file, not a folder"
    )
