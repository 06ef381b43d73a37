"""The partitioning interface: a `Partition` and the `Partitioner`s that make one.

A :class:`Partition` says which part owns each node of a graph (original node
IDs); a :class:`Partitioner` computes one for a graph, a part count and a seed.
Every strategy lives in its own file (``random.py``, ``chunk.py``, ``metis.py``)
and registers itself by name in :data:`PARTITIONERS`, so callers build one with
``get_partitioner("metis", balance=("count", "train"))``.

Shapes (N nodes, P parts):
    assignment   int64 [N]   part ID of every node, in ``[0, P)``
"""

from __future__ import annotations

import json
import math
from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, ClassVar, TypeVar

import numpy as np
import torch

from graphwire.graph.graph import Graph
from graphwire.graph.seeds import check_seed, is_int

__all__ = [
    "PARTITIONERS",
    "Partition",
    "Partitioner",
    "canonical_part_ids",
    "check_num_parts",
    "check_method",
    "get_partitioner",
    "register",
    "unique_sorted",
]


@dataclass(frozen=True, eq=False)
class Partition:
    """Which part owns each node, and how that was decided.

    Attributes:
        assignment: int64 [N], the part ID of each node (original node IDs).
        num_parts: P; parts may be empty, but IDs must lie in ``[0, P)``.
        method: Name of the partitioner that made it (``"metis"``, ...).
        params: The partitioner's parameters and seed; must be JSON-serialisable
            with finite numbers only (they are recorded in the partitioned
            format's ``meta.json``).
    """

    assignment: torch.Tensor
    num_parts: int
    method: str = "custom"
    params: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        assignment = self.assignment
        if not isinstance(assignment, torch.Tensor):
            assignment = torch.from_numpy(np.array(assignment))
        if assignment.dim() != 1:
            raise ValueError(
                f"assignment: expected a 1-D array [num_nodes], found shape "
                f"{tuple(assignment.shape)}"
            )
        if assignment.numel() and (
            assignment.dtype.is_floating_point
            or assignment.dtype.is_complex
            or assignment.dtype == torch.bool
        ):
            raise ValueError(
                f"assignment: expected integer part IDs, found {assignment.dtype}"
            )
        assignment = assignment.to(torch.int64)
        if not is_int(self.num_parts):
            raise ValueError(f"num_parts: expected an int, found {self.num_parts!r}")
        object.__setattr__(self, "num_parts", int(self.num_parts))
        if self.num_parts < 1:
            raise ValueError(f"num_parts: must be >= 1, found {self.num_parts}")
        if assignment.numel():
            low, high = int(assignment.min()), int(assignment.max())
            if low < 0 or high >= self.num_parts:
                raise ValueError(
                    f"assignment: part IDs must lie in [0, num_parts="
                    f"{self.num_parts}), found range [{low}, {high}]"
                )
        try:
            json.dumps(self.params)
        except (TypeError, ValueError) as error:
            raise ValueError(
                f"params: must be JSON-serialisable (they go into meta.json), "
                f"found {self.params!r} ({error})"
            ) from error
        where = _non_finite(self.params, "params")
        if where is not None:
            raise ValueError(
                f"{where[0]}: must be a finite number (params go into meta.json, "
                f"and JSON has no NaN or Infinity), found {where[1]!r}"
            )
        object.__setattr__(self, "assignment", assignment)

    @property
    def num_nodes(self) -> int:
        return self.assignment.numel()

    def part_sizes(self) -> torch.Tensor:
        """int64 [P]: number of nodes owned by each part."""
        return torch.bincount(self.assignment, minlength=self.num_parts)

    def nodes_of(self, part_id: int) -> torch.Tensor:
        """int64 [*]: original IDs of the nodes ``part_id`` owns, ascending."""
        return (self.assignment == part_id).nonzero().view(-1)

    def check_graph(self, graph: Graph) -> None:
        """Raise ``ValueError`` unless this partition has one entry per node."""
        if self.num_nodes != graph.num_nodes:
            raise ValueError(
                f"assignment: has {self.num_nodes} entries but graph "
                f"{graph.name!r} has {graph.num_nodes} nodes"
            )

    def __repr__(self) -> str:
        return (
            f"Partition(method={self.method!r}, num_parts={self.num_parts}, "
            f"num_nodes={self.num_nodes}, params={self.params!r})"
        )


def _non_finite(value: Any, where: str) -> tuple[str, float] | None:
    """The first NaN or infinity in JSON-ready ``value`` (its path, such as
    ``params.limits[1]``, and the number), or None."""
    if isinstance(value, float) and not math.isfinite(value):
        return where, value
    items: Any = ()
    if isinstance(value, dict):
        items = ((f"{where}.{key}", item) for key, item in value.items())
    elif isinstance(value, list | tuple):
        items = ((f"{where}[{i}]", item) for i, item in enumerate(value))
    for path, item in items:
        found = _non_finite(item, path)
        if found is not None:
            return found
    return None


