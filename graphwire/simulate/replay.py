"""`workload_from_traces`: the traced ranks' epoch as a :class:`Workload`.

Each rank is a chain in program order. The CPU its thread used between two
transfers becomes a compute task, scaled so that the rank's compute adds up
to its least over the traced repeats (times ``compute_scale``), or to a
calibrated figure. A send depends on
everything the rank did before it and does not hold the rank up (the engines'
sends are asynchronous or buffered); a receive holds up whatever the rank does
after it, so the rank's next task depends on the matching send, matched in
order per (src, dst, tag) as the transports deliver them. Back-to-back sends
to one peer under one tag are one message (one bulk transfer), as are
back-to-back receives from the switch.

The switch (peer ``world_size``) records nothing itself: what a rank receives
from it becomes a send from the aggregator node whose deps are, for every
rank, the last message that rank had sent the switch before it was received.
That is what the aggregator could have needed; a row's real contributors are
among them.
"""

from __future__ import annotations

import bisect
from collections import defaultdict, deque
from collections.abc import Sequence
from dataclasses import dataclass, field

from graphwire.simulate.capture import Event, RankTrace
from graphwire.simulate.workload import Task, Workload

__all__ = ["layer_of", "workload_from_traces"]

# CPU below this between two transfers is bookkeeping, not a compute task.
_MIN_COMPUTE_S = 1e-6


def layer_of(tag: str) -> int:
    """The layer a ledger tag names (``fwd.L2`` -> 2; ``sync.grad`` -> -1)."""
    for piece in reversed(tag.split(".")):
        if piece.startswith("L") and piece[1:].isdigit():
            return int(piece[1:])
    return -1


@dataclass(slots=True)
class _Node:
    task: Task
    wants: list[tuple[int, int, str, int]] = field(default_factory=list)  # sends
    after: list[int] = field(default_factory=list)  # node ids
    # a switch message: it waits for what every rank had sent the switch by
    # then (resolved once every rank's chain is built)
    wall: float | None = None


@dataclass(slots=True)
class _Builder:
    world_size: int
    aggregator: int | None
    nodes: list[_Node] = field(default_factory=list)
    # (src, dst, tag) -> node ids of its messages, in order
    sent: dict[tuple[int, int, str], list[int]] = field(
        default_factory=lambda: defaultdict(list)
    )
    # the switch: per rank, (wall, node) of what it sent the switch
    to_switch: dict[int, list[tuple[float, int]]] = field(
        default_factory=lambda: defaultdict(list)
    )

    def add(
        self,
        task: Task,
        after: Sequence[int] = (),
        wants: Sequence[tuple[int, int, str, int]] = (),
    ) -> int:
        self.nodes.append(_Node(task, list(wants), list(after)))
        return len(self.nodes) - 1


def workload_from_traces(
    traces: Sequence[RankTrace],
    *,
    aggregator: int | None = None,
    compute_scale: float = 1.0,
    compute_s: Sequence[float] | None = None,
) -> Workload:
    """One :class:`Workload` of every rank's traced step.

    Args:
        traces: :func:`~graphwire.simulate.capture.capture_epoch`'s, by rank.
        aggregator: the topology's aggregator node (needed when the trace has
            the switch in it).
        compute_scale: multiplies every compute time.
        compute_s: per rank, the compute seconds to stretch its tasks to (a
            calibrating run's); overrides ``compute_scale``.

    Raises:
        ValueError: the switch is in the trace but there is no aggregator, or
            a receive has no matching send (a trace cut short).
    """
    world = len(traces)
    b = _Builder(world, aggregator)
    for trace in traces:
        # The kept step's compute, brought down to the rank's least.
        scale = compute_scale * trace.least_cpu_s / trace.cpu_s if trace.cpu_s else 0.0
        if compute_s is not None and trace.cpu_s > 0:
            scale = compute_s[trace.rank] / trace.cpu_s
        _rank_chain(b, trace, scale)
    return _ordered(b, world)


