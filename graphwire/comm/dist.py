"""`TorchTransport`: the :class:`Transport` over ``torch.distributed``.

One transport owns the default process group of its process: :meth:`open`
creates it from a :class:`WorkerContext`, :meth:`close` destroys it.

What each primitive runs (``W`` ranks, this rank ``r``):

- ``all_to_all``: ONE ``all_to_all_single``. Rank ``r``'s non-empty blocks are
  concatenated and viewed as bytes (:mod:`~graphwire.comm.wire`),
  ``uint8 [sum_p rows_p, row_bytes]``, with
  one split size per rank (``0`` for ``r`` itself: its own block is returned as
  is, never copied). Any dtype works, on gloo as on NCCL. With
  ``check_splits`` (default) an ``all_gather`` of every rank's row counts
  (``int64 [2, W]``) runs first, so a plan bug raises on every rank.
- ``isend`` / ``irecv``: ``dist.isend`` / ``dist.irecv`` with one torch tag, so
  messages between a pair are matched in the order they were sent. Under NCCL
  they go over a gloo group of the same ranks (:func:`p2p_backend`), on the
  CPU: NCCL runs a pair's sends and receives in the order they were posted,
  on one stream, so two ranks that each post a receive before their send (as
  G3 posts a layer's receives before its bins compute) would wait on each
  other for good; gloo posts a receive without holding up the sends.
- ``broadcast`` / ``reduce_sum``: ``dist.broadcast`` / ``dist.reduce``
  (:mod:`~graphwire.comm.dist_rooted`).
- ``all_gather_object``: an ``all_gather`` of the pickled lengths (``int64
  [1]`` per rank), then one ``all_to_all_single`` of the exact pickles. Unlike
  ``dist.all_gather_object`` nothing is padded to the longest pickle, so the
  ledger's ``len(encode_object(obj))`` is exactly the payload that moved.

The ledger counts payload bytes to and from every other rank; an empty block is
no message. Metadata is not counted: the backend's own message headers, the
split check's row counts and ``all_gather_object``'s 8-byte lengths.

Failures: every blocking call is bounded by the process-group timeout
(``ctx.timeout_s``); under NCCL the watchdog enforces it by aborting the
process. A ``torch.distributed`` error (timeout, a peer's connection closed) is
re-raised as :class:`TransportError` naming this rank, the operation and the
tag, and the peer: a point-to-point one's, or of two ranks the other; of
more, a failed collective names the ranks whose
:class:`~graphwire.comm.heartbeat.Heartbeat` stopped. Under gloo a peer that
dies mid-collective closes its sockets, and the survivors' pending
collectives fail at once rather than at the timeout. A call that waits
``ctx.stall_notice_s`` says which rank holds it up
(:class:`~graphwire.comm.stall.StallWatch`).
"""

from __future__ import annotations

import os
import pickle
from collections.abc import Mapping, Sequence
from contextlib import AbstractContextManager
from datetime import timedelta
from typing import TYPE_CHECKING, Any, NoReturn

import torch
import torch.distributed as dist

from graphwire.comm import dist_rooted as rooted
from graphwire.comm.base import (
    JoinFailed,
    Transport,
    TransportError,
    Work,
    encode_object,
    name_ranks,
    row_bytes,
)
from graphwire.comm.context import WorkerContext
from graphwire.comm.dist_work import TorchWork
from graphwire.comm.heartbeat import Heartbeat
from graphwire.comm.stall import StallWatch
from graphwire.comm.wire import bytes_per_row, rows_as_bytes, rows_from_bytes

if TYPE_CHECKING:
    from graphwire.comm.service import Service

__all__ = ["TorchTransport", "p2p_backend"]

_P2P_TAG = 0  # one channel per pair: matched in send order, as LocalTransport


def p2p_backend(backend: str) -> str | None:
    """The backend of a run's point-to-point messages, when not the run's own.

    gloo under NCCL (see the module doc), else None."""
    return "gloo" if backend == "nccl" else None


