"""`LocalTransport`: N ranks as threads of one process, for fast unit tests.

Ranks exchange tensors through one FIFO queue per ordered pair (src, dst), so
messages between a pair arrive in send order, as with torch.distributed
point-to-point. Every payload is cloned on send: no rank ever sees another's
memory. :func:`run_local` runs a function on every rank and returns the results.
"""

from __future__ import annotations

import pickle
import queue
import threading
import time
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from contextlib import nullcontext
from typing import Any, TypeVar

import torch

from graphwire.comm.base import (
    Transport,
    TransportError,
    Work,
    encode_object,
    row_bytes,
)
from graphwire.comm.service import HEADER_BYTES, Service
from graphwire.comm.turns import Turns, waiting
from graphwire.comm.wire import pack, unpack

__all__ = ["LocalService", "LocalTransport", "run_local"]

T = TypeVar("T")


class _Hub:
    def __init__(self, world_size: int, timeout: float) -> None:
        self.world_size = world_size
        self.timeout = timeout
        self.queues = {
            (s, d): queue.Queue[Any]()
            for s in range(world_size)
            for d in range(world_size)
        }
        self.failed = threading.Event()
        self.services: dict[str, list[LocalService | None]] = {}
        self.lock = threading.Lock()


class _Done:
    def wait(self) -> None:
        return None


class _PendingRecv:
    """A posted receive. Receives from one source complete in the order they
    were posted, whatever order they are waited on (as torch.distributed
    matches point-to-point messages)."""

    def __init__(self, transport: LocalTransport, tensor: torch.Tensor, src: int):
        self.transport, self.tensor, self.src = transport, tensor, src
        self.done = False

    def wait(self) -> None:
        posted = self.transport._posted[self.src]
        while not self.done:
            first = posted.popleft()
            first._complete(self.transport._get(self.src))

    def _complete(self, payload: torch.Tensor) -> None:
        if payload.shape != self.tensor.shape:
            raise TransportError(
                f"rank {self.transport.rank}: expected {tuple(self.tensor.shape)} "
                f"from rank {self.src}, got {tuple(payload.shape)}"
            )
        self.tensor.copy_(payload)
        self.done = True


class LocalTransport(Transport):
    """One rank of an in-process group; build them with :func:`run_local`."""

    def __init__(self, rank: int, hub: _Hub) -> None:
        super().__init__(rank, hub.world_size)
        self._hub = hub
        self._posted: dict[int, deque[_PendingRecv]] = {
            src: deque() for src in range(hub.world_size)
        }

    def _put(self, dst: int, tag: str, payload: Any, tensor: torch.Tensor | None):
        self._hub.queues[(self.rank, dst)].put(payload)
        if tensor is not None:
            self.ledger.record_send(dst, tag, row_bytes(tensor))

    def _get(self, src: int) -> Any:
        """The next message from ``src``; fails fast once any rank has failed."""
        source = self._hub.queues[(src, self.rank)]
        try:
            return source.get_nowait()
        except queue.Empty:
            pass
        with waiting():  # other ranks run meanwhile (see graphwire.comm.turns)
            return self._wait_for(source, src)

    def _wait_for(self, source: queue.Queue[Any], src: int) -> Any:
        deadline = time.monotonic() + self._hub.timeout
        while True:
            try:
                return source.get(timeout=0.05)
            except queue.Empty:
                if self._hub.failed.is_set():
                    raise TransportError(
                        f"rank {self.rank}: stopped waiting for rank {src}: "
                        "another rank failed"
                    ) from None
                if time.monotonic() > deadline:
                    raise TransportError(
                        f"rank {self.rank}: nothing from rank {src} within "
                        f"{self._hub.timeout:.0f}s"
                    ) from None

    def all_to_all(
        self, send: Sequence[torch.Tensor], recv_rows: Sequence[int], tag: str
    ) -> list[torch.Tensor]:
        if len(send) != self.world_size or len(recv_rows) != self.world_size:
            raise ValueError(
                f"all_to_all: expected {self.world_size} send tensors and recv "
                f"sizes, got {len(send)} and {len(recv_rows)}"
            )
        for dst, tensor in enumerate(send):
            if dst != self.rank:
                self._put(dst, tag, tensor.detach().clone(), tensor)
        out: list[torch.Tensor] = []
        for src in range(self.world_size):
            if src == self.rank:
                out.append(send[src])
                continue
            payload: torch.Tensor = self._get(src)
            if payload.shape[0] != recv_rows[src]:
                raise TransportError(
                    f"rank {self.rank} ({tag}): expected {recv_rows[src]} rows "
                    f"from rank {src}, got {payload.shape[0]}"
                )
            self.ledger.record_recv(src, tag, row_bytes(payload))
            out.append(payload)
        return out

    def isend(self, tensor: torch.Tensor, dst: int, tag: str) -> Work:
        self._put(dst, tag, tensor.detach().clone(), tensor)
        return _Done()

    def irecv(self, tensor: torch.Tensor, src: int, tag: str) -> Work:
        self.ledger.record_recv(src, tag, row_bytes(tensor))
        pending = _PendingRecv(self, tensor, src)
        self._posted[src].append(pending)
        return pending

    def open_service(self, name: str, handlers: Mapping[str, Any]) -> Service:
        """See :meth:`Transport.open_service`; handlers run on the calling thread.

        A peer's handler runs on the calling thread, one request at a time per
        server, as a serving thread would run it."""
        service = LocalService(self, name, handlers)
        with self._hub.lock:
            table = self._hub.services.setdefault(name, [None] * self.world_size)
            table[self.rank] = service
        self.barrier()  # every rank's handlers are registered
        return service

    def all_gather_object(self, obj: Any, tag: str) -> list[Any]:
        # Pickled, as across processes: no rank shares another's objects, and
        # the ledger counts the same bytes as TorchTransport's.
        payload = encode_object(obj)
        for dst in range(self.world_size):
            if dst != self.rank:
                self._put(dst, tag, payload, None)
                self.ledger.record_send(dst, tag, len(payload))
        out: list[Any] = []
        for src in range(self.world_size):
            if src == self.rank:
                out.append(obj)
                continue
            received: bytes = self._get(src)
            self.ledger.record_recv(src, tag, len(received))
            out.append(pickle.loads(received))
        return out


