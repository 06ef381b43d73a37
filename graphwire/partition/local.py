"""`LocalPart`: what one worker holds of a partitioned graph.

A worker owns the nodes of one contiguous range of new global IDs
``[start, stop)`` and stores their in-edges; the sources of those edges are
either owned or *halo* nodes owned by other parts. Local node IDs number the
owned nodes first and the halo nodes after them:

    0 .. num_owned - 1              owned node ``start + local``
    num_owned .. num_local - 1      halo node ``halo_nid[local - num_owned]``

Shapes (n owned, h halo, e stored in-edges, F features):
    orig_nid  int64 [n]       indptr  int64 [n + 1]      indices  int64 [e] (local)
    halo_nid  int64 [h]       x       float32 [n, F]     y        int64 [n]
    train_local / val_local / test_local   int64 [*]  owned-local indices

Arrays loaded by :func:`~graphwire.partition.format.load_part` are usually
memory-mapped: read-only views of the part's ``.npy`` files.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

import torch

from graphwire.partition.book import PartitionBook

__all__ = ["LocalPart", "trainable_classes"]


@dataclass(frozen=True, eq=False)
class LocalPart:
    """One part of a partitioned graph: owned rows, their in-edges, halo IDs.

    Attributes:
        part_id: Which part this is.
        book: Offsets of every part's global-ID range (no permutations), so the
            owner of any global ID is ``book.owner(global_nid)``.
        meta: The folder's ``meta.json`` without its per-part entries.
    """

    part_id: int
    book: PartitionBook
    orig_nid: torch.Tensor
    indptr: torch.Tensor
    indices: torch.Tensor
    halo_nid: torch.Tensor
    x: torch.Tensor | None = None
    y: torch.Tensor | None = None
    train_local: torch.Tensor | None = None
    val_local: torch.Tensor | None = None
    test_local: torch.Tensor | None = None
    meta: dict[str, Any] = field(default_factory=dict)

    # ------------------------------------------------------------------ sizes
    @property
    def num_parts(self) -> int:
        return self.book.num_parts

    @property
    def offsets(self) -> torch.Tensor:
        """int64 [P + 1]: the global-ID range of every part."""
        return self.book.offsets

    @property
    def global_range(self) -> tuple[int, int]:
        """``(start, stop)``: the new global IDs this part owns."""
        return self.book.part_range(self.part_id)

    @property
    def num_owned(self) -> int:
        return self.orig_nid.numel()

    @property
    def num_halo(self) -> int:
        return self.halo_nid.numel()

    @property
    def num_local(self) -> int:
        """Owned plus halo nodes: the rows of a layer's local input."""
        return self.num_owned + self.num_halo

    @property
    def num_in_edges(self) -> int:
        return self.indices.numel()

    def in_degrees(self) -> torch.Tensor:
        """int64 [n]: in-degree of each owned node (all its in-edges are here)."""
        return self.indptr[1:] - self.indptr[:-1]

    # ------------------------------------------------------------- ID mapping
    @cached_property
    def local_to_global_table(self) -> torch.Tensor:
        """int64 [n + h]: the new global ID of every local ID."""
        start, stop = self.global_range
        owned = torch.arange(start, stop, dtype=torch.int64)
        return torch.cat([owned, self.halo_nid.to(torch.int64)])

    def local_to_global(self, local_nid: torch.Tensor) -> torch.Tensor:
        """int64 [*]: new global IDs of local IDs (owned or halo)."""
        if local_nid.numel() and (
            int(local_nid.min()) < 0 or int(local_nid.max()) >= self.num_local
        ):
            raise ValueError(
                f"local_nid: part {self.part_id} has {self.num_local} local nodes, "
                f"found range [{int(local_nid.min())}, {int(local_nid.max())}]"
            )
        return self.local_to_global_table[local_nid]

    def global_to_local(self, global_nid: torch.Tensor) -> torch.Tensor:
        """int64 [*]: local IDs of new global IDs; -1 where neither owned nor halo."""
        global_nid = global_nid.to(torch.int64)
        start, stop = self.global_range
        owned = (global_nid >= start) & (global_nid < stop)
        local = torch.full_like(global_nid, -1)
        local[owned] = global_nid[owned] - start
        if self.num_halo:
            halo = self.halo_nid.to(torch.int64)
            pos = torch.searchsorted(halo, global_nid).clamp(max=self.num_halo - 1)
            is_halo = ~owned & (halo[pos] == global_nid)
            local[is_halo] = pos[is_halo] + self.num_owned
        return local

    def orig_of_local(self, local_nid: torch.Tensor) -> torch.Tensor:
        """int64 [*]: original graph IDs of owned-local IDs.

        Raises:
            ValueError: an ID lies outside ``[0, num_owned)`` (a negative one
                would wrap around).
        """
        if local_nid.numel() and (
            int(local_nid.min()) < 0 or int(local_nid.max()) >= self.num_owned
        ):
            raise ValueError(
                f"local_nid: part {self.part_id} owns {self.num_owned} nodes, "
                f"found range [{int(local_nid.min())}, {int(local_nid.max())}]"
            )
        return self.orig_nid[local_nid]

    def halo_owner(self) -> torch.Tensor:
        """int64 [h]: the part owning each halo node."""
        return self.book.owner(self.halo_nid)

    def dst_of_edges(self) -> torch.Tensor:
        """int64 [e]: the owned-local destination of every stored in-edge."""
        return torch.repeat_interleave(
            torch.arange(self.num_owned, dtype=torch.int64), self.in_degrees()
        )

    def __repr__(self) -> str:
        start, stop = self.global_range
        return (
            f"LocalPart(part_id={self.part_id}/{self.num_parts}, "
            f"global_range=[{start}, {stop}), num_halo={self.num_halo}, "
            f"num_in_edges={self.num_in_edges})"
        )


def trainable_classes(part: LocalPart) -> int:
    """``part``'s number of classes, once checked to have what training needs.

    That is features, labels, splits and labelled classes.

    Raises:
        ValueError: naming the part and what it lacks.
    """
    if part.x is None or part.y is None or part.train_local is None:
        raise ValueError(
            f"part {part.part_id}: training needs features, labels and splits"
        )
    num_classes = int(part.meta.get("num_classes") or 0)
    if num_classes < 1:
        raise ValueError(
            f"part {part.part_id}: meta.json says num_classes is "
            f"{num_classes}; training needs labelled classes"
        )
    return num_classes
