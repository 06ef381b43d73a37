"""Worker functions for the transport tests, importable by spawned children.

Every payload is a function of (src, dst, index), in the spirit of "node i has
features equal to i": a test recomputes what each rank must have received, and
how many bytes, from the same functions, for any world size.

:func:`exchange_suite` runs every primitive once on any :class:`Transport`, so
``LocalTransport`` (threads) and ``TorchTransport`` (processes) are held to the
same expectations. The other probes fail on purpose.
"""

from __future__ import annotations

import ctypes
import os
import resource
import signal
import sys
import tempfile
import time
from typing import Any

import torch

from graphwire.comm.base import Transport, TransportError
from graphwire.comm.context import WorkerContext

__all__ = [
    "FEATURE_DIM",
    "NUM_P2P",
    "P2P_LEN",
    "exchange_suite",
    "feature_block",
    "gather_payload",
    "id_block",
    "join_nowhere",
    "kill_on_rank",
    "leave_and_kill",
    "p2p_message",
    "raise_on_rank",
    "reduce_input",
    "refault_pages",
    "rows_between",
    "sleep_forever",
]

FEATURE_DIM = 3
NUM_P2P = 3  # messages each rank sends its successor in the ring
P2P_LEN = 4


def rows_between(src: int, dst: int) -> int:
    """Rows ``src`` sends ``dst`` in the suite's all-to-all: 0, 1 or 2, uneven,
    with empty blocks between distinct ranks from 3 ranks on."""
    return (src + 2 * dst) % 3


def feature_block(src: int, dst: int) -> torch.Tensor:
    """float32 ``[rows_between(src, dst), FEATURE_DIM]``; row i is
    ``[src, dst, i]``."""
    rows = rows_between(src, dst)
    block = torch.empty(rows, FEATURE_DIM, dtype=torch.float32)
    block[:, 0], block[:, 1] = src, dst
    block[:, 2] = torch.arange(rows, dtype=torch.float32)
    return block


def id_block(src: int, dst: int) -> torch.Tensor:
    """int64 ``[rows_between(src, dst)]``: ``1000 * src + 100 * dst + i``."""
    return torch.arange(rows_between(src, dst)) + 1000 * src + 100 * dst


def reduce_input(rank: int) -> torch.Tensor:
    """float32 ``[3, 5]`` random (seeded by rank): 15 elements split unevenly
    over 2 and 4 ranks."""
    generator = torch.Generator().manual_seed(100 + rank)
    return torch.randn(3, 5, generator=generator)


def p2p_message(src: int, k: int) -> torch.Tensor:
    """float64 ``[P2P_LEN]``: message ``k`` of rank ``src``, all ``10 src + k``.

    Equal sizes, so an out-of-order match shows as wrong values."""
    return torch.full((P2P_LEN,), float(10 * src + k), dtype=torch.float64)


def gather_payload(rank: int) -> dict[str, Any]:
    """Rank ``rank``'s object for ``all_gather_object`` (pickles differ in
    size from rank to rank)."""
    return {"rank": rank, "ids": list(range(rank + 1))}


