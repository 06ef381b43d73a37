"""The `PartitionBook`: which part owns a node, and the relabelling behind it.

Partitioned graphs renumber their nodes so that every part owns one contiguous
range of *new* global IDs: part ``p`` owns ``offsets[p] .. offsets[p + 1] - 1``.
Within a part, nodes keep the order of their original IDs (a stable sort), or
the order of a given permutation (:func:`~graphwire.graph.order.locality_order`
for ``node_order="rcm"``), so the relabelling is a pure function of the
assignment and that order. Then ``owner(global_nid)`` is a
``searchsorted`` over ``P + 1`` offsets and ``to_local`` a subtraction: no table
of N entries is needed on a worker.

Shapes (N nodes, P parts):
    offsets        int64 [P + 1]  offsets[0] = 0, offsets[P] = N
    new_from_orig  int64 [N]      new global ID of original node i
    orig_from_new  int64 [N]      original ID of new global ID g (the inverse)

"Global" IDs in graphwire's distributed code are always the new ones; the
original IDs only matter for reading the input graph and writing results back.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from graphwire.graph.checks import check_permutation
from graphwire.graph.order import stable_order
from graphwire.partition.base import Partition

__all__ = ["PartitionBook"]


@dataclass(frozen=True, eq=False)
class PartitionBook:
    """Contiguous global-ID ranges per part, and optionally the relabelling.

    A worker that loaded one part has only ``offsets`` (the permutations are
    ``None``); :meth:`from_partition` builds the full book for a whole graph.
    """

    offsets: torch.Tensor
    new_from_orig: torch.Tensor | None = None
    orig_from_new: torch.Tensor | None = None

    def __post_init__(self) -> None:
        offsets = torch.as_tensor(self.offsets, dtype=torch.int64)
        if offsets.dim() != 1 or offsets.numel() < 2:
            raise ValueError(
                f"offsets: expected int64 [num_parts + 1] with num_parts >= 1, "
                f"found shape {tuple(offsets.shape)}"
            )
        if int(offsets[0]) != 0 or bool((offsets[1:] < offsets[:-1]).any()):
            raise ValueError(
                f"offsets: must start at 0 and be non-decreasing, found "
                f"{offsets.tolist()[:8]}..."
            )
        object.__setattr__(self, "offsets", offsets)
        for name in ("new_from_orig", "orig_from_new"):
            perm = getattr(self, name)
            if perm is not None and perm.shape != (self.num_nodes,):
                raise ValueError(
                    f"{name}: expected shape [{self.num_nodes}], found "
                    f"{tuple(perm.shape)}"
                )

    @classmethod
    def from_partition(
        cls, partition: Partition, order: torch.Tensor | None = None
    ) -> PartitionBook:
        """The full book of ``partition``: new IDs part by part, then by ``order``.

        Within a part, nodes keep the order they have in ``order`` (a
        permutation of the original IDs; default: the original IDs ascending)."""
        assignment = partition.assignment
        # One stable sort groups nodes by part, keeping their order within one.
        if order is None:
            orig_from_new = stable_order(assignment)
        else:
            check_permutation(order, "order", assignment.numel())
            orig_from_new = order[stable_order(assignment[order])]
        new_from_orig = torch.empty_like(orig_from_new)
        new_from_orig[orig_from_new] = torch.arange(
            assignment.numel(), dtype=torch.int64
        )
        offsets = torch.zeros(partition.num_parts + 1, dtype=torch.int64)
        torch.cumsum(partition.part_sizes(), 0, out=offsets[1:])
        return cls(offsets, new_from_orig, orig_from_new)

    # ------------------------------------------------------------------ sizes
    @property
    def num_parts(self) -> int:
        return self.offsets.numel() - 1

    @property
    def num_nodes(self) -> int:
        return int(self.offsets[-1])

    def part_sizes(self) -> torch.Tensor:
        """int64 [P]: number of nodes each part owns."""
        return self.offsets[1:] - self.offsets[:-1]

    def part_range(self, part_id: int) -> tuple[int, int]:
        """``(start, stop)``: the new global IDs part ``part_id`` owns."""
        self._check_part(part_id)
        return int(self.offsets[part_id]), int(self.offsets[part_id + 1])

    # ------------------------------------------------------------- ID mapping
    def owner(self, global_nid: torch.Tensor) -> torch.Tensor:
        """int64 [*]: the part owning each new global ID (same shape as input).

        Raises:
            ValueError: an ID lies outside ``[0, num_nodes)``.
        """
        self._check_global(global_nid)
        # right=True: an ID equal to offsets[p] belongs to part p, and empty parts
        # (equal neighbouring offsets) are skipped over.
        return torch.searchsorted(self.offsets, global_nid, right=True) - 1

    def to_local(self, global_nid: torch.Tensor) -> torch.Tensor:
        """int64 [*]: each ID's index within its owner's range."""
        return global_nid - self.offsets[self.owner(global_nid)]

    def to_global(self, part_id: int, local_nid: torch.Tensor) -> torch.Tensor:
        """int64 [*]: new global IDs of owned-local indices of part ``part_id``."""
        start, stop = self.part_range(part_id)
        if local_nid.numel() and (
            int(local_nid.min()) < 0 or int(local_nid.max()) >= stop - start
        ):
            raise ValueError(
                f"local_nid: part {part_id} owns {stop - start} nodes, found "
                f"range [{int(local_nid.min())}, {int(local_nid.max())}]"
            )
        return local_nid + start

    def new_of(self, orig_nid: torch.Tensor) -> torch.Tensor:
        """int64 [*]: new global IDs of original node IDs.

        Raises:
            ValueError: an ID lies outside ``[0, num_nodes)`` (a negative one
                would wrap around), or the book has no relabelling.
        """
        perm = self._perm("new_from_orig")
        _check_ids("orig_nid", orig_nid, self.num_nodes)
        return perm[orig_nid]

    def orig_of(self, global_nid: torch.Tensor) -> torch.Tensor:
        """int64 [*]: original IDs of new global IDs.

        Raises:
            ValueError: an ID lies outside ``[0, num_nodes)`` (a negative one
                would wrap around), or the book has no relabelling.
        """
        perm = self._perm("orig_from_new")
        self._check_global(global_nid)
        return perm[global_nid]

    # ---------------------------------------------------------------- helpers
    def _perm(self, name: str) -> torch.Tensor:
        perm = getattr(self, name)
        if perm is None:
            raise ValueError(
                f"{name}: this book has only offsets (a worker's view); build it "
                "with PartitionBook.from_partition for the relabelling"
            )
        return perm

    def _check_part(self, part_id: int) -> None:
        if not 0 <= part_id < self.num_parts:
            raise ValueError(
                f"part_id: must lie in [0, {self.num_parts}), found {part_id}"
            )

    def _check_global(self, global_nid: torch.Tensor) -> None:
        _check_ids("global_nid", global_nid, self.num_nodes)


def _check_ids(name: str, ids: torch.Tensor, high: int) -> None:
    """Raise ``ValueError`` unless every ID lies in ``[0, high)`` (one min and
    one max over ``ids``)."""
    if ids.numel() and (int(ids.min()) < 0 or int(ids.max()) >= high):
        raise ValueError(
            f"{name}: must lie in [0, {high}), found range "
            f"[{int(ids.min())}, {int(ids.max())}]"
        )
