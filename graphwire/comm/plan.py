"""`ExchangePlan`: which owned rows each peer needs, and where received rows land.

Built once per rank from its :class:`~graphwire.partition.LocalPart`: every rank
tells each owner which of the owner's nodes it holds as halo (one setup
all-to-all of global IDs), and the owner turns them into owned-local row
indices. The plan is then executed every layer and epoch, in both directions:

    forward   send[p] = h_owned[send_idx[p]]   ->  h_halo[recv_idx[p]] = recv[p]
    backward  send[p] = grad_halo[recv_idx[p]] ->  grad_owned[send_idx[p]] += recv[p]

Each rank receives each of its halo rows exactly once per exchange, so the
forward bytes of one exchange are ``num_halo * width * itemsize`` per rank.

The backward comes blocking (:meth:`ExchangePlan.scatter_grad`, one
all-to-all) or non-blocking (:meth:`ExchangePlan.start_scatter_grad`, one
``isend``/``irecv`` per peer, for engines that compute while gradients travel);
both sum the returned rows in rank order.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from graphwire.comm.base import Transport, Work
from graphwire.graph.order import stable_order
from graphwire.partition.local import LocalPart

__all__ = ["ExchangePlan", "PendingGrad"]


@dataclass(frozen=True, eq=False)
class ExchangePlan:
    """Send and receive tables of one rank.

    Attributes:
        rank: this rank (= its part ID).
        num_owned: rows this rank owns.
        num_halo: halo rows this rank receives.
        send_idx: per peer, int64 [s_p] owned-local rows that peer needs, in the
            order the peer expects them (``send_idx[rank]`` is empty).
        recv_idx: per peer, int64 [r_p] halo positions (0-based within the halo)
            the rows from that peer fill, in arrival order.
    """

    rank: int
    num_owned: int
    num_halo: int
    send_idx: tuple[torch.Tensor, ...]
    recv_idx: tuple[torch.Tensor, ...]

    @property
    def world_size(self) -> int:
        return len(self.send_idx)

    @property
    def send_rows(self) -> list[int]:
        return [int(t.numel()) for t in self.send_idx]

    @property
    def recv_rows(self) -> list[int]:
        return [int(t.numel()) for t in self.recv_idx]

    @classmethod
    def build(cls, part: LocalPart, transport: Transport) -> ExchangePlan:
        """Build this rank's plan with one setup all-to-all (tag ``setup.plan``).

        Raises:
            ValueError: the transport's rank or world size does not match the
                part's ID or number of parts.
        """
        if transport.world_size != part.num_parts or transport.rank != part.part_id:
            raise ValueError(
                f"part {part.part_id} of {part.num_parts} cannot run as rank "
                f"{transport.rank} of {transport.world_size}"
            )
        recv_idx, wanted = _requests(part)
        # Each owner first learns how many IDs to expect from each rank.
        sizes = transport.all_gather_object(
            [int(t.numel()) for t in wanted], "setup.plan.size"
        )
        expect = [sizes[p][part.part_id] for p in range(part.num_parts)]
        incoming = transport.all_to_all(wanted, expect, "setup.plan")
        start = part.global_range[0]
        send_idx = tuple(
            torch.empty(0, dtype=torch.int64) if p == part.part_id else ids - start
            for p, ids in enumerate(incoming)
        )
        return cls(part.part_id, part.num_owned, part.num_halo, send_idx, recv_idx)

    @classmethod
    def build_all(cls, parts: list[LocalPart]) -> list[ExchangePlan]:
        """Every rank's plan, computed in one process (tests, simulators)."""
        requests = [_requests(part) for part in parts]
        plans = []
        for part in parts:
            start = part.global_range[0]
            send_idx = tuple(
                torch.empty(0, dtype=torch.int64)
                if p == part.part_id
                else requests[p][1][part.part_id] - start
                for p in range(len(parts))
            )
            plans.append(
                cls(
                    part.part_id,
                    part.num_owned,
                    part.num_halo,
                    send_idx,
                    requests[part.part_id][0],
                )
            )
        return plans

    def restrict(
        self, keep: torch.Tensor, transport: Transport, tag: str
    ) -> ExchangePlan:
        """Collective: the plan of the halo rows where ``keep`` holds.

        Each rank tells every owner, with one byte per halo row it gets from
        that owner (one all-to-all, tag ``tag``), which rows stay; both ends
        keep their tables' order, so the sub-plan's rows still pair up. Halo
        positions keep their meaning (``num_halo`` is unchanged): a restricted
        plan returns gradients (:meth:`scatter_grad`); it is no forward plan,
        since the halo rows it leaves out would never arrive.

        Args:
            keep: bool [num_halo], the halo rows to keep on this rank.
            transport: every rank calls this with its own ``keep``.
            tag: ledger tag of the masks.
        """
        if keep.dtype != torch.bool or keep.shape != (self.num_halo,):
            raise ValueError(
                f"restrict: keep must be bool [num_halo={self.num_halo}], found "
                f"{keep.dtype} {tuple(keep.shape)}"
            )
        masks = [keep[idx].to(torch.uint8) for idx in self.recv_idx]
        incoming = transport.all_to_all(masks, self.send_rows, tag)
        send_idx = tuple(
            idx[mask.to(torch.bool)]
            for idx, mask in zip(self.send_idx, incoming, strict=True)
        )
        recv_idx = tuple(idx[keep[idx]] for idx in self.recv_idx)
        return ExchangePlan(
            self.rank, self.num_owned, self.num_halo, send_idx, recv_idx
        )

    # ------------------------------------------------------------- execution
    def gather_halo(
        self, h_owned: torch.Tensor, transport: Transport, tag: str
    ) -> torch.Tensor:
        """Forward: the halo rows ``[num_halo, *S]`` from their owners."""
        send = [h_owned.index_select(0, idx) for idx in self.send_idx]
        recv = transport.all_to_all(send, self.recv_rows, tag)
        return self.place(recv, h_owned)

    def place(self, recv: list[torch.Tensor], like: torch.Tensor) -> torch.Tensor:
        """Assemble per-peer received rows into halo order."""
        h_halo = like.new_empty((self.num_halo, *like.shape[1:]))
        for p, rows in enumerate(recv):
            if p != self.rank and rows.shape[0]:
                h_halo[self.recv_idx[p]] = rows
        return h_halo

    def scatter_grad(
        self, grad_halo: torch.Tensor, transport: Transport, tag: str
    ) -> torch.Tensor:
        """Backward: the owned-row gradient contributions ``[num_owned, *S]``.

        They come from the halo gradients this and every other rank computed."""
        send = [
            grad_halo.new_empty((0, *grad_halo.shape[1:]))
            if p == self.rank
            else grad_halo.index_select(0, idx)
            for p, idx in enumerate(self.recv_idx)
        ]
        recv = transport.all_to_all(send, self.send_rows, tag)
        return self.accumulate(recv, grad_halo)

    def start_scatter_grad(
        self, grad_halo: torch.Tensor, transport: Transport, tag: str
    ) -> PendingGrad:
        """Non-blocking :meth:`scatter_grad`; :meth:`PendingGrad.wait` completes it.

        Every peer's rows leave now (``isend``), the returned rows are received
        in the background, and :meth:`PendingGrad.wait` adds them to the owned
        rows."""
        sends, recvs = [], []
        for peer in range(self.world_size):
            if peer == self.rank:
                continue
            if self.recv_idx[peer].numel():
                rows = grad_halo.index_select(0, self.recv_idx[peer]).contiguous()
                sends.append(transport.isend(rows, peer, tag))
            if self.send_idx[peer].numel():
                shape = (self.send_idx[peer].numel(), *grad_halo.shape[1:])
                buf = grad_halo.new_empty(shape)
                recvs.append((peer, transport.irecv(buf, peer, tag), buf))
        return PendingGrad(self, grad_halo, sends, recvs)

    def accumulate(
        self,
        recv: list[torch.Tensor],
        like: torch.Tensor,
        out: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Sum per-peer returned rows into owned rows (peers in rank order).

        Into ``out`` [num_owned, *S] when given, else into zeros."""
        grad = like.new_zeros((self.num_owned, *like.shape[1:])) if out is None else out
        for p, rows in enumerate(recv):
            if p != self.rank and rows.shape[0]:
                grad.index_add_(0, self.send_idx[p], rows)
        return grad


@dataclass(eq=False)
class PendingGrad:
    """Halo gradients on their way back to their owners.

    Made by :meth:`ExchangePlan.start_scatter_grad`."""

    plan: ExchangePlan
    like: torch.Tensor
    sends: list[Work]
    recvs: list[tuple[int, Work, torch.Tensor]]

    def wait(self, out: torch.Tensor | None = None) -> torch.Tensor:
        """Wait for every transfer; the returned rows, summed into owned rows.

        Summed with peers in rank order, into ``out`` [num_owned, *S] when
        given, else into zeros."""
        recv = [self.like.new_empty((0, *self.like.shape[1:]))] * self.plan.world_size
        for peer, work, buf in self.recvs:
            work.wait()
            recv[peer] = buf
        for work in self.sends:
            work.wait()
        return self.plan.accumulate(recv, self.like, out)


def _requests(part: LocalPart) -> tuple[tuple[torch.Tensor, ...], list[torch.Tensor]]:
    """Per owner: the halo positions its rows fill, and their global IDs."""
    halo = part.halo_nid
    owner = part.book.owner(halo) if halo.numel() else halo
    order = stable_order(owner)
    counts = torch.bincount(owner, minlength=part.num_parts).tolist()
    positions = torch.split(order, counts)
    return tuple(positions), [halo[pos] for pos in positions]
