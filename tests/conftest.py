"""Fixtures shared by the whole suite."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import HealthCheck, settings

REPO_ROOT = Path(__file__).resolve().parents[1]
SHARED_DATA = REPO_ROOT.parent / "shared" / "data"

# CI machines are small and shared: no per-example deadline, a moderate budget.
settings.register_profile(
    "graphwire",
    deadline=None,
    max_examples=60,
    suppress_health_check=[HealthCheck.too_slow],
)
settings.load_profile("graphwire")


@pytest.fixture(scope="session")
def cora_dir() -> Path:
    """Folder holding ``ind.cora.*`` (read in place from ../shared, never copied)."""
    folder = SHARED_DATA / "planetoid"
    if not (folder / "ind.cora.x").exists():
        pytest.fail(
            f"Cora not found at {folder}: CI runs with ../shared beside the repo"
        )
    return folder
