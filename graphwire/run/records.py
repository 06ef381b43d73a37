"""Run output: ``metrics.jsonl`` records, the summary line, resource readings.

Every run appends one JSON record per epoch to ``metrics.jsonl`` and ends with a
``{"kind": "summary", ...}`` record whose fields are also printed as one
machine-readable line::

    summary test_acc=0.8150 val_acc=0.7960 epochs=200 epoch_s_median=0.012

The records are strict JSON: a NaN or infinite number (a diverged loss) is
``null``. The file is written to a temporary name and renamed when the run
closes, so a crashed run never leaves a ``metrics.jsonl`` that looks complete.
"""

from __future__ import annotations

import json
import math
import os
import resource
import time
from pathlib import Path
from types import TracebackType
from typing import Any

from graphwire.fsutil import write_failed

__all__ = ["MetricsLog", "format_summary", "peak_rss_mb"]


def _strict(value: Any) -> Any:
    """``value`` with every NaN or infinite float as None (``null``): JSON has
    neither, and a log of a diverged run must still parse."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {key: _strict(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [_strict(item) for item in value]
    return value


def peak_rss_mb() -> float:
    """Peak resident memory of this process so far, in MiB (Linux ru_maxrss is KiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


def _format_value(value: Any) -> str:
    if isinstance(value, bool):
        return str(int(value))
    if isinstance(value, float):
        return f"{value:.4f}" if abs(value) >= 1e-3 or value == 0 else f"{value:.3g}"
    return str(value)


def format_summary(fields: dict[str, Any]) -> str:
    """``summary k1=v1 k2=v2 ...`` in the given key order, floats to 4 places."""
    return "summary " + " ".join(f"{k}={_format_value(v)}" for k, v in fields.items())


class MetricsLog:
    """Collects records for one run and writes ``<out>/metrics.jsonl``.

    Use as a context manager; records go to ``metrics.jsonl.partial`` as they
    come (so a long run can be watched; the file, and ``out_dir``, are made
    at the first record: a log that records nothing leaves an earlier run's
    file as it was) and the file is renamed to
    ``metrics.jsonl`` only when the run closes without an error. With
    ``final=False`` it never is: a distributed run's rank 0 streams its own
    records there while it trains, and the report written at the end, with
    every rank's records, replaces them.
    """

    def __init__(
        self, out_dir: str | os.PathLike[str] | None, *, final: bool = True
    ) -> None:
        self.out_dir = None if out_dir is None else Path(out_dir)
        self.final = final
        self._handle: Any = None
        self._started = time.time()

    def __enter__(self) -> MetricsLog:
        return self

    @property
    def _partial(self) -> Path:
        assert self.out_dir is not None
        return self.out_dir / "metrics.jsonl.partial"

    @property
    def path(self) -> Path | None:
        return None if self.out_dir is None else self.out_dir / "metrics.jsonl"

    def write(self, kind: str, **fields: Any) -> None:
        """Append one record ``{"kind": kind, "time": ..., **fields}``; ``time``
        is seconds since the log was opened unless ``fields`` give it."""
        if self.out_dir is None:
            return
        if self._handle is None:
            self.out_dir.mkdir(parents=True, exist_ok=True)
            self._handle = open(self._partial, "w")  # noqa: SIM115 - closed in __exit__
        record = {"kind": kind, "time": round(time.time() - self._started, 4), **fields}
        line = json.dumps(_strict(record), allow_nan=False) + "\n"
        try:
            self._handle.write(line)
            self._handle.flush()
        except OSError as error:  # a full disk: the bare error names no file
            raise write_failed(self._partial, error) from None

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self._handle is None:
            return
        try:
            self._handle.close()  # flushes again what a failed write left
        except OSError as error:
            if exc_type is not None:
                return  # that failed write is the error to tell
            raise write_failed(self._partial, error) from None
        if exc_type is None and self.final:
            assert self.path is not None
            os.replace(self._partial, self.path)