def _rank_chain(b: _Builder, trace: RankTrace, scale: float) -> None:
    rank, world = trace.rank, b.world_size
    ready: list[int] = []  # what the rank's next task waits for
    wants: list[tuple[int, int, str, int]] = []
    seen: dict[tuple[int, int, str], int] = defaultdict(int)  # recvs matched so far
    posted: dict[int, tuple[int, int, str, int]] = {}
    cpu = 0.0
    last_send: tuple[int, str] | None = None
    last_switch: int | None = None  # node of the switch's message being extended
    events = trace.events + [Event("end", -1, "", 0, trace.cpu_s, float("inf"))]
    for index, ev in enumerate(events):
        spent = ev.cpu - cpu
        if spent > _MIN_COMPUTE_S or ev.kind == "end":
            cpu = ev.cpu
            node = b.add(
                Task(rank, seconds=spent * scale, layer=-1, tag="compute"), ready, wants
            )
            ready, wants, last_send, last_switch = [node], [], None, None
        if ev.kind == "send":
            dst = ev.peer if ev.peer < world else _aggregator(b)
            if last_send == (ev.peer, ev.tag):
                node = b.sent[(rank, ev.peer, ev.tag)][-1]
                _grow(b.nodes[node], ev.nbytes)
            else:
                task = Task(
                    rank, dst=dst, nbytes=ev.nbytes, layer=layer_of(ev.tag), tag=ev.tag
                )
                node = b.add(task, ready, wants)
                b.sent[(rank, ev.peer, ev.tag)].append(node)
                last_send = (ev.peer, ev.tag)
            if ev.peer == world:
                b.to_switch[rank].append((ev.wall, node))
            last_switch = None
        elif ev.kind in ("recv", "posted"):
            last_send = None
            if ev.peer == world:
                if ev.kind == "posted":
                    raise ValueError("a receive from the switch posted ahead")
                last_switch = _from_switch(b, rank, ev, last_switch, ready)
                continue
            last_switch = None
            key = (ev.peer, rank, ev.tag)
            want = (*key, seen[key])
            seen[key] += 1
            if ev.kind == "posted":
                posted[index] = want
            else:
                wants.append(want)
        elif ev.kind == "wait":
            wants.append(posted.pop(ev.ref))


def _from_switch(
    b: _Builder, rank: int, ev: Event, extend: int | None, ready: list[int]
) -> int:
    """The aggregator's message to ``rank`` that ``ev`` received (see module)."""
    if extend is not None and b.nodes[extend].task.tag == ev.tag:
        _grow(b.nodes[extend], ev.nbytes)
        b.nodes[extend].wall = ev.wall
        return extend
    task = Task(
        _aggregator(b), dst=rank, nbytes=ev.nbytes, layer=layer_of(ev.tag), tag=ev.tag
    )
    node = b.add(task)
    b.nodes[node].wall = ev.wall
    ready.append(node)
    return node


def _watermark(b: _Builder, wall: float) -> list[int]:
    deps = []
    for sends in b.to_switch.values():
        k = bisect.bisect_right(sends, (wall, float("inf"))) - 1
        if k >= 0:
            deps.append(sends[k][1])
    return deps


def _grow(node: _Node, nbytes: int) -> None:
    t = node.task
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
        if node.wall is not None:
            need.update(_watermark(b, node.wall))
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
        t = b.nodes[n].task
        position[n] = workload.add(
            Task(
                t.node,
                t.seconds,
                t.dst,
                t.nbytes,
                tuple(sorted(position[d] for d in deps[n])),
                t.layer,
                t.tag,
            )
        )
        for user in users[n]:
            waiting[user] -= 1
            if waiting[user] == 0:
                queue.append(user)
    if len(position) != len(b.nodes):
        raise ValueError("the trace's tasks wait on each other in a cycle")
    return workload
