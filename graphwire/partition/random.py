"""Random partitioning: a seeded permutation cut into near-equal parts.

The baseline every locality-aware method is compared against. Part sizes differ by
at most one node; which nodes land together is uniformly random, so about
``(P - 1) / P`` of all edges are cut. Deterministic for a seed.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from graphwire.graph.graph import Graph
from graphwire.partition.base import Partitioner, register

__all__ = ["RandomPartitioner", "balanced_blocks"]


def balanced_blocks(num_nodes: int, num_parts: int) -> np.ndarray:
    """int64 [N]: position ``i`` goes to part ``i * P // N`` (sizes differ by <= 1)."""
    return np.arange(num_nodes, dtype=np.int64) * num_parts // max(num_nodes, 1)


@register("random")
@dataclass(kw_only=True, slots=True)
class RandomPartitioner(Partitioner):
    """Uniformly random, balanced assignment (takes no parameters)."""

    def assign(self, graph: Graph, num_parts: int, seed: int) -> np.ndarray:
        rng = np.random.default_rng(seed)
        order = rng.permutation(graph.num_nodes)
        assignment = np.empty(graph.num_nodes, dtype=np.int64)
        assignment[order] = balanced_blocks(graph.num_nodes, num_parts)
        return assignment
