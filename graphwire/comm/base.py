"""`Transport`: how ranks move tensors, with every byte counted in a `Ledger`.

Implementations provide three primitives, each recording into ``self.ledger``:

- :meth:`Transport.all_to_all` — variable-size all-to-all of row blocks (one
  ``all_to_all_single`` with split sizes on torch.distributed);
- :meth:`Transport.isend` / :meth:`Transport.irecv` — point-to-point, for
  overlapping exchanges driven from a communication thread;
- :meth:`Transport.all_gather_object` — small picklable metadata (plans, stats).

Collectives built on them live here, so every transport computes them the same
way (a transport may run :meth:`Transport.broadcast` and
:meth:`Transport.reduce_sum` as its backend's own collectives, as
:class:`~graphwire.comm.dist.TorchTransport` does):
:meth:`Transport.all_reduce_sum` is a reduce-scatter then an all-gather, both
as all-to-alls. Each rank sends ``2 (W - 1) / W`` of the tensor, as a ring
all-reduce does, but the bytes per peer are exact in the ledger and the sum is
taken in rank order, so it is bitwise identical on every rank and run.
:meth:`Transport.start_all_reduce_sum` is its non-blocking twin over
``isend``/``irecv`` (same chunks, same sums, same bytes), for reductions that
overlap computation (G3's layer-wise parameter synchronisation).
"""

from __future__ import annotations

import pickle
from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from contextlib import AbstractContextManager, nullcontext
from typing import TYPE_CHECKING, Any, Protocol

import torch

from graphwire.comm.ledger import Ledger

if TYPE_CHECKING:
    from graphwire.comm.service import Service

__all__ = [
    "JoinFailed",
    "PendingSum",
    "Transport",
    "TransportError",
    "Work",
    "encode_object",
    "name_ranks",
    "row_bytes",
]


class TransportError(RuntimeError):
    """A transfer failed: a peer died, timed out, or sent the wrong shape."""


class JoinFailed(TransportError):
    """The ranks did not all join the process group.

    Causes: an address no rank hosts, a port taken, a timeout too short for the
    ranks to start. The message says what and where; a traceback would add
    nothing."""


class Work(Protocol):
    """A pending point-to-point transfer."""

    def wait(self) -> None: ...


class Transport(ABC):
    """Moves tensors between ``world_size`` ranks; this object is rank ``rank``.

    Attributes:
        rank: this worker's rank.
        world_size: number of ranks.
        ledger: what this rank has sent and received.
        phase: where the run is (``"setup"``, ``"epoch 21"``), set by the
            trainer: a rank held up in a call says so (:meth:`waiting`).
        timeout_s: how long one call may wait on a peer (what other
            channels, such as the switch's socket, wait at most too).
    """

    timeout_s = 300.0

    def __init__(self, rank: int, world_size: int) -> None:
        if not 0 <= rank < world_size:
            raise ValueError(f"rank: expected 0 <= rank < {world_size}, got {rank}")
        self.rank = rank
        self.world_size = world_size
        self.ledger = Ledger(rank)
        self.phase = "setup"

    def waiting(
        self, op: str, tag: str, peers: Sequence[int] | None = None
    ) -> AbstractContextManager[None]:
        """Around a call that blocks on ``peers`` (None: every rank): a
        transport whose waits may stall tells which rank holds one up
        (:mod:`graphwire.comm.stall`); here, nothing."""
        return nullcontext()

    @property
    def machine_ranks(self) -> int:
        """The ranks on this machine (here, all of them: one process)."""
        return self.world_size

    @property
    def leads_machine(self) -> bool:
        """Whether this rank writes what one rank per machine writes.

        That is files of the run's folders, which machines may or may not share
        (here, all ranks share one process: rank 0)."""
        return self.rank == 0

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
        """Start receiving into ``tensor`` from ``src``.

        ``tensor``'s size is the message size; messages between a pair arrive
        in the order they were sent."""

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
        """Collective: this rank's end of the request/response service ``name``.

        See :mod:`graphwire.comm.service`; every rank passes the same handler
        names."""
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
        chunks = _chunks(tensor, self.world_size)
        sizes = [chunk.numel() for chunk in chunks]
        mine = sizes[self.rank]
        parts = self.all_to_all(chunks, [mine] * self.world_size, tag)
        reduced = _sum_in_rank_order(parts)
        gathered = self.all_to_all([reduced] * self.world_size, sizes, tag)
        return torch.cat(gathered).view_as(tensor)

    def broadcast(self, tensor: torch.Tensor, root: int, tag: str) -> None:
        """Rank ``root``'s ``tensor`` into every rank's ``tensor``, in place.

        Every rank passes a contiguous tensor of the same shape and dtype. The
        ledger counts the block once from ``root`` to each other rank (what
        each receives; a ring or tree moves as many bytes in all). Here, one
        point-to-point message per receiver.
        """
        self._check_root(root, "broadcast", tag)
        if self.rank == root:
            sends = [
                self.isend(tensor, peer, tag)
                for peer in range(self.world_size)
                if peer != root
            ]
            for work in sends:
                work.wait()
        elif self.world_size > 1:
            self.irecv(tensor, root, tag).wait()

    def reduce_sum(
        self, tensor: torch.Tensor, root: int, tag: str
    ) -> torch.Tensor | None:
        """The sum of every rank's ``tensor`` at rank ``root`` (None elsewhere).

        The broadcast's adjoint: the ledger counts the block once from each
        other rank to ``root``. ``tensor`` is left as it was. Here, one
        point-to-point message per sender, summed at ``root`` in rank order.
        """
        self._check_root(root, "reduce_sum", tag)
        if self.rank != root:
            self.isend(tensor, root, tag).wait()
            return None
        parts = []
        for peer in range(self.world_size):
            if peer == root:
                parts.append(tensor)
                continue
            buf = torch.empty_like(tensor, memory_format=torch.contiguous_format)
            self.irecv(buf, peer, tag).wait()
            parts.append(buf)
        return _sum_in_rank_order(parts)

    def _check_root(self, root: int, op: str, tag: str) -> None:
        if not 0 <= root < self.world_size:
            raise ValueError(
                f"{op} ({tag}): root must be a rank in [0, {self.world_size}), "
                f"got {root}"
            )

    def start_all_reduce_sum(self, tensor: torch.Tensor, tag: str) -> PendingSum:
        """Non-blocking :meth:`all_reduce_sum`: the reduce-scatter starts now.

        Every rank must start the same reductions in the same order. Call
        :meth:`PendingSum.advance` when convenient to start the all-gather,
        and :meth:`PendingSum.wait` for the sum (bitwise equal to
        :meth:`all_reduce_sum`'s, with the same bytes per peer).
        """
        return PendingSum(self, tensor, tag)


