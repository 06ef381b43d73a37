"""`PartitionStats`: what a partition costs each worker, and how even it is.

Per part ``i`` (owned nodes ``V_i``; edges are the graph's directed in-edges):

    num_nodes     |V_i|
    degree_sum    sum of in-degrees of V_i (aggregation work per layer); equal to
                  num_in_edges by definition, kept as the ARCHITECTURE names it
    num_in_edges  |E(V_i)|: in-edges whose destination is in V_i (stored by part i)
    num_halo      |V_i^remote|: distinct sources of those edges owned elsewhere
                  (the rows part i receives per layer in a halo exchange)
    num_train / num_val / num_test   split nodes in V_i

Totals: ``edge_cut``, the number of directed in-edges whose endpoints lie in
different parts, and ``imbalance[q] = max_i q_i / mean_i q_i`` for each quantity
``q`` above (1.0 is perfect; a quantity that is 0 everywhere counts as 1.0).

Computed with bincounts and one ``unique`` over the cut edges; no loop over nodes
or edges.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from graphwire.graph.graph import Graph
from graphwire.partition.base import Partition, unique_sorted

__all__ = ["PER_PART", "PartitionStats"]

#: The per-part quantities, in table order.
PER_PART = (
    "num_nodes",
    "degree_sum",
    "num_in_edges",
    "num_halo",
    "num_train",
    "num_val",
    "num_test",
)


@dataclass(frozen=True)
class PartitionStats:
    """Per-part sizes and totals of a partition (plain ints, JSON-ready)."""

    num_parts: int
    num_edges: int
    edge_cut: int
    num_nodes: tuple[int, ...]
    degree_sum: tuple[int, ...]
    num_in_edges: tuple[int, ...]
    num_halo: tuple[int, ...]
    num_train: tuple[int, ...]
    num_val: tuple[int, ...]
    num_test: tuple[int, ...]
    imbalance: dict[str, float] = field(default_factory=dict)

    @classmethod
    def compute(cls, graph: Graph, partition: Partition) -> PartitionStats:
        """Count everything for ``partition`` of ``graph``.

        Raises:
            ValueError: the partition does not have one entry per graph node.
        """
        partition.check_graph(graph)
        num_parts, num_nodes = partition.num_parts, graph.num_nodes
        part = partition.assignment.numpy()
        src, dst = (t.numpy() for t in graph.edge_index())
        src_part, dst_part = part[src], part[dst]

        def per_part(ids: np.ndarray) -> tuple[int, ...]:
            return tuple(int(c) for c in np.bincount(ids, minlength=num_parts))

        cut = src_part != dst_part
        # A halo node of part p is a distinct (p, src) pair over cut edges into p.
        halo_pairs = unique_sorted(dst_part[cut] * np.int64(num_nodes) + src[cut])
        in_degree = graph.in_degrees().numpy()
        split_counts = {}
        for split in ("train", "val", "test"):
            idx = getattr(graph, f"{split}_idx")
            ids = part[idx.numpy()] if idx is not None else np.empty(0, np.int64)
            split_counts[f"num_{split}"] = per_part(ids)
        counts: dict[str, tuple[int, ...]] = {
            "num_nodes": per_part(part),
            "degree_sum": tuple(
                int(c)
                for c in np.bincount(part, weights=in_degree, minlength=num_parts)
            ),
            "num_in_edges": per_part(dst_part),
            "num_halo": per_part(halo_pairs // num_nodes),
            **split_counts,
        }
        return cls(
            num_parts=num_parts,
            num_edges=graph.num_edges,
            edge_cut=int(cut.sum()),
            imbalance={name: _imbalance(counts[name]) for name in PER_PART},
            **counts,
        )

    # ------------------------------------------------------------------ views
    @property
    def cut_fraction(self) -> float:
        """edge_cut / num_edges (0.0 for a graph without edges)."""
        return self.edge_cut / self.num_edges if self.num_edges else 0.0

    def per_part(self, name: str) -> tuple[int, ...]:
        """The per-part values of one quantity in :data:`PER_PART`."""
        if name not in PER_PART:
            raise ValueError(f"unknown quantity {name!r}; known: {list(PER_PART)}")
        values: tuple[int, ...] = getattr(self, name)
        return values

    def table_rows(self) -> list[tuple[Any, ...]]:
        """Rows ``(part, *PER_PART)`` per part, then ``("max/mean", ratios...)``.

        The header is ``("part", *PER_PART)``.
        """
        rows: list[tuple[Any, ...]] = [
            (i, *(self.per_part(name)[i] for name in PER_PART))
            for i in range(self.num_parts)
        ]
        rows.append(("max/mean", *(f"{self.imbalance[n]:.3f}" for n in PER_PART)))
        return rows

    def as_dict(self) -> dict[str, Any]:
        """Everything, JSON-serialisable (stored in the partitioned meta.json)."""
        return {
            "num_parts": self.num_parts,
            "num_edges": self.num_edges,
            "edge_cut": self.edge_cut,
            "cut_fraction": self.cut_fraction,
            "per_part": {name: list(self.per_part(name)) for name in PER_PART},
            "imbalance": dict(self.imbalance),
        }

    def summary(self) -> dict[str, Any]:
        """Flat headline numbers for logs: cut, halo sizes, imbalance ratios."""
        flat: dict[str, Any] = {
            "num_parts": self.num_parts,
            "edge_cut": self.edge_cut,
            "cut_fraction": round(self.cut_fraction, 6),
            "halo_max": max(self.num_halo),
            "halo_total": sum(self.num_halo),
        }
        for name in PER_PART:
            flat[f"imbalance_{name.removeprefix('num_')}"] = round(
                self.imbalance[name], 6
            )
        return flat


def _imbalance(values: tuple[int, ...]) -> float:
    mean = sum(values) / len(values)
    return max(values) / mean if mean > 0 else 1.0
