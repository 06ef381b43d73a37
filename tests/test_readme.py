"""The README's Python examples run as written and agree with each other.

Each ``python`` block of "The Python API" runs as a script of its own (the
distributed one must: its workers import it), from a scratch folder, with the
Cora path pointed at ``../shared`` and 30 epochs for the examples' 200. The
distributed example's ranks must print the single-process example's test
accuracy: the parity oracle, in the docs.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]

CORA = "../shared/data/planetoid/cora"


def api_blocks() -> list[str]:
    """The ``python`` blocks between "### The Python API" and the next heading."""
    text = (REPO_ROOT / "README.md").read_text()
    section = text.split("### The Python API", 1)[1].split("\n### ", 1)[0]
    return re.findall(r"```python\n(.*?)```", section, flags=re.DOTALL)


# The examples train 200 epochs; the agreement holds at any count, and 30
# take a sixth of the time (4 worker processes on CI's 2 cores).
EPOCHS, TEST_EPOCHS = "epochs=200", "epochs=30"


def run_block(code: str, folder: Path, cora_dir: Path, name: str) -> str:
    assert CORA in code, f"the README example no longer reads {CORA}"
    assert EPOCHS in code, f"the README example no longer trains {EPOCHS}"
    script = folder / name
    code = code.replace(EPOCHS, TEST_EPOCHS)
    script.write_text(code.replace(CORA, str(cora_dir / "cora")))
    done = subprocess.run(
        [sys.executable, str(script)],
        cwd=folder,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_the_python_api_examples_run_and_agree(tmp_path: Path, cora_dir: Path) -> None:
    single, distributed = api_blocks()
    single_acc = float(run_block(single, tmp_path, cora_dir, "single.py").split()[-1])
    lines = run_block(distributed, tmp_path, cora_dir, "dist.py").splitlines()
    assert len(lines) == 4
    for rank, line in enumerate(lines):
        match = re.fullmatch(
            rf"rank {rank}: test_acc ([\d.]+), sent ([\d,]+) bytes", line
        )
        assert match, line
        assert float(match[1]) == round(single_acc, 3)
        assert int(match[2].replace(",", "")) > 0
    assert (tmp_path / "runs" / "cora-4" / "meta.json").is_file()


def test_the_benchmarks_table_names_every_script_and_benchmark() -> None:
    """Every ``benchmarks/*.py`` has a row in "### Benchmarks", every script a
    row names exists, and the rows name every ``graphwire bench`` benchmark."""
    from graphwire.bench.registry import BENCHMARKS

    text = (REPO_ROOT / "README.md").read_text()
    section = text.split("### Benchmarks", 1)[1].split("\n## ", 1)[0]
    rows = [line for line in section.splitlines() if line.startswith("| `")]
    named = {
        name for row in rows for name in re.findall(r"`(\w+\.py)`", row.split("|")[1])
    }
    scripts = {path.name for path in (REPO_ROOT / "benchmarks").glob("*.py")}
    assert named == scripts
    for benchmark in BENCHMARKS:
        assert f"graphwire bench {benchmark}" in section or f"`{benchmark}`" in section
