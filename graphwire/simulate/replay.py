"""`workload_from_traces`: a captured step as a :class:`Workload`.

Each rank is a chain in program order. The CPU its thread used between two
transfers becomes a compute task, scaled so that the rank's compute adds up
to its least over the traced repeats (times ``compute_scale``), or to a
calibrated figure. A send depends on everything the rank did before it and
does not hold the rank up (the engines' sends are asynchronous or buffered);
a receive holds up whatever the rank does after it, so the rank's next task
depends on the matching send, matched in order per (src, dst, tag) as the
transports deliver them. Back-to-back sends to one peer are one message (one
bulk transfer), under one tag, or any tags to the switch (a frame's rows
and header are two tags of it), as are back-to-back receives from the
switch.

The switch (peer ``world_size``) is a node of its own: what a rank receives
from it becomes a send from the aggregator node that depends on the ranks'
messages that carried the frames the switch needed for it (its causality
trace, :mod:`graphwire.comm.switch.server`): the frame that made it send,
every frame summed into a result, everything before a multicast that waited
for every worker.
"""

from __future__ import annotations

from collections import defaultdict, deque
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from graphwire.simulate.capture import Capture, Event, RankTrace
from graphwire.simulate.workload import Task, Workload

__all__ = ["layer_of", "workload_from_traces"]

# CPU below this between two transfers is bookkeeping, not a compute task.
_MIN_COMPUTE_S = 1e-6

Want = tuple[int, int, str, int]  # (src, dst, tag, k): the k-th such message


def layer_of(tag: str) -> int:
    """The layer a ledger tag names (``fwd.L2`` -> 2; ``sync.grad`` -> -1)."""
    for piece in reversed(tag.split(".")):
        if piece.startswith("L") and piece[1:].isdigit():
            return int(piece[1:])
    return -1


@dataclass(slots=True)
class _Node:
    task: Task
    wants: list[Want] = field(default_factory=list)
    after: list[int] = field(default_factory=list)  # node ids
    parts: dict[str, int] = field(default_factory=dict)  # a send's bytes per tag
    frames: list[int] = field(default_factory=list)  # switch frames it carried


@dataclass(slots=True)
class _Builder:
    world_size: int
    aggregator: int | None
    nodes: list[_Node] = field(default_factory=list)
    # (src, dst, tag) -> node ids of its messages, in order
    sent: dict[tuple[int, int, str], list[int]] = field(
        default_factory=lambda: defaultdict(list)
    )
    uploads: dict[tuple[int, int], int] = field(default_factory=dict)  # frame: node

    def add(
        self, task: Task, after: Sequence[int] = (), wants: Sequence[Want] = ()
    ) -> int:
        self.nodes.append(_Node(task, list(wants), list(after)))
        return len(self.nodes) - 1


def workload_from_traces(
    capture: Capture,
    *,
    aggregator: int | None = None,
    compute_scale: float = 1.0,
    compute_s: Sequence[float] | None = None,
) -> Workload:
    """One :class:`Workload` of every rank's traced step.

    Args:
        capture: :func:`~graphwire.simulate.capture.capture_epoch`'s.
        aggregator: the topology's aggregator node (needed when the step has
            the switch in it).
        compute_scale: multiplies every compute time.
        compute_s: per rank, the compute seconds to stretch its tasks to (a
            calibrating run's); overrides ``compute_scale``.

    Raises:
        ValueError: the switch is in the trace but there is no aggregator (or
            no switch trace), or a receive has no matching send.
    """
    world = len(capture.ranks)
    b = _Builder(world, aggregator)
    for trace in capture.ranks:
        scale = compute_scale * trace.least_cpu_s / trace.cpu_s if trace.cpu_s else 0.0
        if compute_s is not None and trace.cpu_s > 0:
            scale = compute_s[trace.rank] / trace.cpu_s
        _rank_chain(b, trace, scale)
    _switch_deps(b, capture.switch)
    return _ordered(b, world)


