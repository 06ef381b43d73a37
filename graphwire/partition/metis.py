"""METIS partitioning with multi-constraint balance (the DistDGL default).

METIS minimises the edge cut of the *undirected* graph, so the input is the
symmetrised graph without self-loops; the cut it reports counts each undirected
edge once (use :class:`~graphwire.partition.stats.PartitionStats` for the
directed in-edge cut).

Balance constraints (``balance=``), each a per-node weight that every part should
get an equal share of:

    ``count``   1 per node                     -> |V_i| balanced
    ``degree``  in-degree in the input graph   -> in-edges (aggregation work)
    ``train`` / ``val`` / ``test``  1 if the node is in that split
                                               -> every worker gets its share
                                                  of training (eval) seeds

The default ``("count", "degree", "train")`` balances memory, per-epoch
aggregation work and mini-batch seeds. A constraint whose total is smaller than
the number of parts is dropped: some part must get none of it, so it cannot be
balanced, and METIS, asked to anyway, leaves parts empty (16 training nodes in
32 parts: 15 empty parts) or, at a total of 0 (no ``val_idx``, a graph without
edges), divides by it. The constraints actually used are recorded in the
partition's params (``constraints``).

What the installed pymetis supports (checked on 2025.2.2): ``part_graph`` passes
``ncon = 1`` to METIS whatever the length of ``vweights``, so it cannot do
multi-constraint balancing; an interleaved ``[N * C]`` array is silently misread.
With more than one constraint we therefore call METIS's C API in pymetis's own
library (see ``_metislib``); with one constraint we use ``pymetis.part_graph``.
If the C API cannot be reached, only the first constraint is used and a
``RuntimeWarning`` says so.

Seeding: METIS is deterministic for the same input, parameters and seed (also
across processes). Our ``seed`` goes to ``METIS_OPTION_SEED`` as
``seed % (2**31 - 1) + 1``: METIS seeds 0 and 1 give identical partitions (it
seeds the C library's ``srand``, where 0 and 1 coincide), and we want seeds 0 and
1 to differ. Part IDs are renumbered by smallest node ID, so the same grouping
always has the same IDs.
"""

from __future__ import annotations

import dataclasses
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from graphwire.graph.graph import Graph
from graphwire.graph.seeds import is_int
from graphwire.partition import _metislib
from graphwire.partition.base import (
    Partition,
    Partitioner,
    canonical_part_ids,
    register,
)

__all__ = ["CONSTRAINTS", "DEFAULT_BALANCE", "MetisPartitioner", "vertex_weights"]

DEFAULT_BALANCE = ("count", "degree", "train")


def _split_mask(split: str) -> Callable[[Graph], np.ndarray]:
    def weight(graph: Graph) -> np.ndarray:
        idx = getattr(graph, f"{split}_idx")
        mask = np.zeros(graph.num_nodes, dtype=np.int64)
        if idx is not None:
            mask[idx.numpy()] = 1
        return mask

    return weight


#: Per-node weight of each balance constraint, int64 [N].
CONSTRAINTS: dict[str, Callable[[Graph], np.ndarray]] = {
    "count": lambda graph: np.ones(graph.num_nodes, dtype=np.int64),
    "degree": lambda graph: graph.in_degrees().numpy().astype(np.int64),
    "train": _split_mask("train"),
    "val": _split_mask("val"),
    "test": _split_mask("test"),
}


def vertex_weights(
    graph: Graph, balance: tuple[str, ...], num_parts: int
) -> tuple[np.ndarray, tuple[str, ...]]:
    """Weights of the constraints in ``balance`` that ``num_parts`` parts can share.

    Those are the constraints whose totals are at least ``num_parts`` (>= 1;
    module docstring).

    Returns:
        ``(weights, used)``: int64 [N, C] (C = len(used)) and the names used.
    """
    columns = {name: CONSTRAINTS[name](graph) for name in balance}
    used = tuple(name for name, c in columns.items() if c.sum() >= num_parts)
    if not used:
        return np.zeros((graph.num_nodes, 0), dtype=np.int64), ()
    return np.stack([columns[name] for name in used], axis=1), used


def _metis_seed(seed: int) -> int:
    # METIS calls srand(seed); srand(0) and srand(1) are the same sequence.
    return seed % (2**31 - 1) + 1