class PendingSum:
    """An :meth:`Transport.all_reduce_sum` in flight over ``isend``/``irecv``.

    Phase 1 sends chunk ``p`` to rank ``p``; phase 2 (:meth:`advance`) sums the
    chunks received in rank order and sends the sum to every rank."""

    def __init__(self, transport: Transport, tensor: torch.Tensor, tag: str) -> None:
        self._transport, self._tag, self._shape = transport, tag, tensor.shape
        world, rank = transport.world_size, transport.rank
        self._chunks = _chunks(tensor, world)
        self._result: torch.Tensor | None = tensor.clone() if world == 1 else None
        self._gather: list[tuple[torch.Tensor, Work | None]] | None = None
        self._sends: list[Work] = []
        mine = self._chunks[rank]
        self._scatter = self._exchange(
            [chunk.contiguous() for chunk in self._chunks],
            [mine.numel()] * world,
            mine,
        )

    def _exchange(
        self, send: list[torch.Tensor], sizes: list[int], own: torch.Tensor
    ) -> list[tuple[torch.Tensor, Work | None]]:
        """Post one send and one receive per peer; ``own`` stands for this rank."""
        transport = self._transport
        posted: list[tuple[torch.Tensor, Work | None]] = []
        for peer in range(transport.world_size):
            if peer == transport.rank:
                posted.append((own, None))
                continue
            if send[peer].numel():
                self._sends.append(transport.isend(send[peer], peer, self._tag))
            buf = own.new_empty(sizes[peer])
            work = transport.irecv(buf, peer, self._tag) if sizes[peer] else None
            posted.append((buf, work))
        return posted

    def advance(self) -> None:
        """Finish the reduce-scatter and start the all-gather (once)."""
        if self._result is not None or self._gather is not None:
            return
        reduced = _sum_in_rank_order(_arrived(self._scatter))
        sizes = [chunk.numel() for chunk in self._chunks]
        self._gather = self._exchange([reduced] * len(sizes), sizes, reduced)

    def wait(self) -> torch.Tensor:
        """The sum over ranks, shaped like the tensor given."""
        if self._result is None:
            self.advance()
            assert self._gather is not None
            self._result = torch.cat(_arrived(self._gather)).view(self._shape)
            for work in self._sends:
                work.wait()
        return self._result


def _arrived(posted: list[tuple[torch.Tensor, Work | None]]) -> list[torch.Tensor]:
    for _, work in posted:
        if work is not None:
            work.wait()
    return [buf for buf, _ in posted]


def _chunks(tensor: torch.Tensor, world: int) -> list[torch.Tensor]:
    """``tensor`` flattened and cut into ``world`` nearly equal chunks."""
    flat = tensor.detach().reshape(-1)
    bounds = _chunk_bounds(flat.numel(), world)
    return [flat[bounds[p] : bounds[p + 1]] for p in range(world)]


def _sum_in_rank_order(parts: list[torch.Tensor]) -> torch.Tensor:
    reduced = parts[0].clone()
    for part in parts[1:]:
        reduced += part  # rank order: the same sum on every run
    return reduced


def _chunk_bounds(n: int, parts: int) -> list[int]:
    return [n * p // parts for p in range(parts + 1)]


def name_ranks(ranks: Sequence[int]) -> str:
    """``"rank 2"`` or ``"ranks 0, 1"``, as messages name them."""
    return ("ranks " if len(ranks) > 1 else "rank ") + ", ".join(map(str, ranks))


def encode_object(obj: Any) -> bytes:
    """``obj`` pickled as every transport sends it.

    Its length is what the ledger counts for :meth:`Transport.all_gather_object`."""
    return pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)


def row_bytes(tensor: torch.Tensor) -> int:
    """Bytes of ``tensor``'s payload."""
    return tensor.numel() * tensor.element_size()