def check_num_parts(graph: Graph, num_parts: int) -> None:
    """Raise ``ValueError`` unless ``1 <= num_parts <= graph.num_nodes``."""
    if not is_int(num_parts):
        raise ValueError(f"num_parts: expected an int, found {num_parts!r}")
    if num_parts < 1:
        raise ValueError(f"num_parts: must be >= 1, found {num_parts}")
    if num_parts > graph.num_nodes:
        raise ValueError(
            f"num_parts: must be <= the number of nodes ({graph.num_nodes}) of "
            f"graph {graph.name!r}, found {num_parts}"
        )


def unique_sorted(values: np.ndarray) -> np.ndarray:
    """The distinct values, ascending (like ``np.unique``, by one sort).

    numpy 2's ``np.unique`` takes a hash-table path for integers that is slower
    than sorting on the millions of edge keys partitioning handles.
    """
    ordered = np.sort(values)
    if ordered.size == 0:
        return ordered
    keep = np.empty(ordered.size, dtype=bool)
    keep[0] = True
    np.not_equal(ordered[1:], ordered[:-1], out=keep[1:])
    return ordered[keep]


def canonical_part_ids(assignment: np.ndarray, num_parts: int) -> np.ndarray:
    """Renumber parts in order of their smallest node ID (empty parts last).

    Partitioners whose part IDs are arbitrary labels (METIS) use this so that the
    same grouping always gets the same IDs: the part holding node 0 becomes part
    0, and so on.

    Args:
        assignment: int64 [N] part IDs in ``[0, num_parts)``.
        num_parts: P.

    Returns:
        int64 [N], the same grouping with canonical IDs.
    """
    first = np.full(num_parts, assignment.shape[0], dtype=np.int64)
    np.minimum.at(first, assignment, np.arange(assignment.shape[0], dtype=np.int64))
    order = np.argsort(first, kind="stable")
    new_id = np.empty(num_parts, dtype=np.int64)
    new_id[order] = np.arange(num_parts, dtype=np.int64)
    return new_id[assignment]


class Partitioner(ABC):
    """Computes a :class:`Partition` of a graph.

    Subclasses are small ``@dataclass(kw_only=True)`` configs (their fields are
    the method's parameters, validated in ``__post_init__``) that implement
    :meth:`assign`. :meth:`partition` validates the request and wraps the result.
    """

    name: ClassVar[str] = ""

    def partition(self, graph: Graph, num_parts: int, *, seed: int = 0) -> Partition:
        """Split ``graph``'s nodes into ``num_parts`` parts.

        Args:
            graph: The graph (its node data may guide the split).
            num_parts: P, with ``1 <= P <= graph.num_nodes``.
            seed: Same seed, same graph, same parameters: same partition.

        Returns:
            A :class:`Partition` whose params are this partitioner's plus the seed.

        Raises:
            ValueError: ``num_parts`` is out of range, or ``seed`` is not an int
                in ``[0, 2**63)``.
        """
        check_num_parts(graph, num_parts)
        num_parts, seed = int(num_parts), check_seed(seed)
        assignment = self.assign(graph, num_parts, seed)
        return Partition(
            assignment=torch.from_numpy(np.ascontiguousarray(assignment, np.int64)),
            num_parts=num_parts,
            method=self.name,
            params={**self.params(), "seed": seed},
        )

    @abstractmethod
    def assign(self, graph: Graph, num_parts: int, seed: int) -> np.ndarray:
        """Return int64 [N] part IDs in ``[0, num_parts)`` (inputs are valid)."""

    def params(self) -> dict[str, Any]:
        """JSON-serialisable parameters, recorded with the partition."""
        return {}


PartitionerType = TypeVar("PartitionerType", bound=type[Partitioner])

#: Partitioner classes by name; each strategy file adds itself with `register`.
PARTITIONERS: dict[str, type[Partitioner]] = {}


def register(name: str) -> Callable[[PartitionerType], PartitionerType]:
    """Class decorator: add a :class:`Partitioner` to :data:`PARTITIONERS`."""

    def add(cls: PartitionerType) -> PartitionerType:
        if name in PARTITIONERS:
            raise ValueError(f"partitioner {name!r} is already registered")
        cls.name = name
        PARTITIONERS[name] = cls
        return cls

    return add


def get_partitioner(name: str, **params: Any) -> Partitioner:
    """Build the partitioner registered as ``name`` with ``params``.

    Raises:
        ValueError: Unknown name (the message lists the known ones), or a
            parameter the method does not take or rejects.
    """
    cls = PARTITIONERS.get(name)
    if cls is None:
        known = ", ".join(sorted(PARTITIONERS))
        raise ValueError(f"unknown partition method {name!r}; known: {known}")
    try:
        return cls(**params)
    except TypeError as error:
        raise ValueError(f"partition method {name!r}: {error}") from error


def check_method(name: str | None, flag: str = "--partition") -> None:
    """Refuse a partition method ``name`` that no partitioner is registered as.

    ``name`` comes from ``flag`` (None: not given, accepted); checked before any
    data is read.

    Raises:
        ValueError: naming the flag and the known methods.
    """
    if name is not None and name not in PARTITIONERS:
        known = ", ".join(sorted(PARTITIONERS))
        raise ValueError(f"{flag} {name}: unknown; expected one of {known}")
