"""`SwitchPlan`: the blocks and send orders of one row width (SwitchGNN §3.2–3.3).

The boundary dependency graph is the set of inter-worker edges ``u -> v``
(the owner of ``v`` sums ``u``'s row). A plan cuts it into blocks that fit
the switch's aggregator pool for rows of its width (multi-level
partitioning, :func:`~graphwire.partition.multilevel.multilevel_blocks`), or
keeps it whole (``--switch-blocks none``: the strawman), and orders each
block's vertices for sending: GAMR's priority BFS
(:func:`~graphwire.partition.gamr.gamr_order`) or a seeded random order
(``--switch-order random``: the strawman's). The plan is computed once, on
rank 0, and every worker and the switch get the same one.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from graphwire.comm.switch.core import pool_rows
from graphwire.partition.gamr import gamr_order, random_order
from graphwire.partition.multilevel import multilevel_blocks, single_block

__all__ = ["BLOCKINGS", "ORDERS", "SwitchPlan", "build_plan"]

ORDERS = ("gamr", "random")
BLOCKINGS = ("multilevel", "none")


@dataclass(frozen=True)
class SwitchPlan:
    """Blocks and orders of the inter-worker edges, for rows of one width.

    Attributes:
        width: floats per row.
        capacity: aggregator rows of that width the switch holds (None:
            unlimited).
        src, dst: int64 [E], the edges ``src -> dst`` (global IDs).
        blocks: int64 edge indices of each block, in sending order.
        orders: each block's vertices in send order.
    """

    width: int
    capacity: int | None
    src: np.ndarray
    dst: np.ndarray
    blocks: list[np.ndarray]
    orders: list[np.ndarray]

    def block_sizes(self) -> list[tuple[int, int]]:
        """``(|V_b|, |D_b|)`` of each block: distinct sources and destinations."""
        return [
            (np.unique(self.src[b]).size, np.unique(self.dst[b]).size)
            for b in self.blocks
        ]


def build_plan(
    src: np.ndarray,
    dst: np.ndarray,
    width: int,
    mem_bytes: int,
    *,
    blocking: str = "multilevel",
    order: str = "gamr",
    seed: int = 0,
) -> SwitchPlan:
    """The plan of edges ``src -> dst`` for rows of ``width`` floats.

    Args:
        src, dst: int64 [E], inter-worker edges (global IDs).
        width: floats per row.
        mem_bytes: the switch's aggregator memory (0: unlimited).
        blocking: ``multilevel`` (blocks within the pool) or ``none`` (one
            block: what does not fit overflows).
        order: ``gamr`` or ``random``.
        seed: seeds the random orders and METIS.

    Raises:
        ValueError: an unknown blocking or order, or a pool that holds fewer
            than two rows when blocks must fit it.
    """
    if blocking not in BLOCKINGS:
        raise ValueError(
            f"switch blocks: expected one of {BLOCKINGS}, got {blocking!r}"
        )
    if order not in ORDERS:
        raise ValueError(f"switch order: expected one of {ORDERS}, got {order!r}")
    src = np.ascontiguousarray(src, dtype=np.int64)
    dst = np.ascontiguousarray(dst, dtype=np.int64)
    capacity = pool_rows(mem_bytes, width) if mem_bytes > 0 else None
    if blocking == "none" or capacity is None:
        blocks = single_block(src.size)
    else:
        if capacity < 2 and src.size:
            raise ValueError(
                f"switch memory of {mem_bytes} bytes holds {capacity} row(s) of "
                f"{width} floats; multi-level blocks need at least 2"
            )
        blocks = multilevel_blocks(src, dst, capacity, seed=seed)
    orders = [
        gamr_order(src[b], dst[b])
        if order == "gamr"
        else random_order(src[b], dst[b], seed + k)
        for k, b in enumerate(blocks)
    ]
    return SwitchPlan(width, capacity, src, dst, blocks, orders)
