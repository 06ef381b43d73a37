"""Seeds mixed from integers, and the checks that seeds and counts are integers.

`derive_seed` mixes integers into independent, reproducible seeds;
`check_seed` and `is_int` are the checks."""

from __future__ import annotations

import numbers
from typing import Any

__all__ = ["check_seed", "derive_seed", "is_int"]

_MASK64 = (1 << 64) - 1
_SEED_LIMIT = 1 << 63  # torch, numpy and derive_seed all take it as it is


def is_int(value: Any) -> bool:
    """An int or a numpy integer, not a bool (counts, seeds and IDs accept both)."""
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def check_seed(seed: Any, name: str = "seed") -> int:
    """``seed`` as a plain int in ``[0, 2**63)`` (numpy integers accepted).

    Raises:
        ValueError: naming ``name``, for a seed of another type or out of range
            (which torch or numpy would refuse only later, deep inside).
    """
    if not is_int(seed):
        raise ValueError(f"{name}: expected an int in [0, 2**63), got {seed!r}")
    if not 0 <= int(seed) < _SEED_LIMIT:
        raise ValueError(f"{name}: expected an int in [0, 2**63), got {seed}")
    return int(seed)


def derive_seed(*parts: int) -> int:
    """A 63-bit seed mixed from integers (e.g. ``(seed, epoch, batch)``).

    SplitMix64 over the parts: nearby inputs give unrelated seeds, and the same
    parts give the same seed on every process and platform.
    """
    state = 0x9E3779B97F4A7C15
    for part in parts:
        state = (state ^ (int(part) & _MASK64)) * 0xBF58476D1CE4E5B9 & _MASK64
        state ^= state >> 31
        state = (state + 0x9E3779B97F4A7C15) * 0x94D049BB133111EB & _MASK64
        state ^= state >> 29
    return state >> 1
