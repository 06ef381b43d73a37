"""The guide stays true to the repository: links, flags and benchmark lists.

- Every relative link of README.md, docs/*.md and benchmarks/RESULTS.md
  points at a file that exists, and a ``#anchor`` at one of its headings.
- Every ``--flag`` the pages show in code is a flag of a ``graphwire``
  command, of a benchmark script, or of ``torchrun``.
- docs/benchmarks.md lists exactly what ``graphwire bench list`` and
  ``benchmarks/*.py`` offer.
"""

from __future__ import annotations

import argparse
import re
from pathlib import Path

import pytest

from graphwire.bench.registry import BENCHMARKS
from graphwire.cli import build_parser

REPO_ROOT = Path(__file__).resolve().parents[1]
PAGES = [
    REPO_ROOT / "README.md",
    *sorted((REPO_ROOT / "docs").glob("*.md")),
    REPO_ROOT / "benchmarks" / "RESULTS.md",
]
# The torchrun flags the pages show (torchrun is torch's, not ours).
TORCHRUN = {
    "--nproc-per-node",
    "--nnodes",
    "--node-rank",
    "--master-addr",
    "--master-port",
    "--max-restarts",
    "--rdzv-endpoint",
}


def _names(pages: list[Path]) -> list[str]:
    return [str(page.relative_to(REPO_ROOT)) for page in pages]


def anchors(page: Path) -> set[str]:
    """GitHub's anchors of the page's headings: lower case, punctuation but
    ``-`` and ``_`` dropped, spaces as ``-``."""
    found = set()
    for heading in re.findall(r"^#{1,6} (.+)$", page.read_text(), re.MULTILINE):
        slug = re.sub(r"[^\w\- ]", "", heading.strip().lower())
        found.add(slug.replace(" ", "-"))
    return found


def test_the_guide_has_its_pages() -> None:
    for name in (
        "full-graph",
        "mini-batch",
        "reliability",
        "data-formats",
        "benchmarks",
        "simulate",
    ):
        assert (REPO_ROOT / "docs" / f"{name}.md").is_file(), name


def test_the_readme_is_a_short_front_door() -> None:
    assert len((REPO_ROOT / "README.md").read_text().splitlines()) <= 150


@pytest.mark.parametrize("page", PAGES, ids=_names(PAGES))
def test_every_link_points_at_a_file_and_heading_that_exist(page: Path) -> None:
    text = re.sub(r"```.*?```", "", page.read_text(), flags=re.DOTALL)
    links = re.findall(r"\]\(([^)\s]+)\)", text)
    for link in links:
        if re.match(r"[a-z]+:", link):
            continue  # http:, https:, mailto:
        path, _, anchor = link.partition("#")
        target = (page.parent / path).resolve() if path else page
        assert target.exists(), f"{page.name}: {link}: no such file"
        assert REPO_ROOT in target.parents, f"{page.name}: {link}: outside the repo"
        if anchor:
            assert target.suffix == ".md", f"{page.name}: {link}"
            assert anchor in anchors(target), f"{page.name}: {link}: no such heading"


def _parser_flags(parser: argparse.ArgumentParser) -> set[str]:
    flags = set()
    for action in parser._actions:
        flags.update(s for s in action.option_strings if s.startswith("--"))
        if isinstance(action, argparse._SubParsersAction):
            for sub in action.choices.values():
                flags |= _parser_flags(sub)
    return flags


def known_flags() -> set[str]:
    """Every flag of every ``graphwire`` command and benchmark script."""
    flags = _parser_flags(build_parser()) | TORCHRUN
    for script in (REPO_ROOT / "benchmarks").glob("*.py"):
        flags.update(re.findall(r"[\"'](--[a-z][a-z0-9-]*)[\"']", script.read_text()))
    return flags


@pytest.mark.parametrize("page", PAGES, ids=_names(PAGES))
def test_every_flag_the_pages_show_exists(page: Path) -> None:
    text = page.read_text()
    code = re.findall(r"```.*?```", text, flags=re.DOTALL)
    code += re.findall(r"`[^`\n]+`", re.sub(r"```.*?```", "", text, flags=re.DOTALL))
    shown = {
        flag
        for snippet in code
        for flag in re.findall(r"(?<![\w-])(--[a-z][a-z0-9-]*)", snippet)
    }
    unknown = sorted(shown - known_flags())
    assert not unknown, f"{page.name} shows flags no command has: {unknown}"


def test_the_benchmarks_page_lists_exactly_what_there_is() -> None:
    """Every ``benchmarks/*.py`` has a row, every row a script, and the
    ``graphwire bench`` rows are the benchmarks ``bench list`` describes."""
    text = (REPO_ROOT / "docs" / "benchmarks.md").read_text()
    first_cells = [
        line.split("|")[1].strip()
        for line in text.splitlines()
        if line.startswith("| `")
    ]
    scripts = {m for cell in first_cells for m in re.findall(r"^`(\w+\.py)`$", cell)}
    assert scripts == {p.name for p in (REPO_ROOT / "benchmarks").glob("*.py")}
    benches = {
        m
        for cell in first_cells
        for m in re.findall(r"^`graphwire bench ([\w-]+)`$", cell)
    }
    assert benches == set(BENCHMARKS)
