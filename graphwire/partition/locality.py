"""G3's locality-aware iterative partitioning (Wan et al., SIGMOD 2023, §4.2).

Stage 1 is multi-constraint METIS balancing node count and degree sum (the
paper's Eq. 1-3). Stage 2 is Algorithm 1: repeatedly swap one node of the part
with the most remote nodes, ``A = argmax_p |V_p^remote|``, against one node of
the part with the fewest, ``B = argmin_p |V_p^remote|``, until
``(max - min) / max <= gamma`` (the paper's gamma = 0.5%).

Our reading of Algorithm 1 (lines 10-11). The paper picks ``v_max``, the node of
``A`` with the most out-of-part neighbours, and ``v_min = argmin_{v in B}
|N(v) - A|``, the node of ``B`` with the fewest neighbours outside ``A`` (the
remote neighbours it would bring into ``A``). Both counts are proxies for what
the swap does to ``|V_A^remote|``, so by default (``rule="gain"``) we score the
exact effect instead; ``rule="paper"`` keeps the paper's proxies.

    leave(v)  nodes that stop being remote to A when v leaves A: in-neighbours
              u outside A whose only edge into A is u -> v (links[A, u] == 1),
              minus 1 if v itself becomes remote to A (it has an edge into A)
    enter(w)  nodes that become remote to A when w joins A: in-neighbours u
              outside A with no edge into A yet (links[A, u] == 0), minus 1 if
              w was remote to A already

``v = argmax leave``, ``w = argmin enter``. The paper does not say whether a
swap that does not help is kept; we apply the swap and keep it only if both
``|V_A^remote|`` and ``|V_B^remote|`` end below the old maximum, the edge cut
stays within ``max_cut_growth`` and the degree sums within ``degree_slack``;
otherwise we undo it and try the next candidate pair. Every kept swap makes the
descending-sorted vector of ``|V_p^remote|`` strictly smaller in lexicographic
order, so no state can repeat: the paper's "cyclic swapping" shows up as "no
improving swap among ``patience`` tries". Swaps keep every ``|V_p|`` exactly.

Edge cut. Ranking by halo change alone moves hubs (a hub's many remote
neighbours make it the best ``v``) and grows the cut. So candidates are ranked by
``weight * score - cut_change`` with ``weight`` from :data:`HALO_WEIGHTS`, cheap
swaps first; after ``patience`` rejections in a row the next weight takes over,
and the last one ranks by halo change alone (cut change breaks ties), as the
paper does. We stop when that one has no improving swap either.

Bookkeeping (the paper's fast neighbour tracking,
:class:`~graphwire.partition.halo.HaloTracker`). On the deduplicated graph
without self-loops, ``links[p, u]`` counts u's out-neighbours in part p (the
in-edges u sends into p), so ``u in V_p^remote  iff  links[p, u] > 0 and
owner[u] != p``. Moving x from A to B changes only ``links[A | B, in(x)]`` and
x's own membership, so a move costs O(in-degree(x)) numpy work and only
``|V_A^remote|`` and ``|V_B^remote|`` change. Candidates come from per-part
batches: one vectorised pass scores a part's nodes (O(|V_p| + |E(V_p)|)), the
best ``batch_size`` go into a heap, and each is re-scored in O(degree) when
popped (lazy greedy); a batch is rebuilt when its best re-scored node falls below
the best node left out of it.

Shapes (N nodes, P parts): ``owner`` int64 [N], ``links`` int32 [P, N] (4PN
bytes: 157 MB for ogbn-products in 16 parts), ``halo`` int [P].
"""

from __future__ import annotations

import dataclasses
import heapq
import logging
import math
import numbers
import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from graphwire.graph.graph import Graph
from graphwire.graph.seeds import is_int
from graphwire.partition.base import (
    Partition,
    Partitioner,
    register,
)
from graphwire.partition.halo import HaloTracker
from graphwire.partition.metis import MetisPartitioner

__all__ = ["LocalityPartitioner", "RefineResult", "refine"]

logger = logging.getLogger(__name__)

RULES = ("gain", "paper")
#: Halo-vs-cut exchange rates tried in turn (see `refine`); the last one ranks by
#: halo change alone (|cut change| <= 2 * max degree < 2**32), edge cut on ties.
HALO_WEIGHTS = (1, 2, 4, 8, 16, 32, 64, 128, 1 << 32)