@register("metis")
@dataclass(kw_only=True, slots=True)
class MetisPartitioner(Partitioner):
    """METIS k-way / recursive-bisection partitioning with balance constraints.

    Attributes:
        balance: Constraint names (see the module docstring), in any order;
            a comma-separated string is accepted too.
        ufactor: Allowed imbalance per constraint in thousandths (30 = 3%);
            None keeps METIS's default (30 for k-way, 1 for bisection).
        recursive: Recursive bisection instead of k-way; None picks bisection for
            up to 8 parts, as pymetis does.
    """

    balance: tuple[str, ...] = DEFAULT_BALANCE
    ufactor: int | None = None
    recursive: bool | None = None

    def __post_init__(self) -> None:
        balance: Any = self.balance
        if isinstance(balance, str):
            balance = [b.strip() for b in balance.split(",") if b.strip()]
        balance = tuple(balance)
        unknown = [b for b in balance if b not in CONSTRAINTS]
        if unknown or not balance:
            raise ValueError(
                f"balance: expected one or more of {list(CONSTRAINTS)}, found "
                f"{list(balance)!r}"
            )
        if len(set(balance)) != len(balance):
            raise ValueError(f"balance: names repeat in {list(balance)}")
        self.balance = balance
        if self.ufactor is not None:
            if not is_int(self.ufactor) or self.ufactor < 1:
                raise ValueError(
                    f"ufactor: expected an int >= 1, found {self.ufactor!r}"
                )
            self.ufactor = int(self.ufactor)  # a numpy int is not JSON
        if self.recursive is not None:
            if not isinstance(self.recursive, bool | np.bool_):
                raise ValueError(
                    f"recursive: expected True, False or None, found {self.recursive!r}"
                )
            self.recursive = bool(self.recursive)

    def params(self) -> dict[str, Any]:
        return {
            "balance": list(self.balance),
            "ufactor": self.ufactor,
            "recursive": self.recursive,
        }

    def partition(self, graph: Graph, num_parts: int, *, seed: int = 0) -> Partition:
        result = Partitioner.partition(self, graph, num_parts, seed=seed)
        used = self.constraints(graph, int(num_parts))
        params = {**result.params, "constraints": list(used)}
        return dataclasses.replace(result, params=params)

    def constraints(self, graph: Graph, num_parts: int) -> tuple[str, ...]:
        """The names of the constraints METIS balances for this request."""
        return self._usable(vertex_weights(graph, self.balance, num_parts)[1])

    def _usable(self, used: tuple[str, ...]) -> tuple[str, ...]:
        """The constraints METIS is actually given (at most 1 without the C API)."""
        if len(used) > 1 and not _metislib.available():
            return used[:1]
        return used

    def assign(self, graph: Graph, num_parts: int, seed: int) -> np.ndarray:
        if num_parts == 1:
            # METIS mishandles one part (pymetis short-circuits it too).
            return np.zeros(graph.num_nodes, dtype=np.int64)
        adjacency = graph.symmetric.remove_self_loops()
        dtype = _metislib.idx_dtype()
        xadj = adjacency.indptr.numpy().astype(dtype, copy=False)
        adjncy = adjacency.indices.numpy().astype(dtype, copy=False)
        weights, used = vertex_weights(graph, self.balance, num_parts)
        usable = self._usable(used)
        if len(usable) < len(used):
            warnings.warn(
                f"METIS's C API is not reachable through pymetis here, and "
                f"pymetis.part_graph balances one constraint only: balancing "
                f"{usable[0]!r}, ignoring {list(used[1:])}",
                RuntimeWarning,
                stacklevel=3,
            )
            weights = weights[:, :1]
        recursive = num_parts <= 8 if self.recursive is None else self.recursive
        if weights.shape[1] > 1:
            _, part = _metislib.part_graph(
                num_parts,
                xadj,
                adjncy,
                weights,
                seed=_metis_seed(seed),
                ufactor=self.ufactor,
                recursive=recursive,
            )
        else:
            part = _pymetis_single(
                num_parts, xadj, adjncy, weights, seed, self.ufactor, recursive
            )
        return canonical_part_ids(part, num_parts)


def _pymetis_single(
    num_parts: int,
    xadj: np.ndarray,
    adjncy: np.ndarray,
    weights: np.ndarray,
    seed: int,
    ufactor: int | None,
    recursive: bool,
) -> np.ndarray:
    """One constraint (or none: unit weights) through pymetis's public API."""
    import pymetis

    options = pymetis.Options(seed=_metis_seed(seed))
    if ufactor is not None:
        options.ufactor = ufactor
    vweights = None
    if weights.shape[1] == 1:
        vweights = np.ascontiguousarray(weights[:, 0], dtype=xadj.dtype)
    result = pymetis.part_graph(
        num_parts,
        pymetis.CSRAdjacency(adj_starts=xadj, adjacent=adjncy),
        vweights=vweights,
        options=options,
        recursive=recursive,
    )
    return np.asarray(result.vertex_part, dtype=np.int64)
