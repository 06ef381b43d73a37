"""Run output: ``metrics.jsonl`` records, the summary line, resource readings.

Every run appends one JSON record per epoch to ``metrics.jsonl`` and ends with a
``{"kind": "summary", ...}`` record whose fields are also printed as one
machine-readable line::

    summary test_acc=0.8150 val_acc=0.7960 epochs=200 epoch_s_median=0.012

The records are strict JSON: a NaN or infinite number (a diverged loss) is
``null``. The file is written to a temporary name and renamed when the run
closes, so a crashed run never leaves a ``metrics.jsonl`` that looks complete;
a record is written whole or not at all, so a full disk never leaves half a
line that a JSON-lines reader would fail on.
"""

from __future__ import annotations

import errno
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
        self._fd: int | None = None
        self._size = 0  # bytes of whole records in the file
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
        if self._fd is None:
            self.out_dir.mkdir(parents=True, exist_ok=True)
            # Unbuffered: a line is in the file or not, never in a buffer
            # that the close would flush again after a failed write.
            flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC
            self._fd = os.open(self._partial, flags, 0o666)
            self._size = 0
        record = {"kind": kind, "time": round(time.time() - self._started, 4), **fields}
        line = json.dumps(_strict(record), allow_nan=False) + "\n"
        data = line.encode()
        try:
            _write_all(self._fd, data)
        except BaseException as error:
            self._take_back()
            if isinstance(error, OSError):  # a full disk: the bare error names no file
                raise write_failed(self._partial, error) from None
            raise
        self._size += len(data)

    def _take_back(self) -> None:
        """Cut the file back to its whole records, after a write that stopped
        part-way (a disk that filled up mid-line)."""
        assert self._fd is not None
        try:
            os.ftruncate(self._fd, self._size)
            os.lseek(self._fd, self._size, os.SEEK_SET)
        except OSError:
            pass  # a device (/dev/full) cannot be cut, nor did it keep anything

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self._fd is None:
            return
        try:
            os.close(self._fd)  # (a network file system may report a write here)
        except OSError as error:
            if exc_type is not None:
                return  # that failed write is the error to tell
            raise write_failed(self._partial, error) from None
        if exc_type is None and self.final:
            assert self.path is not None
            os.replace(self._partial, self.path)


def _write_all(fd: int, data: bytes) -> None:
    """Write all of ``data`` to ``fd``: one ``os.write`` may write less (a
    disk that fills up mid-line; the next write then says why)."""
    view = memoryview(data)
    while view:
        written = os.write(fd, view)
        if written == 0:  # no progress and no error: no room, in effect
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        view = view[written:]
