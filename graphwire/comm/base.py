"""`Transport`: how ranks move tensors, with every byte counted in a `Ledger`.

Implementations provide three primitives, each recording into ``self.ledger``:

- :meth:`Transport.all_to_all` — variable-size all-to-all of row blocks (one
  ``all_to_all_single`` with split sizes on torch.distributed);
- :meth:`Transport.isend` / :meth:`Transport.irecv` — point-to-point, for
  overlapping exchanges driven from a communication thread;
- :meth:`Transport.all_gather_object` — small picklable metadata (plans, stats).

Collectives built on them live here, so every transport computes them the same
way: :meth:`Transport.all_reduce_sum` is a reduce-scatter then an all-gather,
both as all-to-alls. Each rank sends ``2 (W - 1) / W`` of the tensor, as a ring
all-reduce does, but the bytes per peer are exact in the ledger and the sum is
taken in rank order, so it is bitwise identical on every rank and run.
"""

from __future__ import annotations

import pickle
from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, Protocol

import torch

from graphwire.comm.ledger import Ledger

if TYPE_CHECKING:
    from graphwire.comm.service import Service

__all__ = ["Transport", "TransportError", "Work", "encode_object", "row_bytes"]


class TransportError(RuntimeError):
    """A transfer failed: a peer died, timed out, or sent the wrong shape."""


class Work(Protocol):
    """A pending point-to-point transfer."""

    def wait(self) -> None: ...


class Transport(ABC):
    """Moves tensors between ``world_size`` ranks; this object is rank ``rank``.

    Attributes:
        rank: this worker's rank.
        world_size: number of ranks.
        ledger: what this rank has sent and received.
    """

    def __init__(self, rank: int, world_size: int) -> None:
        if not 0 <= rank < world_size:
            raise ValueError(f"rank: expected 0 <= rank < {world_size}, got {rank}")
        self.rank = rank
        self.world_size = world_size
        self.ledger = Ledger(rank)

    # ------------------------------------------------------------ primitives
    @abstractmethod
    def all_to_all(
        self, send: Sequence[torch.Tensor], recv_rows: Sequence[int], tag: str
    ) -> list[torch.Tensor]:
        """Send ``send[p]`` to rank ``p``; return what each rank sent here.

        Args:
            send: one tensor per rank, all of one dtype and the same trailing
                shape ``[*, *S]``; ``send[self.rank]`` is returned as is.
            recv_rows: rows to expect from each rank (the plan knows them).
            tag: ledger tag.

        Returns:
            ``recv[p]`` of shape ``[recv_rows[p], *S]`` for every rank ``p``.
        """

    @abstractmethod
    def isend(self, tensor: torch.Tensor, dst: int, tag: str) -> Work:
        """Start sending ``tensor`` (contiguous) to ``dst``."""

    @abstractmethod
    def irecv(self, tensor: torch.Tensor, src: int, tag: str) -> Work:
        """Start receiving into ``tensor`` (its size is the message size) from
        ``src``; messages between a pair arrive in the order they were sent."""

    @abstractmethod
    def all_gather_object(self, obj: Any, tag: str) -> list[Any]:
        """Every rank's ``obj`` (picklable), indexed by rank.

        ``obj`` travels as :func:`encode_object` bytes: the ledger counts
        ``len(encode_object(obj))`` to every other rank, and every rank gets its
        own unpickled copy (``result[self.rank]`` is ``obj`` itself).
        """

    def barrier(self) -> None:
        self.all_gather_object(None, "meta.barrier")

    def open_service(self, name: str, handlers: Mapping[str, Any]) -> Service:
        """Collective: this rank's end of the request/response service ``name``
        (see :mod:`graphwire.comm.service`); every rank passes the same
        handler names."""
        raise NotImplementedError(f"{type(self).__name__} has no services")

    def close(self) -> None:  # noqa: B027 - optional hook
        """Release resources; the transport is unusable afterwards."""

    # ----------------------------------------------------------- collectives
    def all_reduce_sum(self, tensor: torch.Tensor, tag: str) -> torch.Tensor:
        """Sum of ``tensor`` over ranks, identical (bitwise) on every rank.

        Args:
            tensor: any shape; flattened and split into ``world_size`` chunks.
            tag: ledger tag for both phases.

        Returns:
            A new tensor of ``tensor``'s shape.
        """
        if self.world_size == 1:
            return tensor.clone()
        flat = tensor.detach().reshape(-1)
        bounds = _chunk_bounds(flat.numel(), self.world_size)
        sizes = [bounds[p + 1] - bounds[p] for p in range(self.world_size)]
        chunks = [flat[bounds[p] : bounds[p + 1]] for p in range(self.world_size)]
        mine = sizes[self.rank]
        parts = self.all_to_all(chunks, [mine] * self.world_size, tag)
        reduced = parts[0].clone()
        for part in parts[1:]:
            reduced += part  # rank order: the same sum on every run
        gathered = self.all_to_all([reduced] * self.world_size, sizes, tag)
        return torch.cat(gathered).view_as(tensor)


def _chunk_bounds(n: int, parts: int) -> list[int]:
    return [n * p // parts for p in range(parts + 1)]


def encode_object(obj: Any) -> bytes:
    """``obj`` pickled as every transport sends it; its length is what the
    ledger counts for :meth:`Transport.all_gather_object`."""
    return pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)


def row_bytes(tensor: torch.Tensor) -> int:
    """Bytes of ``tensor``'s payload."""
    return tensor.numel() * tensor.element_size()