def exchange_suite(transport: Transport, mismatch: bool = False) -> dict[str, Any]:
    """Run each primitive once under its own tag; return what arrived.

    Args:
        transport: any transport.
        mismatch: finally call ``all_to_all`` with ``recv_rows`` that disagree
            with what rank 1 sends rank 0 (for transports that check splits on
            every rank), and record the error.

    Returns:
        ``feat``/``ids``: ``all_to_all`` results by source rank (tags
        ``a2a.feat``, ``a2a.ids``); ``sum``: ``all_reduce_sum`` of
        :func:`reduce_input` (tag ``sum``); ``sum_started``: the same sum by
        ``start_all_reduce_sum`` with a second one in flight beside it (tags
        ``sum.a``, ``sum.b``; the second adds ``2 * reduce_input``); ``p2p``:
        the ``NUM_P2P`` messages from the predecessor, in arrival order (tag
        ``p2p``); ``objects``:
        ``all_gather_object`` of :func:`gather_payload` (tag ``obj``);
        ``ledger``: snapshot after these; ``mismatch``: the error text.
    """
    rank, world = transport.rank, transport.world_size
    out: dict[str, Any] = {}
    feat = [feature_block(rank, dst) for dst in range(world)]
    recv = [rows_between(src, rank) for src in range(world)]
    out["feat"] = transport.all_to_all(feat, recv, "a2a.feat")
    ids = [id_block(rank, dst) for dst in range(world)]
    out["ids"] = transport.all_to_all(ids, recv, "a2a.ids")
    out["sum"] = transport.all_reduce_sum(reduce_input(rank), "sum")
    first = transport.start_all_reduce_sum(reduce_input(rank), "sum.a")
    second = transport.start_all_reduce_sum(2 * reduce_input(rank), "sum.b")
    first.advance()
    out["sum_started"] = (first.wait(), second.wait())
    out["p2p"] = []
    if world > 1:
        succ, pred = (rank + 1) % world, (rank - 1) % world
        inbox = [torch.empty(P2P_LEN, dtype=torch.float64) for _ in range(NUM_P2P)]
        # The last, sent as [P2P_LEN / 2, 2], lands in a transposed
        # (non-contiguous) view of that shape, in its order.
        inbox[-1] = torch.empty(2, P2P_LEN // 2, dtype=torch.float64).t()
        outbox = [p2p_message(rank, k) for k in range(NUM_P2P)]
        outbox[-1] = outbox[-1].reshape(inbox[-1].shape)
        recvs = [transport.irecv(buf, pred, "p2p") for buf in inbox]
        sends = [transport.isend(message, succ, "p2p") for message in outbox]
        for work in [*sends, *recvs]:
            work.wait()
        out["p2p"] = [buf.reshape(-1) for buf in inbox]
    out["objects"] = transport.all_gather_object(gather_payload(rank), "obj")
    out["ledger"] = transport.ledger.snapshot()
    out["mismatch"] = None
    if mismatch and world > 1:
        wrong = list(recv)
        if rank == 0:
            wrong[1] += 1
        try:
            transport.all_to_all(feat, wrong, "a2a.bad")
        except TransportError as error:
            out["mismatch"] = str(error)
        transport.barrier()  # the group still works
    return out


def exchange_suite_p2p_aside(ctx: WorkerContext) -> dict[str, Any]:
    """:func:`exchange_suite` (with ``mismatch``) on a gloo run whose
    point-to-point messages go over a second gloo group, as an NCCL run's do
    (:func:`graphwire.comm.dist.p2p_backend`): the routing NCCL takes, run on
    machines without a GPU per rank."""
    from graphwire.comm import dist as transport_module

    transport_module.p2p_backend = lambda backend: "gloo"  # this process only
    transport = transport_module.TorchTransport.open(ctx)
    try:
        if transport._p2p_group is None:
            raise AssertionError("no group of its own for point-to-point")
        return exchange_suite(transport, True)
    finally:
        transport.close()


def raise_on_rank(transport: Transport, bad_rank: int) -> None:
    """Rank ``bad_rank`` raises ``ValueError``; the others wait in a barrier
    for it (and fail when it is gone)."""
    transport.barrier()
    if transport.rank == bad_rank:
        raise ValueError(f"probe failure on rank {bad_rank}")
    transport.barrier()


def join_nowhere(ctx: WorkerContext, port: int, timeout_s: float) -> None:
    """Join a process group at ``127.0.0.1:port``, where no store listens:
    :class:`~graphwire.comm.base.JoinFailed` after ``timeout_s``."""
    from dataclasses import replace

    from graphwire.comm.dist import TorchTransport

    TorchTransport.open(replace(ctx, master_port=port, timeout_s=timeout_s))


def kill_on_rank(transport: Transport, bad_rank: int, note: str | None = None) -> None:
    """Rank ``bad_rank`` SIGKILLs itself while the others are blocked in an
    ``all_to_all`` with it; they must fail with :class:`TransportError`.

    With ``note``, every rank first makes a temporary folder and appends its
    path to the file ``note`` (for the launcher's clean-up check).
    """
    if note is not None:
        folder = tempfile.mkdtemp()
        with open(note, "a") as handle:
            handle.write(folder + "\n")
    transport.barrier()
    if transport.rank == bad_rank:
        time.sleep(0.5)  # let the others enter the all-to-all
        os.kill(os.getpid(), signal.SIGKILL)
    world = transport.world_size
    transport.all_to_all([torch.ones(1)] * world, [1] * world, "doomed")


def leave_and_kill(transport: Transport, bad_rank: int) -> None:
    """As :func:`kill_on_rank`, and rank 0 ends its process at once, as a
    rank that met the failure first and exited does: the others, blocked in
    an ``all_to_all`` with both, must still tell which ranks stopped beating
    (the rendezvous store is not rank 0's to take with it)."""
    transport.barrier()
    if transport.rank == 0:
        os._exit(3)
    kill_on_rank(transport, bad_rank)


def quick_steps(transport: Transport, steps: int, step_s: float) -> int:
    """``steps`` barriers ``step_s`` apart: a run longer than the collective
    timeout whose every collective is quick."""
    for _ in range(steps):
        time.sleep(step_s)
        transport.barrier()
    return steps


def hang_on_rank(transport: Transport, bad_rank: int) -> None:
    """Rank ``bad_rank`` neither returns nor fails; the others wait for it in
    a barrier until their collective timeout."""
    transport.barrier()
    if transport.rank == bad_rank:
        while True:
            time.sleep(1.0)
    transport.barrier()


def backend_of(ctx: WorkerContext) -> str:
    """The backend a launched worker was given (it joins no group)."""
    return ctx.backend


def what_a_child_sees(ctx: WorkerContext, name: str) -> tuple[str | None, str]:
    """Print a line naming the rank, and return the variable ``name`` of
    the environment and the working folder, as this child has them."""
    print(f"rank {ctx.rank} on its standard output", flush=True)
    print(f"rank {ctx.rank} on its standard error", file=sys.stderr, flush=True)
    return os.environ.get(name), os.getcwd()


def sleep_forever(ctx: WorkerContext) -> None:
    """Never returns (for the launcher's timeout)."""
    while True:
        time.sleep(1.0)


def refault_pages(ctx: WorkerContext, mb: int = 48, times: int = 3) -> int:
    """Page faults of ``times`` more malloc-fill-free cycles of ``mb`` MiB
    after a first: about ``mb * 256`` each where every block is a fresh
    mapping (glibc's default above 32 MiB), about none where the freed block
    is kept for the next (:func:`graphwire.allocator.keep_freed_memory`)."""
    libc = ctypes.CDLL(None)
    libc.malloc.restype = ctypes.c_void_p
    libc.malloc.argtypes = [ctypes.c_size_t]
    libc.free.argtypes = [ctypes.c_void_p]
    size = mb << 20

    def cycle() -> None:
        block = libc.malloc(size)
        if not block:
            raise MemoryError(f"malloc of {mb} MiB failed")
        ctypes.memset(block, 1, size)
        libc.free(block)

    cycle()
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    for _ in range(times):
        cycle()
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before
