"""Sampler interface: `Batch`, `Block`, `SampledBatch`, and seed derivation.

A mini-batch of ``L`` layers is ``L`` blocks, input layer first (as DGL):

    blocks[0]      src = input nodes (features are gathered for these)
    ...
    blocks[L - 1]  dst = the seed nodes (the loss is computed on these)

Block ``l``'s destinations are exactly block ``l + 1``'s sources
(``blocks[l].dst_nid == blocks[l + 1].src_nid``), and every block lists its
destinations first among its sources, so a layer's self term is
``h_src[:num_dst]``.

ID spaces: ``src_nid``/``dst_nid`` are global node IDs of the sampled graph;
``indices`` are local source rows; ``eid`` are positions in the graph's CSR.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from graphwire.graph.seeds import derive_seed
from graphwire.nn.base import MessageGraph

__all__ = ["Batch", "Block", "SampledBatch", "derive_seed"]


@dataclass(frozen=True)
class Batch:
    """One step of one trainer.

    Attributes:
        epoch: epoch number.
        index: step within the epoch.
        seeds: int64 [b], global IDs of the batch's output nodes.
        seed: the sampling seed ``H(s0, worker, epoch, index)``.
        dropout_seed: hashed-dropout seed ``H(s0, epoch, index)``: the same on
            every trainer, so a node's mask does not depend on who trains it.
    """

    epoch: int
    index: int
    seeds: torch.Tensor
    seed: int
    dropout_seed: int


@dataclass(frozen=True, eq=False, kw_only=True)
class Block(MessageGraph):
    """A :class:`MessageGraph` between sampled nodes, with their global IDs.

    Attributes:
        src_nid: int64 [num_src], global ID of each source row; the first
            ``num_dst`` equal ``dst_nid``.
        dst_nid: int64 [num_dst], global ID of each destination row.
        eid: int64 [E], position of each sampled edge in the graph's CSR.
    """

    src_nid: torch.Tensor
    dst_nid: torch.Tensor
    eid: torch.Tensor

    def __post_init__(self) -> None:
        MessageGraph.__post_init__(self)
        if self.src_nid.shape != (self.num_src,):
            raise ValueError(
                f"Block.src_nid: expected shape [{self.num_src}], "
                f"found {tuple(self.src_nid.shape)}"
            )
        if self.dst_nid.shape != (self.num_dst,):
            raise ValueError(
                f"Block.dst_nid: expected shape [{self.num_dst}], "
                f"found {tuple(self.dst_nid.shape)}"
            )
        if self.eid.shape != (self.num_edges,):
            raise ValueError(
                f"Block.eid: expected shape [{self.num_edges}], "
                f"found {tuple(self.eid.shape)}"
            )


@dataclass(frozen=True, eq=False)
class SampledBatch:
    """The blocks of one mini-batch.

    Attributes:
        seeds: int64 [B], global IDs of the output nodes (``blocks[-1].dst_nid``).
        blocks: one :class:`Block` per layer, input layer first.
    """

    seeds: torch.Tensor
    blocks: list[Block]

    @property
    def input_nid(self) -> torch.Tensor:
        """int64 [num_input]: global IDs whose features the first layer reads."""
        return self.blocks[0].src_nid

    @property
    def num_sampled_edges(self) -> int:
        return sum(block.num_edges for block in self.blocks)
