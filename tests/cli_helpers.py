"""Datasets the command-line tests share: small enough to run in a second."""

from __future__ import annotations

SMALL = "synthetic:products?nodes=3000&degree=8&features=16&classes=4&seed=1"
TINY = "synthetic:products?nodes=300&degree=4&features=4&classes=3&seed=1"