def _rank_chain(b: _Builder, trace: RankTrace, scale: float) -> None:
    rank, world = trace.rank, b.world_size
    ready: list[int] = []  # what the rank's next task waits for
    wants: list[Want] = []
    seen: dict[tuple[int, int, str], int] = defaultdict(int)  # recvs matched so far
    posted: dict[int, Want] = {}
    cpu = 0.0
    last: tuple[str, int, int] | None = None  # ("send" | "recv", peer, node)
    events = trace.events + [Event("end", -1, "", 0, trace.cpu_s, float("inf"))]
    for index, ev in enumerate(events):
        spent = ev.cpu - cpu
        if spent > _MIN_COMPUTE_S or ev.kind == "end":
            cpu = ev.cpu
            task = Task(rank, seconds=spent * scale, tag="compute")
            ready, wants, last = [b.add(task, ready, wants)], [], None
        switch = ev.peer == world
        if ev.kind == "send":
            if (
                last is not None
                and last[:2] == ("send", ev.peer)
                and (switch or ev.tag in b.nodes[last[2]].parts)
            ):
                node = last[2]
            else:
                dst = _aggregator(b) if switch else ev.peer
                node = b.add(Task(rank, dst=dst), ready, wants)
                last = ("send", ev.peer, node)
            _grow(b.nodes[node], ev.tag, ev.nbytes)
            if switch:
                b.uploads[(rank, ev.frame)] = node
            else:
                b.sent[(rank, ev.peer, ev.tag)].append(node)
        elif ev.kind in ("recv", "posted") and switch:
            if ev.kind == "posted":
                raise ValueError("a receive from the switch posted ahead")
            if last is not None and last[:2] == ("recv", world):
                node = last[2]
            else:
                node = b.add(Task(_aggregator(b), dst=rank))
                ready.append(node)
                last = ("recv", world, node)
            _grow(b.nodes[node], ev.tag, ev.nbytes)
            if not b.nodes[node].frames or b.nodes[node].frames[-1] != ev.frame:
                b.nodes[node].frames.append(ev.frame)
        elif ev.kind in ("recv", "posted"):
            last = None
            key = (ev.peer, rank, ev.tag)
            want = (*key, seen[key])
            seen[key] += 1
            if ev.kind == "posted":
                posted[index] = want
            else:
                wants.append(want)
        elif ev.kind == "wait":
            last = None
            wants.append(posted.pop(ev.ref))


def _switch_deps(b: _Builder, table: np.ndarray | None) -> None:
    """Each switch message waits for the uploads carrying the frames it needed."""
    downs = [n for n in b.nodes if n.frames]
    if not downs:
        return
    if table is None:
        raise ValueError("the step received from a switch that kept no trace")
    row_of = {(int(r), int(k)): i for i, (r, k) in enumerate(table[:, :2].tolist())}
    first: dict[int, int] = {}  # each rank's first traced upload frame
    for rank, frame in b.uploads:
        first[rank] = min(first.get(rank, frame), frame)
    for node in downs:
        rank = node.task.dst
        rows = [row_of[(rank, k)] for k in node.frames if (rank, k) in row_of]
        if len(rows) != len(node.frames):
            raise ValueError(f"the switch's trace lacks frames it sent rank {rank}")
        needed = table[rows, 2:].max(axis=0)
        for src, frame in enumerate(needed.tolist()):
            if frame < first.get(src, frame + 1):
                continue  # sent before the traced step: long done
            upload = b.uploads.get((src, frame))
            if upload is None:
                raise ValueError(
                    f"the switch needed frame {frame} of rank {src}, never sent"
                )
            node.after.append(upload)


def _grow(node: _Node, tag: str, nbytes: int) -> None:
    t = node.task
    if not node.parts:
        node.task = Task(t.node, t.seconds, t.dst, 0, t.deps, layer_of(tag), tag)
        t = node.task
    node.parts[tag] = node.parts.get(tag, 0) + nbytes
    node.task = Task(
        t.node, t.seconds, t.dst, t.nbytes + nbytes, t.deps, t.layer, t.tag
    )


def _aggregator(b: _Builder) -> int:
    if b.aggregator is None:
        raise ValueError(
            "the trace sends to a switch, but the topology has no aggregator"
        )
    return b.aggregator


def _ordered(b: _Builder, world: int) -> Workload:
    """Resolve matched sends, then list the tasks deps-first (Kahn's order)."""
    deps: list[set[int]] = []
    for node in b.nodes:
        need = set(node.after)
        for src, dst, tag, k in node.wants:
            sends = b.sent.get((src, dst, tag), [])
            if k >= len(sends):
                raise ValueError(
                    f"rank {dst} received message {k} of {tag} from {src}, "
                    "which it never sent"
                )
            need.add(sends[k])
        deps.append(need)
    users: list[list[int]] = [[] for _ in b.nodes]
    for user, need in enumerate(deps):
        for d in need:
            users[d].append(user)
    waiting = [len(need) for need in deps]
    queue = deque(n for n, w in enumerate(waiting) if w == 0)
    position: dict[int, int] = {}
    workload = Workload(world)
    while queue:
        n = queue.popleft()
        node = b.nodes[n]
        t = node.task
        split = tuple(node.parts.items()) if len(node.parts) > 1 else ()
        position[n] = workload.add(
            Task(
                t.node,
                t.seconds,
                t.dst,
                t.nbytes,
                tuple(sorted(position[d] for d in deps[n])),
                t.layer,
                t.tag,
                split,
            )
        )
        for user in users[n]:
            waiting[user] -= 1
            if waiting[user] == 0:
                queue.append(user)
    if len(position) != len(b.nodes):
        raise ValueError("the trace's tasks wait on each other in a cycle")
    return workload
