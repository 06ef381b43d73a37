"""Rooted collectives of a :class:`~graphwire.comm.dist.TorchTransport`.

``broadcast`` runs ``torch.distributed.broadcast`` and ``reduce_sum``
``torch.distributed.reduce`` (SUM) on the run's group, bounded by its timeout;
a failure is raised as the transport's other collectives raise it. The ledger
counts the block once per other rank: from the root (broadcast), or to it
(reduce), whatever ring or tree the backend runs.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
import torch.distributed as dist

from graphwire.comm.base import row_bytes

if TYPE_CHECKING:
    from graphwire.comm.dist import TorchTransport

__all__ = ["broadcast", "reduce_sum"]


def broadcast(
    transport: TorchTransport, tensor: torch.Tensor, root: int, tag: str
) -> None:
    """Rank ``root``'s ``tensor`` into every rank's ``tensor``, in place."""
    if transport.world_size == 1:
        return
    home = transport.device
    staged = tensor if tensor.device == home else tensor.to(home)
    with transport.waiting("broadcast", tag):
        try:
            dist.broadcast(staged, src=root)
        except RuntimeError as error:
            transport._collective_failed(f"broadcast from rank {root}", tag, error)
    if staged is not tensor:
        tensor.copy_(staged)
    _record(transport, root, tag, row_bytes(tensor), to_root=False)


def reduce_sum(
    transport: TorchTransport, tensor: torch.Tensor, root: int, tag: str
) -> torch.Tensor | None:
    """The sum of every rank's ``tensor`` at ``root``; None elsewhere."""
    if transport.world_size == 1:
        return tensor.clone()
    # A copy: the backend may use a non-root's buffer as scratch.
    staged = tensor.detach().to(transport.device, copy=True).contiguous()
    with transport.waiting("reduce", tag):
        try:
            dist.reduce(staged, dst=root, op=dist.ReduceOp.SUM)
        except RuntimeError as error:
            transport._collective_failed(f"reduce to rank {root}", tag, error)
    _record(transport, root, tag, row_bytes(tensor), to_root=True)
    return staged.to(tensor.device) if transport.rank == root else None


def _record(
    transport: TorchTransport, root: int, tag: str, size: int, *, to_root: bool
) -> None:
    """The block once between ``root`` and each other rank, in the
    direction the collective moves it."""
    ledger, rank = transport.ledger, transport.rank
    for peer in range(transport.world_size):
        if peer == rank or root not in (rank, peer):
            continue
        sends = (rank != root) if to_root else (rank == root)
        if sends:
            ledger.record_send(peer, tag, size)
        else:
            ledger.record_recv(peer, tag, size)
