"""Watching a launch's workers: their results, their failures, their stop."""

from __future__ import annotations

import math
import pickle
import signal
import time
from dataclasses import dataclass, field
from multiprocessing import connection
from multiprocessing.process import BaseProcess
from typing import Any

from graphwire.comm.launch.errors import WorkerFailed

PEER_REPORT_S = 3.0  # after a failure, how long the others get to report theirs
# (of more than two ranks, a survivor takes 2 s to see which stopped beating)
TERMINATE_GRACE_S = 2.0  # SIGTERM, then SIGKILL after this


@dataclass
class _Failure:
    """What happened to one rank that did not finish cleanly."""

    rank: int
    summary: str
    traceback: str = ""
    exitcode: int | None = None
    from_peer: bool = False  # a TransportError: most likely another rank's fault
    usage: bool = False  # a bad input or setting (USAGE_ERRORS)


@dataclass
class Watch:
    """A launcher's watch over its children.

    It follows every child's pipe and exit sentinel until all are done, one
    fails, or the deadline passes."""

    processes: list[BaseProcess]
    pipes: list[connection.Connection]
    deadline: float
    timeout_s: float
    results: dict[int, Any] = field(default_factory=dict)
    failures: dict[int, _Failure] = field(default_factory=dict)
    exited: set[int] = field(default_factory=set)
    open_pipes: set[int] = field(default_factory=set)

    def run(self) -> list[Any]:
        world = len(self.processes)
        self.open_pipes = set(range(world))
        first_failure: float | None = None
        while len(self.exited) < world:
            now = time.monotonic()
            if first_failure is None and self.failures:
                first_failure = now
            until = self.deadline
            if first_failure is not None:
                until = min(until, first_failure + PEER_REPORT_S)
            if now >= until:
                break
            waitables: dict[Any, tuple[str, int]] = {}
            for rank in self.open_pipes:
                waitables[self.pipes[rank]] = ("pipe", rank)
            for rank, process in enumerate(self.processes):
                if rank not in self.exited:
                    waitables[process.sentinel] = ("exit", rank)
            wait_s = None if until == math.inf else until - now
            for ready in connection.wait(list(waitables), timeout=wait_s):
                kind, rank = waitables[ready]
                if kind == "pipe":
                    self._receive(rank)
                else:
                    self._reap(rank)
        if not self.failures and len(self.exited) < world:
            for rank in range(world):
                if rank not in self.exited:
                    self.failures[rank] = _Failure(
                        rank, f"did not finish within {self.timeout_s:g}s"
                    )
        if self.failures:
            raise self._error()
        return [self.results[rank] for rank in range(world)]

    def _receive(self, rank: int) -> None:
        try:
            data = self.pipes[rank].recv_bytes()
        except (EOFError, OSError):
            self.open_pipes.discard(rank)
            return
        try:
            message = pickle.loads(data)
        except Exception as error:  # e.g. the result's class cannot be imported
            self._fail(rank, f"sent a result that cannot be unpickled: {error!r}")
            return
        if message[0] == "ok":
            self.results[rank] = message[1]
        else:
            _, summary, text, from_peer, usage = message
            self._fail(rank, f"raised {summary}", text, from_peer, usage=usage)

    def _reap(self, rank: int) -> None:
        process = self.processes[rank]
        # The sentinel closes as the child's files close, a moment before the
        # kernel reports its exit status: wait for that moment.
        process.join(TERMINATE_GRACE_S)
        self.exited.add(rank)
        while rank in self.open_pipes and self.pipes[rank].poll():
            self._receive(rank)  # what it sent just before exiting
        code = process.exitcode
        if rank in self.failures:
            self.failures[rank].exitcode = code
        elif code != 0:
            self._fail(rank, _describe_exit(code), exitcode=code)
        elif rank not in self.results:
            self._fail(
                rank, "exited with code 0 without returning a result", exitcode=0
            )

    def _fail(
        self,
        rank: int,
        summary: str,
        text: str = "",
        from_peer: bool = False,
        exitcode: int | None = None,
        usage: bool = False,
    ) -> None:
        self.failures.setdefault(
            rank, _Failure(rank, summary, text, exitcode, from_peer, usage)
        )

    def _error(self) -> WorkerFailed:
        # dicts keep insertion order: the first failure seen comes first
        ordered = sorted(self.failures.values(), key=lambda f: f.from_peer)
        world = len(self.processes)
        reported = self.exited | set(self.failures) | set(self.results)
        silent = [rank for rank in range(world) if rank not in reported]
        if ordered[0].from_peer and len(silent) == 1:
            # Every failure is a peer's, and one rank never reported (hung,
            # or stopped): that is the rank they waited for.
            summary = "stopped responding: its peers timed out waiting for it"
            ordered = [_Failure(silent[0], summary), *ordered]
        first = ordered[0]
        lines = [f"rank {first.rank} {first.summary}"]
        others = {f.rank: f.summary for f in ordered[1:]}
        for rank in range(world):
            listed = rank == first.rank or rank in others
            if rank not in self.exited and rank not in self.failures and not listed:
                done = "returned, not yet exited" if rank in self.results else "running"
                others[rank] = f"{done}; stopped by the launcher"
        for rank in sorted(others):
            lines.append(f"  rank {rank}: {others[rank]}")
        if first.traceback:
            lines.append(f"--- traceback of rank {first.rank} ---")
            lines.append(first.traceback.rstrip())
        failures = {f.rank: f.summary for f in ordered} | others
        message = "\n".join(lines)
        return WorkerFailed(message, first.rank, first.exitcode, failures, first.usage)


def _describe_exit(code: int | None) -> str:
    if code is not None and code < 0:
        try:
            name = signal.Signals(-code).name
        except ValueError:
            name = f"signal {-code}"
        return f"was killed by {name} (exit code {code})"
    return f"exited with code {code}"


def stop(processes: list[BaseProcess]) -> None:
    """Terminate every child still running (by PID), and reap them all.

    SIGTERM first, then SIGKILL after a grace period."""
    alive = [p for p in processes if p.is_alive()]
    for process in alive:
        process.terminate()
    deadline = time.monotonic() + TERMINATE_GRACE_S
    for process in alive:
        process.join(max(0.0, deadline - time.monotonic()))
    for process in alive:
        if process.is_alive():
            process.kill()
            process.join(TERMINATE_GRACE_S)
    for process in processes:
        if process.exitcode is not None:
            process.close()