class _Batch:
    """Lazy-greedy heap over the best candidates for moving ``frm -> to``."""

    def __init__(
        self,
        tracker: HaloTracker,
        move: tuple[int, int, int],
        rule: str,
        weight: int,
        size: int,
    ) -> None:
        self.tracker = tracker
        self.frm, self.to, self.side = move
        self.rule, self.weight, self.size = rule, weight, size
        self.heap: list[tuple[int, int]] = []
        self.floor = np.iinfo(np.int64).min
        self.tried: set[int] = set()

    def _key(self, node: int) -> int:
        return int(self._keys(np.array([node], dtype=np.int64))[0])

    def _keys(self, nodes: np.ndarray) -> np.ndarray:
        return self.tracker.keys(
            nodes, self.frm, self.to, self.side, self.rule, self.weight
        )

    def _rebuild(self) -> None:
        nodes = np.flatnonzero(self.tracker.owner == self.frm)
        keys = self._keys(nodes)
        self.floor = np.iinfo(np.int64).min
        if nodes.shape[0] > self.size:
            top = np.argpartition(-keys, self.size)[: self.size + 1]
            top = top[np.lexsort((nodes[top], -keys[top]))]
            self.floor = int(keys[top[-1]])
            top = top[:-1]
            nodes, keys = nodes[top], keys[top]
        self.heap = [
            (-int(k), int(v))
            for k, v in zip(keys, nodes, strict=True)
            if int(v) not in self.tried
        ]
        heapq.heapify(self.heap)

    def pop(self) -> int | None:
        """The best node still in ``frm`` (re-scored now), or None."""
        for _ in range(2):
            while self.heap:
                _, node = heapq.heappop(self.heap)
                if self.tracker.owner[node] != self.frm:
                    continue
                key = self._key(node)
                if key < self.floor:
                    continue  # nodes left out of the batch may be better now
                if self.heap and key < -self.heap[0][0]:
                    heapq.heappush(self.heap, (-key, node))
                    continue
                self.tried.add(node)
                return node
            self._rebuild()
        return None


@dataclass(frozen=True)
class RefineResult:
    """What Algorithm 1 did: halo sizes and edge cut before and after.

    ``edge_cut_*`` count directed in-edges across parts, as
    :class:`~graphwire.partition.stats.PartitionStats` does; ``halo_*`` are its
    ``num_halo`` (|V_p^remote| per part).
    """

    halo_before: tuple[int, ...]
    halo_after: tuple[int, ...]
    degree_sum_before: tuple[int, ...]
    degree_sum_after: tuple[int, ...]
    edge_cut_before: int
    edge_cut_after: int
    num_swaps: int
    num_rejected: int
    stop_reason: str
    seconds: float

    @staticmethod
    def spread(halo: tuple[int, ...]) -> float:
        """(max - min) / max of the halo sizes (0.0 when all are 0)."""
        return (max(halo) - min(halo)) / max(halo) if max(halo) else 0.0

    @staticmethod
    def max_min(halo: tuple[int, ...]) -> float:
        """max / min of the halo sizes (inf if one part has none; 1.0 if all)."""
        if min(halo) == 0:
            return 1.0 if max(halo) == 0 else float("inf")
        return max(halo) / min(halo)

    @property
    def cut_growth(self) -> float:
        """Relative edge-cut change, after / before - 1.

        0.0 for a cut that stays 0, inf for one that grows from 0."""
        if self.edge_cut_before == 0:
            return 0.0 if self.edge_cut_after == 0 else float("inf")
        return self.edge_cut_after / self.edge_cut_before - 1.0

    def summary(self) -> dict[str, Any]:
        """Flat numbers for logs, JSON-ready.

        A ratio that would be inf (a halo max/min over an empty halo, a cut
        growth from 0) is None, as JSON has no Infinity."""
        return {
            "halo_max_min_before": _json_ratio(self.max_min(self.halo_before)),
            "halo_max_min_after": _json_ratio(self.max_min(self.halo_after)),
            "spread_after": round(self.spread(self.halo_after), 4),
            "degree_max_mean_before": round(_max_mean(self.degree_sum_before), 4),
            "degree_max_mean_after": round(_max_mean(self.degree_sum_after), 4),
            "edge_cut_before": self.edge_cut_before,
            "edge_cut_after": self.edge_cut_after,
            "cut_growth": _json_ratio(self.cut_growth),
            "num_swaps": self.num_swaps,
            "num_rejected": self.num_rejected,
            "stop_reason": self.stop_reason,
            "seconds": round(self.seconds, 3),
        }


def _json_ratio(value: float) -> float | None:
    return None if value == float("inf") else round(value, 4)


def _max_mean(values: tuple[int, ...]) -> float:
    mean = sum(values) / len(values)
    return max(values) / mean if mean > 0 else 1.0


def _directed_cut(graph: Graph, owner: np.ndarray) -> int:
    src, dst = graph.indices.numpy(), graph.dst_of_edges.numpy()
    return int(np.count_nonzero(owner[src] != owner[dst]))


