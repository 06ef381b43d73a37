"""The switch's counters, kept per pass so that an epoch's report holds its own.

Each pass (one layer's rows, forward or backward) has a number every worker
agrees on; the data plane counts into that pass's dict, and a worker asks for
the sums over the passes of an epoch's training (``STATS``), which leaves
out the evaluation's passes and any other epoch's.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

__all__ = ["sum_stats", "zero_stats"]


def zero_stats() -> dict[str, Any]:
    """A pass's counters before its first frame.

    ``rows_in`` (rows received in DATA frames), ``aggregated`` (rows summed
    into aggregators), ``results`` (aggregates sent), ``raw`` (rows forwarded
    for lack of an aggregator: overflow), ``bypassed`` (rows forwarded for a
    destination in bypass), ``dropped_frames`` / ``dropped_rows`` (loss),
    ``fetches`` (pairs fetched), ``blocks`` (blocks completed, per plan),
    ``peak_slots`` and the occupancy's sum and samples (aggregators in use,
    after each DATA frame), ``pool_rows`` (per row width), ``ecn_marks``
    (frames marked), ``late_frames`` (frames of a finished block)."""
    return {
        "rows_in": 0,
        "aggregated": 0,
        "results": 0,
        "raw": 0,
        "bypassed": 0,
        "dropped_frames": 0,
        "dropped_rows": 0,
        "fetches": 0,
        "blocks": {},
        "peak_slots": 0,
        "occupancy_sum": 0.0,
        "occupancy_samples": 0,
        "pool_rows": {},
        "ecn_marks": 0,
        "late_frames": 0,
    }


def sum_stats(passes: Iterable[dict[str, Any]]) -> dict[str, Any]:
    """The counters of several passes as one: sums, the largest peak, pool
    sizes as they are, and ``mean_slots`` for the occupancy's sum and
    samples."""
    total = zero_stats()
    for stats in passes:
        for key, value in stats.items():
            if key == "peak_slots":
                total[key] = max(total[key], value)
            elif key == "pool_rows":
                total[key].update(value)
            elif key == "blocks":
                for plan, count in value.items():
                    total[key][plan] = total[key].get(plan, 0) + count
            else:
                total[key] += value
    samples = total.pop("occupancy_samples")
    occupancy = total.pop("occupancy_sum")
    total["mean_slots"] = occupancy / samples if samples else 0.0
    return total
