"""`WorkerFailed`: the error of a launch whose worker failed or timed out."""

from __future__ import annotations

from typing import Any

# Errors that report a bad input or setting, not a fault of graphwire's.
USAGE_ERRORS = (ValueError, FileNotFoundError, FileExistsError)


class WorkerFailed(RuntimeError):
    """A worker process of :func:`launch_local` failed, or the run timed out.

    Attributes:
        rank: the rank that failed first (a root cause is preferred over a
            peer's resulting ``TransportError``).
        exitcode: its exit code (negative: killed by that signal), or None if
            it was still running (timeout).
        failures: a one-line description of what happened to every rank that
            did not finish cleanly, by rank.
        usage: the first failure is a bad input or setting (``ValueError``,
            ``FileNotFoundError``, ``FileExistsError``), which its first line
            says in full: a command line reports that line alone.
    """

    def __init__(
        self,
        message: str,
        rank: int,
        exitcode: int | None = None,
        failures: dict[int, str] | None = None,
        usage: bool = False,
    ) -> None:
        super().__init__(message)
        self.rank = rank
        self.exitcode = exitcode
        self.failures = dict(failures or {})
        self.usage = usage

    def __reduce__(self) -> tuple[Any, ...]:
        args = (str(self), self.rank, self.exitcode, self.failures, self.usage)
        return (type(self), args)


def not_started(rank: int, why: str) -> WorkerFailed:
    """The error of a launch whose rank ``rank`` could not be started."""
    return WorkerFailed(f"rank {rank} could not be started: {why}", rank)