def refine(
    graph: Graph,
    assignment: np.ndarray,
    num_parts: int,
    *,
    gamma: float = 0.005,
    max_swaps: int = 100_000,
    max_cut_growth: float | None = 0.10,
    degree_slack: float | None = 0.05,
    rule: str = "gain",
    batch_size: int = 4096,
    patience: int = 16,
) -> tuple[np.ndarray, RefineResult]:
    """Algorithm 1: swap nodes until ``|V_p^remote|`` is balanced.

    Candidates are ranked by ``weight * halo_score - cut_change`` for each
    weight of :data:`HALO_WEIGHTS` in turn: cheap swaps (little edge cut per
    remote node moved) first; when ``patience`` swaps in a row are rejected, the
    next, more halo-hungry weight takes over. Stops when balanced
    (``"converged"``), after ``max_swaps`` swaps, or when the last weight finds
    no improving swap (``"no_improving_swap"``).

    Args:
        graph: The graph.
        assignment: int [N] stage-1 part IDs in ``[0, num_parts)``.
        num_parts: P.
        gamma: Stop when ``(max - min) / max`` of the halo sizes is at most this.
        max_swaps: Stop after this many kept swaps.
        max_cut_growth: Reject swaps that grow the (deduplicated) edge cut by
            more than this fraction of its stage-1 value; None (or inf) for
            no limit.
        degree_slack: Reject swaps that leave a part's degree sum above
            ``max(stage-1 maximum, (1 + degree_slack) * mean)``; None (or
            inf): no limit.
        rule: ``"gain"`` (exact halo change) or ``"paper"`` (the paper's counts).
        batch_size: Candidates per lazy-greedy batch.
        patience: Rejected swaps in a row before the next weight (or stopping).

    Returns:
        ``(assignment, result)``: int64 [N] refined part IDs and a
        :class:`RefineResult`.

    Raises:
        ValueError: Unknown ``rule``, or ``assignment`` is not [N] part IDs in
            ``[0, num_parts)``.
    """
    if rule not in RULES:
        raise ValueError(f"rule: expected one of {RULES}, found {rule!r}")
    assignment = np.asarray(assignment)
    if assignment.shape != (graph.num_nodes,) or (
        assignment.size and not 0 <= assignment.min() <= assignment.max() < num_parts
    ):
        raise ValueError(
            f"assignment: expected [num_nodes={graph.num_nodes}] part IDs in "
            f"[0, {num_parts}), found shape {assignment.shape}"
            + (
                f" and range [{assignment.min()}, {assignment.max()}]"
                if assignment.size
                else ""
            )
        )
    start = time.perf_counter()
    tracker = HaloTracker(graph, assignment, num_parts)
    halo_before, cut_before = tuple(tracker.halo), _directed_cut(graph, tracker.owner)
    degree_before = tuple(tracker.degree_sum)
    cut_limit = float("inf")
    if max_cut_growth is not None:
        cut_limit = tracker.edge_cut * (1.0 + max_cut_growth)
    degree_limit = float("inf")
    if degree_slack is not None:
        mean = sum(tracker.degree_sum) / num_parts
        degree_limit = max(max(tracker.degree_sum), (1.0 + degree_slack) * mean)
    weights = iter(HALO_WEIGHTS)
    weight = next(weights)
    batches: dict[tuple[int, int, int], _Batch] = {}

    def batch(frm: int, to: int, side: int) -> _Batch:
        key = (frm, to, side)
        if key not in batches:
            batches[key] = _Batch(tracker, key, rule, weight, batch_size)
        return batches[key]

    num_swaps = num_rejected = rejected_in_row = 0
    while True:
        halo = tracker.halo
        big, small = int(np.argmax(halo)), int(np.argmin(halo))
        # Balance first: the last allowed swap may be the one that reaches it.
        if num_parts < 2 or halo[big] - halo[small] <= gamma * halo[big]:
            stop = "converged"
            break
        if num_swaps >= max_swaps:
            stop = "max_swaps"
            break
        if rejected_in_row >= patience:
            next_weight = next(weights, None)
            if next_weight is None:
                stop = "no_improving_swap"
                break
            weight, rejected_in_row = next_weight, 0
            batches.clear()
        out, into = batch(big, small, big), batch(small, big, big)
        v, w = out.pop(), into.pop()
        if v is None or w is None:
            rejected_in_row = patience  # nothing left at this weight
            continue
        old_max = halo[big]
        tracker.move(v, small)
        tracker.move(w, big)
        if (
            max(tracker.halo[big], tracker.halo[small]) < old_max
            and tracker.edge_cut <= cut_limit
            and max(tracker.degree_sum[big], tracker.degree_sum[small]) <= degree_limit
        ):
            num_swaps += 1
            rejected_in_row = 0
            out.tried.clear()
            into.tried.clear()
        else:
            tracker.move(w, small)
            tracker.move(v, big)
            num_rejected += 1
            rejected_in_row += 1
    result = RefineResult(
        halo_before=halo_before,
        halo_after=tuple(tracker.halo),
        degree_sum_before=degree_before,
        degree_sum_after=tuple(tracker.degree_sum),
        edge_cut_before=cut_before,
        edge_cut_after=_directed_cut(graph, tracker.owner),
        num_swaps=num_swaps,
        num_rejected=num_rejected,
        stop_reason=stop,
        seconds=time.perf_counter() - start,
    )
    logger.info("locality refinement: %s", result.summary())
    return tracker.owner, result