class TorchTransport(Transport):
    """One rank of a ``torch.distributed`` run; build it with :meth:`open`.

    Args:
        ctx: this worker's context; its process group must already exist.
        check_splits: before each ``all_to_all``, all-gather every rank's send
            and receive row counts (``int64 [2, W]``, not in the ledger) and
            raise :class:`TransportError` on every rank if they disagree.
            Without it a plan bug is silent or fatal: gloo fills a receive
            from a shorter send with garbage rows, and aborts the process
            (SIGABRT, uncatchable) on a longer one.
        owns_group: whether :meth:`close` destroys the process group.
    """

    def __init__(
        self, ctx: WorkerContext, *, check_splits: bool = True, owns_group: bool = False
    ) -> None:
        super().__init__(ctx.rank, ctx.world_size)
        self.ctx = ctx
        self.device = ctx.device
        self.check_splits = check_splits
        self._timeout = timedelta(seconds=ctx.timeout_s)
        self.timeout_s = float(ctx.timeout_s)
        self._owns_group = owns_group
        self._closed = False
        self._stall: StallWatch | None = None
        if ctx.world_size > 1 and ctx.stall_notice_s > 0:
            self._stall = StallWatch(
                ctx.rank,
                ctx.world_size,
                ctx.stall_notice_s,
                ctx.timeout_s,
                None,  # the heartbeat, next: its first beat tells the status
                phase=lambda: self.phase,
            )
        self._heartbeat: Heartbeat | None = None
        if ctx.world_size > 1:
            status = None if self._stall is None else self._stall.status
            self._heartbeat = Heartbeat.start(ctx, status)
        if self._stall is not None:
            self._stall.heartbeat = self._heartbeat
        # Made by every rank here, as new_group must be (open runs on all).
        self._p2p_group: Any = None
        self._p2p_device = self.device
        other = p2p_backend(ctx.backend)
        if other is not None and ctx.world_size > 1:
            self._p2p_group = dist.new_group(backend=other, timeout=self._timeout)
            self._p2p_device = torch.device("cpu")

    @property
    def leads_machine(self) -> bool:
        """The first rank of its machine (``LOCAL_RANK`` 0)."""
        return self.ctx.local_rank == 0

    @property
    def machine_ranks(self) -> int:
        """The ranks on this machine (``LOCAL_WORLD_SIZE``; one where the
        launcher did not say)."""
        return self.ctx.local_world_size or 1

    @classmethod
    def open(cls, ctx: WorkerContext, *, check_splits: bool = True) -> TorchTransport:
        """Join the run described by ``ctx`` (blocks until all ranks join).

        Creates the default process group (``ctx.init_method``, bounded by
        ``ctx.timeout_s``) unless one exists already; then the group must match
        ``ctx`` and is left alone by :meth:`close`.

        Args:
            ctx: this worker's context.
            check_splits: see the class docstring.

        Raises:
            TransportError: the rendezvous failed or timed out, or the
                backend is NCCL and this rank's GPU is not there.
        """
        if dist.is_initialized():
            if (dist.get_rank(), dist.get_world_size()) != (ctx.rank, ctx.world_size):
                raise TransportError(
                    f"rank {ctx.rank}: a process group already exists as rank "
                    f"{dist.get_rank()} of {dist.get_world_size()}, expected rank "
                    f"{ctx.rank} of {ctx.world_size}"
                )
            return cls(ctx, check_splits=check_splits, owns_group=False)
        if ctx.backend == "nccl":
            if ctx.local_rank >= torch.cuda.device_count():
                raise TransportError(
                    f"rank {ctx.rank}: backend 'nccl' needs GPU cuda:"
                    f"{ctx.local_rank}, but this process sees "
                    f"{torch.cuda.device_count()} CUDA device(s); use 'gloo' on CPU"
                )
            torch.cuda.set_device(ctx.device)
        timeout = timedelta(seconds=ctx.timeout_s)
        try:
            store, _, _ = next(
                dist.rendezvous(
                    ctx.init_method,
                    rank=ctx.rank,
                    world_size=ctx.world_size,
                    timeout=timeout,
                )
            )
            dist.init_process_group(
                backend=ctx.backend,
                store=dist.PrefixStore(_attempt_prefix(ctx.world_size), store),
                rank=ctx.rank,
                world_size=ctx.world_size,
                timeout=timeout,
            )
        except RuntimeError as error:
            said = str(error).strip().splitlines()
            raise JoinFailed(
                f"rank {ctx.rank}: joining {ctx.world_size} ranks at "
                f"{ctx.init_method} ({ctx.backend}) failed within the timeout of "
                f"{ctx.timeout_s:g} s: {said[0] if said else type(error).__name__}"
            ) from error
        return cls(ctx, check_splits=check_splits, owns_group=True)

    def open_service(self, name: str, handlers: Mapping[str, Any]) -> Service:
        """See :meth:`Transport.open_service` (a serving thread over p2p)."""
        from graphwire.comm.dist_service import TorchService

        self._check_open(name)
        return TorchService(self, name, handlers)

    def close(self) -> None:
        """Destroy the process group (if :meth:`open` made it); idempotent."""
        if self._closed:
            return
        self._closed = True
        if self._heartbeat is not None:
            self._heartbeat.stop()
        if self._stall is not None:
            self._stall.stop()
        if self._p2p_group is not None and dist.is_initialized():
            dist.destroy_process_group(self._p2p_group)
        if self._owns_group and dist.is_initialized():
            dist.destroy_process_group()

    # ------------------------------------------------------------ primitives
    def all_to_all(
        self, send: Sequence[torch.Tensor], recv_rows: Sequence[int], tag: str
    ) -> list[torch.Tensor]:
        """See :meth:`Transport.all_to_all`; results are on ``send``'s device.

        ``recv_rows[p]`` must equal the rows rank ``p`` sends here; with
        ``check_splits`` a mismatch raises :class:`TransportError` on every rank.
        """
        self._check_open(tag)
        world = self.world_size
        if len(send) != world or len(recv_rows) != world:
            raise ValueError(
                f"all_to_all ({tag}): expected {world} send tensors and recv "
                f"sizes, got {len(send)} and {len(recv_rows)}"
            )
        mine = send[self.rank]
        row_shape, dtype, home = mine.shape[1:], mine.dtype, mine.device
        for dst, tensor in enumerate(send):
            if tensor.dim() == 0 or tensor.shape[1:] != row_shape:
                raise ValueError(
                    f"all_to_all ({tag}): send[{dst}] has shape "
                    f"{tuple(tensor.shape)}, expected [rows, *{tuple(row_shape)}]"
                )
            if tensor.dtype != dtype or tensor.device != home:
                raise ValueError(
                    f"all_to_all ({tag}): send[{dst}] is {tensor.dtype} on "
                    f"{tensor.device}, expected {dtype} on {home} as send[{self.rank}]"
                )
        if any(rows < 0 for rows in recv_rows):
            raise ValueError(f"all_to_all ({tag}): negative recv_rows {recv_rows}")
        if world == 1:
            return [mine]
        with self.waiting("all_to_all", tag):
            return self._exchange(send, recv_rows, tag, self.check_splits)

    def waiting(
        self, op: str, tag: str, peers: Sequence[int] | None = None
    ) -> AbstractContextManager[None]:
        """See :meth:`Transport.waiting`: noted by the run's stall watch."""
        if self._stall is None:
            return super().waiting(op, tag, peers)
        return self._stall.waiting(op, tag, peers)

    def _exchange(
        self,
        send: Sequence[torch.Tensor],
        recv_rows: Sequence[int],
        tag: str,
        check: bool,
    ) -> list[torch.Tensor]:
        """:meth:`all_to_all` on checked arguments, ``world_size > 1``."""
        mine = send[self.rank]
        row_shape, dtype, home = mine.shape[1:], mine.dtype, mine.device
        # Own block: split 0 both ways (no copy through the backend).
        send_rows = [
            0 if p == self.rank else int(t.shape[0]) for p, t in enumerate(send)
        ]
        recv_sizes = [0 if p == self.rank else int(n) for p, n in enumerate(recv_rows)]
        if check:
            self._check_splits(send_rows, recv_sizes, tag)
        width = bytes_per_row(row_shape, dtype)
        blocks = [rows_as_bytes(t, width) for p, t in enumerate(send) if p != self.rank]
        payload = torch.cat(blocks).to(self.device)
        received = torch.empty(
            (sum(recv_sizes), width), dtype=torch.uint8, device=self.device
        )
        try:
            dist.all_to_all_single(
                received, payload, recv_sizes, send_rows, async_op=False
            )
        except RuntimeError as error:
            self._collective_failed("all_to_all", tag, error)

        out: list[torch.Tensor] = []
        for src, block in enumerate(torch.split(received.to(home), recv_sizes)):
            out.append(
                mine if src == self.rank else rows_from_bytes(block, row_shape, dtype)
            )
        for peer in range(self.world_size):
            if peer != self.rank:
                self.ledger.record_send(peer, tag, send_rows[peer] * width)
                self.ledger.record_recv(peer, tag, recv_sizes[peer] * width)
        return out

    def broadcast(self, tensor: torch.Tensor, root: int, tag: str) -> None:
        """See :meth:`Transport.broadcast` (:mod:`~graphwire.comm.dist_rooted`)."""
        self._check_open(tag)
        self._check_root(root, "broadcast", tag)
        rooted.broadcast(self, tensor, root, tag)

    def reduce_sum(
        self, tensor: torch.Tensor, root: int, tag: str
    ) -> torch.Tensor | None:
        """See :meth:`Transport.reduce_sum` (:mod:`~graphwire.comm.dist_rooted`)."""
        self._check_open(tag)
        self._check_root(root, "reduce_sum", tag)
        return rooted.reduce_sum(self, tensor, root, tag)

    def isend(self, tensor: torch.Tensor, dst: int, tag: str) -> Work:
        """See :meth:`Transport.isend`.

        ``tensor`` must not change before the returned work's ``wait()``."""
        self._check_peer(dst, "isend", tag)
        staged = tensor.detach().contiguous().to(self._p2p_device)
        op = f"isend to rank {dst}"
        try:
            work = dist.isend(staged, dst, group=self._p2p_group, tag=_P2P_TAG)
        except RuntimeError as error:
            self._fail(op, tag, error)
        self.ledger.record_send(dst, tag, row_bytes(staged))
        return self._work(work, op, tag, dst)

    def irecv(self, tensor: torch.Tensor, src: int, tag: str) -> Work:
        """See :meth:`Transport.irecv`; ``tensor`` is filled by ``wait()``."""
        self._check_peer(src, "irecv", tag)
        home = self._p2p_device
        direct = tensor.device == home and tensor.is_contiguous()
        staged = tensor
        if not direct:  # (empty_like keeps a transposed view's strides)
            staged = torch.empty(tensor.shape, dtype=tensor.dtype, device=home)
        op = f"irecv from rank {src}"
        try:
            work = dist.irecv(staged, src, group=self._p2p_group, tag=_P2P_TAG)
        except RuntimeError as error:
            self._fail(op, tag, error)
        self.ledger.record_recv(src, tag, row_bytes(staged))
        return self._work(work, op, tag, src, staged, None if direct else tensor)

    def _work(
        self,
        work: Any,
        op: str,
        tag: str,
        peer: int,
        staged: torch.Tensor | None = None,
        target: torch.Tensor | None = None,
    ) -> TorchWork:
        """The :class:`TorchWork` of a point-to-point ``op`` with ``peer``:
        bounded by the timeout, its wait noted by the stall watch."""
        return TorchWork(
            work,
            op,
            tag,
            self._timeout,
            self._fail,
            lambda: self.waiting(op, tag, [peer]),
            staged,
            target,
        )

    def all_gather_object(self, obj: Any, tag: str) -> list[Any]:
        self._check_open(tag)
        if self.world_size == 1:
            return [obj]
        with self.waiting("all_gather_object", tag):
            return self._gather_object(obj, tag)

    def _gather_object(self, obj: Any, tag: str) -> list[Any]:
        data = encode_object(obj)
        length = torch.tensor([len(data)], dtype=torch.int64, device=self.device)
        lengths = [torch.empty_like(length) for _ in range(self.world_size)]
        try:
            dist.all_gather(lengths, length)
        except RuntimeError as error:
            self._collective_failed("all_gather_object (lengths)", tag, error)
        sizes = [int(n.item()) for n in lengths]  # host sync (NCCL)
        mine = torch.frombuffer(bytearray(data), dtype=torch.uint8)
        # Records len(data) bytes to, and sizes[p] from, every peer p; the
        # sizes agree by construction.
        blocks = self._exchange([mine] * self.world_size, sizes, tag, check=False)
        return [
            obj if p == self.rank else pickle.loads(blocks[p].numpy().tobytes())
            for p in range(self.world_size)
        ]

    # --------------------------------------------------------------- helpers
    def _check_splits(
        self, send_rows: list[int], recv_rows: list[int], tag: str
    ) -> None:
        """Raise on every rank unless each rank sends each peer the rows that
        peer expects (one ``all_gather`` of ``int64 [2, W]``)."""
        mine = torch.tensor([send_rows, recv_rows], dtype=torch.int64)
        every = [torch.empty_like(mine, device=self.device) for _ in send_rows]
        try:
            dist.all_gather(every, mine.to(self.device))
        except RuntimeError as error:
            self._collective_failed("all_to_all (split check)", tag, error)
        table = torch.stack(every).cpu()  # [W ranks, 2, W peers]; host sync
        sends, expects = table[:, 0, :], table[:, 1, :].T  # [src, dst] both
        wrong = (sends != expects).nonzero().tolist()
        if wrong:
            pairs = "; ".join(
                f"rank {src} sends {int(sends[src, dst])} rows to rank {dst}, "
                f"which expects {int(expects[src, dst])}"
                for src, dst in wrong[:4]
            )
            more = f" (and {len(wrong) - 4} more)" if len(wrong) > 4 else ""
            raise TransportError(
                f"rank {self.rank} ({tag}): all_to_all split sizes disagree: "
                f"{pairs}{more}"
            )

    def _check_open(self, tag: str) -> None:
        if self._closed:
            raise TransportError(f"rank {self.rank} ({tag}): transport is closed")

    def _check_peer(self, peer: int, op: str, tag: str) -> None:
        self._check_open(tag)
        if not 0 <= peer < self.world_size or peer == self.rank:
            raise ValueError(
                f"{op} ({tag}): peer must be another rank in [0, "
                f"{self.world_size}), got {peer} on rank {self.rank}"
            )

    def _collective_failed(self, op: str, tag: str, error: BaseException) -> NoReturn:
        """Raise for a failed collective ``op``, naming the peers it failed
        on where that can be told (gloo's errors give an address, not a
        rank): of two ranks the other; of more, the ranks whose heartbeat
        stopped (this waits the heartbeat's silence period to see)."""
        if self.world_size == 2:
            self._fail(f"{op} with rank {1 - self.rank}", tag, error)
        lost = self._heartbeat.lost() if self._heartbeat is not None else None
        if lost:
            where = "they ran" if len(lost) > 1 else "it ran"
            why = (
                f"{name_ranks(lost)} stopped beating (died, killed or frozen; "
                f"see where {where})"
            )
        elif lost == []:
            why = "every other rank still beats, so one is slow or stuck"
        else:  # the store went with its host: nothing to tell
            self._fail(op, tag, error)
        raise TransportError(
            f"rank {self.rank} ({tag}): {op} failed: {why}. {error}"
        ) from error

    def _fail(self, op: str, tag: str, error: BaseException) -> NoReturn:
        if self._heartbeat is not None:
            self._heartbeat.mark_failed()  # the others' lost() leave it out
        raise TransportError(
            f"rank {self.rank} ({tag}): {op} failed: {error}"
        ) from error


def _attempt_prefix(world_size: int) -> str:
    """The keys of this attempt of the run in its rendezvous store.

    torchrun's agent keeps one store for all its attempts (``--max-restarts``),
    where a restarted group would find the addresses its predecessors
    published, and gloo's connect to them is refused. A prefix per attempt
    (``TORCHELASTIC_RESTART_COUNT``) starts each on clean keys; it holds the
    world size too, which a restart for nodes that join (``--nnodes
    MIN:MAX``) changes without counting a restart.
    """
    restart = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
    return f"graphwire/attempt_{restart}/world_{world_size}"
