"""`Workload`: one epoch as a graph of compute and send tasks, for any simulator.

A task starts when every task in its ``deps`` has finished (tasks are listed so
that deps come first). A **compute** task occupies nothing but time: it ends
``seconds`` after it starts (a host's compute tasks are chained through their
deps, so they never overlap unless the strategy overlaps them). A **send**
task moves ``nbytes`` of payload from ``node`` to ``dst`` over the
topology's route and ends when the last byte has arrived at ``dst``. Nodes
are the topology's: hosts ``0..H-1``, and the aggregator switch for
``--exchange switch`` (``Topology.aggregator``).

The packet simulator (ns-3) and the flow model both run a `Workload` and
return a :class:`SimResult`; they differ only in how sends share the links.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

__all__ = ["LinkStats", "SimResult", "Task", "Workload"]


@dataclass(frozen=True, slots=True)
class Task:
    """One compute or send step (see the module docstring).

    Attributes:
        node: where it runs (the sender, for a send).
        seconds: compute time; 0 for a send.
        dst: the receiving node of a send; -1 for compute.
        nbytes: payload bytes of a send; 0 for compute.
        deps: indices of the tasks that must finish first (all smaller).
        layer: the layer it belongs to (-1: none), for per-layer times.
        tag: what it is, as the ledger names it (``fwd.L1``, ``compute``).
        split: for a send that carries several tags (a switch frame's rows
            and header), its bytes per tag; empty: all under ``tag``.
    """

    node: int
    seconds: float = 0.0
    dst: int = -1
    nbytes: int = 0
    deps: tuple[int, ...] = ()
    layer: int = -1
    tag: str = ""
    split: tuple[tuple[str, int], ...] = ()

    @property
    def is_send(self) -> bool:
        return self.dst >= 0


@dataclass(slots=True)
class Workload:
    """The tasks of one epoch of one strategy on ``num_hosts`` hosts."""

    num_hosts: int
    tasks: list[Task] = field(default_factory=list)

    def add(self, task: Task) -> int:
        """Append ``task`` and return its index (for later tasks' deps)."""
        for d in task.deps:
            if not 0 <= d < len(self.tasks):
                raise ValueError(f"task {len(self.tasks)} depends on unknown task {d}")
        if task.is_send and task.dst == task.node:
            raise ValueError(f"a send from node {task.node} to itself")
        if task.nbytes < 0 or task.seconds < 0:
            raise ValueError("a task cannot take negative bytes or time")
        self.tasks.append(task)
        return len(self.tasks) - 1

    def compute(
        self, node: int, seconds: float, deps: tuple[int, ...] = (), **kw: object
    ) -> int:
        return self.add(Task(node, seconds=seconds, deps=deps, **kw))  # type: ignore[arg-type]

    def send(
        self, node: int, dst: int, nbytes: int, deps: tuple[int, ...] = (), **kw: object
    ) -> int:
        return self.add(Task(node, dst=dst, nbytes=nbytes, deps=deps, **kw))  # type: ignore[arg-type]

    def bytes_between(self) -> dict[tuple[int, int, str], int]:
        """Payload bytes per (src, dst, tag), summed over the sends."""
        out: dict[tuple[int, int, str], int] = {}
        for t in self.tasks:
            if t.is_send and t.nbytes:
                for tag, nbytes in t.split or ((t.tag, t.nbytes),):
                    key = (t.node, t.dst, tag)
                    out[key] = out.get(key, 0) + nbytes
        return out


@dataclass(frozen=True, slots=True)
class LinkStats:
    """Wire bytes per directed link ``(a, b)`` (headers included)."""

    bytes: dict[tuple[int, int], int]

    @property
    def max(self) -> int:
        return max(self.bytes.values(), default=0)

    @property
    def mean(self) -> float:
        return float(np.mean(list(self.bytes.values()))) if self.bytes else 0.0


@dataclass(frozen=True, slots=True)
class SimResult:
    """What one simulated epoch gave.

    Attributes:
        simulator: ``ns-3`` or ``flow``.
        start, finish: float64 [num_tasks] each task's start and end, seconds.
        links: wire bytes per directed link.
        peak_queue_bytes: the largest switch egress queue seen (0 in the flow
            model, which has no queues).
        queue_trace: float64 [n, 2] (time s, bytes) of the busiest egress
            queue, or empty.
        ecn_marks: packets marked by the switches (ns-3 only).
    """

    simulator: str
    start: np.ndarray
    finish: np.ndarray
    links: LinkStats
    peak_queue_bytes: int = 0
    queue_trace: np.ndarray = field(default_factory=lambda: np.zeros((0, 2)))
    ecn_marks: int = 0

    @property
    def makespan(self) -> float:
        return float(self.finish.max()) if self.finish.size else 0.0