class LocalService(Service):
    """:class:`Service` between the ranks of one :func:`run_local` group.

    Requests and responses are packed and unpacked as on the wire (no rank
    sees another's tensors) and counted in both ranks' ledgers.
    """

    def __init__(
        self, transport: LocalTransport, name: str, handlers: Mapping[str, Any]
    ) -> None:
        super().__init__(transport, name, handlers)
        self._hub = transport._hub
        self._closed = False

    def _call(
        self, requests: Mapping[int, Sequence[torch.Tensor]], kind: str
    ) -> dict[int, list[torch.Tensor]]:
        if self._closed:
            raise TransportError(f"rank {self.rank}: service {self.name} is closed")
        tag = self.tag(kind)
        out: dict[int, list[torch.Tensor]] = {}
        for peer, tensors in requests.items():
            server = self._hub.services[self.name][peer]
            if server is None or self._hub.failed.is_set():
                raise self._fail(peer, kind, "the peer is not serving")
            message = pack(tensors)
            size = HEADER_BYTES + message.numel()
            self.transport.ledger.record_send(peer, f"{tag}.req", size)
            server.transport.ledger.record_recv(self.rank, f"{tag}.req", size)
            try:
                response = pack(server._answer(self.rank, kind, unpack(message)))
            except Exception as error:
                raise self._fail(
                    peer, kind, f"its handler raised: {type(error).__name__}: {error}"
                ) from error
            size = HEADER_BYTES + response.numel()
            server.transport.ledger.record_send(self.rank, tag, size)
            self.transport.ledger.record_recv(peer, tag, size)
            out[peer] = unpack(response)
        return out

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            self.transport.barrier()


def run_local(
    fn: Callable[[LocalTransport], T],
    world_size: int,
    timeout: float = 60.0,
    running: int | None = None,
) -> list[T]:
    """Run ``fn(transport)`` on ``world_size`` in-process ranks (threads).

    The ranks are threads of this process, so while they run, torch computes
    each operation on one thread: several ranks each starting torch's
    intra-op pool would crowd the same cores (one rank keeps the pool).
    With ``running``, at most that many ranks run at once, each giving its
    turn up while it waits (:mod:`graphwire.comm.turns`): a hundred ranks on
    two cores then run several times faster than all at once.

    Returns:
        Each rank's return value, by rank.

    Raises:
        The exception the first failing rank raised (its peers then stop
        waiting with a TransportError, which is not reported).
    """
    hub = _Hub(world_size, timeout)
    results: list[Any] = [None] * world_size
    errors: list[tuple[float, BaseException]] = []
    turns = Turns(running) if running is not None else None

    def body(rank: int) -> None:
        try:
            with turns.hold() if turns is not None else nullcontext():
                results[rank] = fn(LocalTransport(rank, hub))
        except BaseException as error:  # reported to the caller below
            errors.append((time.monotonic(), error))
            hub.failed.set()  # peers stop waiting for this rank

    threads = [
        threading.Thread(target=body, args=(r,), name=f"rank{r}", daemon=True)
        for r in range(world_size)
    ]
    pool = torch.get_num_threads()
    if world_size > 1:
        torch.set_num_threads(1)
    try:
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout * 4)
            if thread.is_alive():
                raise TransportError(
                    f"{thread.name} did not finish in {timeout * 4:.0f}s"
                )
    finally:
        torch.set_num_threads(pool)
    if errors:
        raise min(errors, key=lambda item: item[0])[1]  # the root cause
    return results
