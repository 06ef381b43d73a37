"""Chunk partitioning: contiguous node-ID ranges of near-equal size.

Node ``i`` goes to part ``i * P // N``, so each part owns one contiguous ID range
and sizes differ by at most one. Cheap, and good when node IDs already follow
locality (graphs stored in a BFS or community order); the seed is ignored.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from graphwire.graph.graph import Graph
from graphwire.partition.base import Partitioner, register
from graphwire.partition.random import balanced_blocks

__all__ = ["ChunkPartitioner"]


@register("chunk")
@dataclass(kw_only=True, slots=True)
class ChunkPartitioner(Partitioner):
    """Contiguous ID ranges (takes no parameters; the seed has no effect)."""

    def assign(self, graph: Graph, num_parts: int, seed: int) -> np.ndarray:
        return balanced_blocks(graph.num_nodes, num_parts)
