"""`format_bytes`: a byte count as people read it."""

from __future__ import annotations

__all__ = ["format_bytes"]


def format_bytes(num_bytes: float) -> str:
    """``num_bytes`` for people: B below 1000, else KiB, MiB, GiB or TiB.

    To three significant digits (``512 B``, ``14.4 KiB``, ``4.27 MiB``)."""
    value = float(num_bytes)
    if abs(value) < 999.5:
        return f"{value:.0f} B"
    for unit in ("KiB", "MiB", "GiB", "TiB"):
        value /= 1024
        if abs(value) < 999.5 or unit == "TiB":
            break
    return f"{value:.3g} {unit}" if abs(value) < 999.5 else f"{value:.0f} {unit}"
