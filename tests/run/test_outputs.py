"""A run's folder: an earlier run in ``--out`` is refused, continued
(``--resume``) or replaced (``--overwrite``), and nothing but its outputs is
ever removed."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from graphwire.run.outputs import (
    REPORT_FILES,
    RUN_WRITES,
    claim_run_folder,
    run_folder,
    run_outputs,
)
from graphwire.run.plots import PLOTS

SYNTHETIC = "synthetic:products?nodes=300&seed=1"


def _earlier_run(out: Path) -> None:
    """What a checkpointed distributed run and its report leave in ``out``."""
    out.mkdir(parents=True, exist_ok=True)
    (out / "metrics.jsonl").write_text('{"kind": "config"}\n{"kind": "summary"}\n')
    (out / "metrics.jsonl.partial").write_text("")  # a failed run's, cut short
    epoch = out / "checkpoints" / "epoch000004"
    epoch.mkdir(parents=True)
    (epoch / "rank0.pt").write_bytes(b"pt")
    (epoch / ".rank1.pt.partial").write_bytes(b"p")
    (out / "checkpoints" / "latest.json").write_text('{"epoch": 4}')
    _parts(out / "partitions")
    (out / "report.md").write_text("# graphwire report: 1 run\n")
    for name in REPORT_FILES[1:]:
        (out / name).write_bytes(b"\x89PNG")


def _parts(folder: Path) -> None:
    """A partitioned folder as graphwire writes it: meta.json and its parts."""
    for part in range(2):
        (folder / f"part_{part}").mkdir(parents=True)
    meta = {"format": "graphwire.partitioned", "parts": [{}, {}]}
    (folder / "meta.json").write_text(json.dumps(meta))


def test_the_report_files_are_the_ones_graphwire_report_writes() -> None:
    assert set(REPORT_FILES) == {"report.md", *PLOTS}


def test_an_empty_missing_or_foreign_folder_is_any_runs(tmp_path: Path) -> None:
    """A new run may write where nothing of a run is: a missing or empty
    folder, or one holding only other files (a graph folder, notes, plots
    without a graphwire report), which are left as they were."""
    claim_run_folder(tmp_path / "new", SYNTHETIC, overwrite=False, resume=False)
    assert not (tmp_path / "new").exists()
    claim_run_folder(tmp_path, SYNTHETIC, overwrite=False, resume=False)
    (tmp_path / "notes.txt").write_text("mine")
    (tmp_path / "data").mkdir()
    (tmp_path / "loss_acc.png").write_bytes(b"mine")  # not a report's plot
    (tmp_path / "report.md").write_text("# my own report\n")
    for overwrite in (False, True):
        claim_run_folder(tmp_path, SYNTHETIC, overwrite=overwrite, resume=False)
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "data",
        "loss_acc.png",
        "notes.txt",
        "report.md",
    ]


def test_an_earlier_run_is_refused_naming_overwrite_and_resume(
    tmp_path: Path,
) -> None:
    out = tmp_path / "run"
    _earlier_run(out)
    before = sorted(p.name for p in out.iterdir())
    with pytest.raises(FileExistsError) as refused:
        claim_run_folder(out, SYNTHETIC, overwrite=False, resume=False)
    said = str(refused.value)
    assert "\n" not in said
    assert said.startswith(f"--out {out}: holds an earlier run (metrics.jsonl, ")
    assert "pass --overwrite to replace it or --resume to continue it" in said
    assert sorted(p.name for p in out.iterdir()) == before  # left as it was
    # With --resume the run goes on with its folder as it is.
    claim_run_folder(out, SYNTHETIC, overwrite=False, resume=True)
    assert sorted(p.name for p in out.iterdir()) == before
    # Any one of a run's outputs is a run; without checkpoints, --resume
    # cannot continue it, and the line says so.
    for name in RUN_WRITES:
        alone = tmp_path / f"only-{name}"
        _earlier_run(alone)
        for other in alone.iterdir():
            if other.name != name:
                _remove(other)
        with pytest.raises(FileExistsError, match="pass --overwrite") as refused:
            claim_run_folder(alone, SYNTHETIC, overwrite=False, resume=False)
        if name != "checkpoints":
            assert "(it has no checkpoints to --resume from)" in str(refused.value)


def _remove(path: Path) -> None:
    import shutil

    if path.is_dir():
        shutil.rmtree(path)
    else:
        path.unlink()


def test_overwrite_removes_the_runs_outputs_and_nothing_else(tmp_path: Path) -> None:
    out = tmp_path / "run"
    _earlier_run(out)
    (out / "notes.txt").write_text("mine")
    (out / "data").mkdir()
    claim_run_folder(out, SYNTHETIC, overwrite=True, resume=False)
    assert sorted(p.name for p in out.iterdir()) == ["data", "notes.txt"]


@pytest.mark.parametrize(
    "name, content",
    [
        ("metrics.jsonl", "not graphwire's records\n"),
        ("metrics.jsonl.partial", "[1, 2]\n"),
        ("checkpoints/notes.txt", "mine"),
        ("checkpoints/epoch000001/notes.txt", "mine"),
        ("partitions/notes.txt", "mine"),
    ],
)
def test_what_a_run_writes_is_never_replaced_unless_graphwire_wrote_it(
    tmp_path: Path, name: str, content: str
) -> None:
    """A file of the name of one the run writes (or a folder holding what
    graphwire did not put there) is refused, with --overwrite too: the run
    would write over it."""
    out = tmp_path / "run"
    _earlier_run(out)
    (out / name).parent.mkdir(parents=True, exist_ok=True)
    (out / name).write_text(content)
    for overwrite in (False, True):
        with pytest.raises(ValueError, match="is not graphwire's") as refused:
            claim_run_folder(out, SYNTHETIC, overwrite=overwrite, resume=False)
        top = name.split("/")[0]
        assert f"--out {out}: {top} is not graphwire's" in str(refused.value)
        assert (out / name).read_text() == content


def test_a_partitioned_dataset_in_the_folder_is_input_not_a_run(
    tmp_path: Path,
) -> None:
    """``train --dataset OUT/partitions --out OUT`` (parts written by
    ``graphwire partition`` where the run's would go) reads them: they are
    neither an earlier run nor removed by --overwrite."""
    _parts(tmp_path / "partitions")
    dataset = str(tmp_path / "partitions")
    assert run_outputs(tmp_path, dataset) == []
    claim_run_folder(tmp_path, dataset, overwrite=True, resume=False)
    assert (tmp_path / "partitions" / "meta.json").is_file()
    assert run_outputs(tmp_path, SYNTHETIC) == [tmp_path / "partitions"]


def test_a_default_run_folder_is_a_new_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two runs without --out in one second get a folder each."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr("time.strftime", lambda _: "20250101-000000")
    first = run_folder(None, "train-gcn")
    first.mkdir(parents=True)
    second = run_folder(None, "train-gcn")
    assert (first.name, second.name) == (
        "train-gcn-20250101-000000",
        "train-gcn-20250101-000000-2",
    )