def _is_real(value: Any) -> bool:
    return isinstance(value, numbers.Real) and not isinstance(value, bool)


@register("locality")
@dataclass(kw_only=True, slots=True)
class LocalityPartitioner(Partitioner):
    """G3 partitioning: multi-constraint METIS, then Algorithm 1 (module doc).

    Attributes:
        balance: METIS balance constraints of stage 1 (G3: node count and
            degree sum); a comma-separated string is accepted too.
        ufactor: METIS imbalance tolerance in thousandths (None: its default).
        gamma, max_swaps, max_cut_growth, degree_slack, rule, batch_size,
            patience: Stage 2's parameters, see :func:`refine`; an infinite
            ``max_cut_growth`` or ``degree_slack`` is recorded as None (no
            limit), as JSON has no Infinity.
        last_refinement: The :class:`RefineResult` of the latest ``assign``
            (not a parameter).
    """

    balance: tuple[str, ...] = ("count", "degree")
    ufactor: int | None = None
    gamma: float = 0.005
    max_swaps: int = 100_000
    max_cut_growth: float | None = 0.10
    degree_slack: float | None = 0.05
    rule: str = "gain"
    batch_size: int = 4096
    patience: int = 16
    last_refinement: RefineResult | None = field(
        default=None, init=False, repr=False, compare=False
    )

    def __post_init__(self) -> None:
        stage1 = self._stage1()  # validates balance and ufactor
        self.balance, self.ufactor = stage1.balance, stage1.ufactor
        if not _is_real(self.gamma) or not 0.0 <= self.gamma < 1.0:
            raise ValueError(f"gamma: expected a float in [0, 1), found {self.gamma!r}")
        self.gamma = float(self.gamma)  # a numpy float32 is not JSON
        for name, low in (("max_swaps", 0), ("batch_size", 1), ("patience", 1)):
            value = getattr(self, name)
            if not is_int(value) or value < low:
                raise ValueError(f"{name}: expected an int >= {low}, found {value!r}")
            setattr(self, name, int(value))  # a numpy int is not JSON
        for name in ("max_cut_growth", "degree_slack"):
            value = getattr(self, name)
            if value is None or (_is_real(value) and value == math.inf):
                setattr(self, name, None)  # no limit; JSON has no Infinity
            elif _is_real(value) and 0 <= value < math.inf:
                setattr(self, name, float(value))
            else:
                raise ValueError(
                    f"{name}: expected a number >= 0, or None (or inf) for no "
                    f"limit, found {value!r}"
                )
        if self.rule not in RULES:
            raise ValueError(f"rule: expected one of {RULES}, found {self.rule!r}")

    def _stage1(self) -> MetisPartitioner:
        return MetisPartitioner(balance=self.balance, ufactor=self.ufactor)

    def _stage2(self) -> dict[str, Any]:
        return {
            "gamma": self.gamma,
            "max_swaps": self.max_swaps,
            "max_cut_growth": self.max_cut_growth,
            "degree_slack": self.degree_slack,
            "rule": self.rule,
            "batch_size": self.batch_size,
            "patience": self.patience,
        }

    def params(self) -> dict[str, Any]:
        return {**self._stage1().params(), **self._stage2()}

    def partition(self, graph: Graph, num_parts: int, *, seed: int = 0) -> Partition:
        """As :meth:`Partitioner.partition`, plus the ``constraints`` param.

        The constraints are those stage 1 balanced, as METIS's params record."""
        result = Partitioner.partition(self, graph, num_parts, seed=seed)
        used = self._stage1().constraints(graph, int(num_parts))
        params = {**result.params, "constraints": list(used)}
        return dataclasses.replace(result, params=params)

    def assign(self, graph: Graph, num_parts: int, seed: int) -> np.ndarray:
        initial = self._stage1().assign(graph, num_parts, seed)
        refined, self.last_refinement = refine(
            graph, initial, num_parts, **self._stage2()
        )
        return refined
