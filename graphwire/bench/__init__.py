"""Benchmarks of graphwire's parts: figures beside their targets or references.

Each benchmark is one module with a ``run(options) -> dict`` function; they are
registered by name in :data:`BENCHMARKS` and run by ``graphwire bench NAME`` or
the thin scripts in ``benchmarks/``.
"""

from __future__ import annotations

from graphwire.bench.registry import BENCHMARKS, BenchOptions, run_benchmark

__all__ = ["BENCHMARKS", "BenchOptions", "run_benchmark"]
