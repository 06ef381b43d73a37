"""`derive_seed`: independent, reproducible seeds mixed from integers."""

from __future__ import annotations

__all__ = ["derive_seed"]

_MASK64 = (1 << 64) - 1


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
