"""The README runs as written: its commands, its Python example, its table.

- Every ``graphwire`` line of the README's ``bash`` blocks runs, in order, in
  a scratch folder and in this process, as ``python -m graphwire`` would run
  it (the workers of a ``--workers`` run fork from one fork server for all,
  which saves each command a start of torch), and must exit 0. A trailing
  ``> FILE`` writes the command's standard output to FILE. The Quickstart's
  ``make`` lines are not run.
- The ``python`` block runs as a script of its own (its workers import it):
  every rank must print the one-process run's test accuracy, the parity
  oracle the README promises.
- The strategy table names exactly the registered exchanges and fetchers.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from graphwire.cli import main

REPO_ROOT = Path(__file__).resolve().parents[1]
README = REPO_ROOT / "README.md"


def blocks(language: str) -> list[str]:
    """The README's fenced blocks of ``language``, in order."""
    return re.findall(rf"```{language}\n(.*?)```", README.read_text(), re.DOTALL)


def section(heading: str) -> str:
    """The README's text under ``## heading``, up to the next ``## ``."""
    text = README.read_text()
    assert f"\n## {heading}\n" in text, f"README has no '## {heading}'"
    return text.split(f"\n## {heading}\n", 1)[1].split("\n## ", 1)[0]


def graphwire_lines() -> list[str]:
    """Every ``graphwire ...`` command of the ``bash`` blocks, continuation
    lines joined, in order."""
    commands = []
    for block in blocks("bash"):
        for line in block.replace("\\\n", " ").splitlines():
            if line.strip().startswith("graphwire "):
                commands.append(line.strip())
    return commands


def test_the_readme_has_a_tour_of_every_command() -> None:
    """The tour shows every subcommand (the brief of the README)."""
    lines = graphwire_lines()
    for command in (
        "data generate",
        "data info",
        "partition",
        "train",
        "report",
        "simulate",
    ):
        assert any(line.startswith(f"graphwire {command} ") for line in lines)
    assert "graphwire bench list" in lines
    train = [line for line in lines if line.startswith("graphwire train ")]
    for flag in (
        "--workers",
        "--exchange",
        "--fetch rapid",
        "--print-spec",
        "--config",
    ):
        assert any(flag in line for line in train), flag


def test_the_command_line_tour_runs_as_written(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.chdir(tmp_path)
    for line in graphwire_lines():
        words = shlex.split(line, comments=True)
        into = None
        if ">" in words:
            at = words.index(">")
            words, into = words[:at], words[at + 1 :]
            assert len(into) == 1, line
        capfd.readouterr()  # what came before is not this command's
        try:
            code = main(words[1:])
        except SystemExit as stop:  # argparse's refusal of a flag
            code = stop.code if isinstance(stop.code, int) else 2
        out, err = capfd.readouterr()
        assert code == 0, f"{line}\nexit {code}\n{err[-3000:]}"
        if into is not None:
            Path(into[0]).write_text(out)
        if words[1] == "train" and "--print-spec" not in words:
            assert out.strip().splitlines()[-1].startswith("summary "), line
    # What the tour promises of its last steps: the spec file round trip and
    # the report.
    spec = (tmp_path / "g3.yaml").read_text()
    assert "exchange:\n  name: g3\n" in spec
    config = json.loads((tmp_path / "runs/g3/metrics.jsonl").open().readline())
    assert (config["kind"], config["exchange"], config["epochs"]) == ("config", "g3", 5)
    report = tmp_path / "runs/compare"
    for name in ("report.md", "loss_acc.png", "time_split.png", "bytes_heatmap.png"):
        assert (report / name).is_file(), name


def test_the_python_example_runs_and_every_rank_agrees_with_one_process(
    tmp_path: Path,
) -> None:
    (code,) = blocks("python")
    # The example trains 30 epochs; the agreement holds at any count.
    assert "epochs=30" in code, "the README example no longer trains 30 epochs"
    script = tmp_path / "example.py"
    script.write_text(code.replace("epochs=30", "epochs=2"))
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(
        p for p in (str(REPO_ROOT), env.get("PYTHONPATH")) if p
    )
    done = subprocess.run(
        [sys.executable, str(script)],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    first, *ranks = done.stdout.splitlines()
    single = re.fullmatch(r"one process: test_acc ([\d.]+)", first)
    assert single, first
    assert len(ranks) == 2, done.stdout
    for rank, line in enumerate(ranks):
        match = re.fullmatch(
            rf"rank {rank}: test_acc ([\d.]+), sent ([\d,]+) bytes", line
        )
        assert match, line
        assert match[1] == single[1]
        assert int(match[2].replace(",", "")) > 0
    assert (tmp_path / "runs" / "products-2" / "meta.json").is_file()


def test_the_strategy_table_names_every_registered_strategy() -> None:
    from graphwire.fullgraph.engines import EXCHANGES
    from graphwire.minibatch.fetchers import FETCHERS

    rows = [
        line for line in section("Strategies").splitlines() if line.startswith("| `")
    ]
    named: dict[str, set[str]] = {"--exchange": set(), "--fetch": set()}
    for row in rows:
        cells = [cell.strip() for cell in row.strip("|").split("|")]
        assert len(cells) == 4, row
        flag, name = cells[0].strip("`").split()
        named[flag].add(name)
        assert cells[3] in ("exact", "bounded-stale", "other batches"), row
    assert named["--exchange"] == set(EXCHANGES.names())
    assert named["--fetch"] == set(FETCHERS.names())
