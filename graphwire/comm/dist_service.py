"""`TorchService`: the :class:`Service` over torch.distributed point-to-point.

Why point-to-point and not ``torch.distributed.rpc``: the service needs
nothing but "send these tensors to the owner, get tensors back", and plain
``send``/``recv`` on a process group of its own gives that with exact byte
accounting (the ledger counts the payload as it is sent), no second
rendezvous, no pickled Python on the wire, and the same failure behaviour as
the rest of the transport (a peer's death closes its sockets and pending
receives fail at once). RPC adds an agent, thread pools and its own
serialisation for no capability the KV store uses.

The wire protocol, on a gloo group made for the service (CPU tensors, under
NCCL runs too; its own sockets, so it never interleaves with the training
collectives of the default group):

    caller -> owner   header int64 [handler, slot, nbytes, 0]  tag 0 (any source)
    caller -> owner   packed request, uint8 [nbytes]           tag slot
    owner -> caller   header int64 [status, slot, nbytes, 0]   tag slot
    owner -> caller   packed response (or error text)          tag slot

``slot`` is unique among a caller's requests in flight and encodes the
caller's rank, so answers to several threads of one caller (a trainer and its
prefetcher) never cross, nor does a rank's caller share a slot with the
requests its own server receives from the same peer. The serving
thread waits on ``recv`` from any source; the group's timeout is long (a
server may idle for a whole epoch when a cache serves everything), while
every *caller* waits at most the run's timeout for its answer.
"""

from __future__ import annotations

import itertools
import threading
from collections.abc import Mapping, Sequence
from datetime import timedelta

import torch
import torch.distributed as dist

from graphwire.comm.base import TransportError
from graphwire.comm.dist import TorchTransport
from graphwire.comm.service import HEADER_BYTES, Handler, Service
from graphwire.comm.wire import pack, unpack

__all__ = ["TorchService"]

_REQUEST_TAG = 0
_STOP = -1
_OK = 0
_ERROR = -2
_IDLE_TIMEOUT = timedelta(days=7)


class TorchService(Service):
    """Collective constructor: every rank makes its service at the same point."""

    def __init__(
        self, transport: TorchTransport, name: str, handlers: Mapping[str, Handler]
    ) -> None:
        super().__init__(transport, name, handlers)
        self._timeout = timedelta(seconds=transport.ctx.timeout_s)
        self._group = dist.new_group(backend="gloo", timeout=_IDLE_TIMEOUT)
        self._slots = itertools.count(1)
        self._slot_lock = threading.Lock()
        self._server_error: BaseException | None = None
        self._closed = False
        self._thread = threading.Thread(
            target=self._serve, name=f"{name}-server-{self.rank}", daemon=True
        )
        if self.world_size > 1:
            self._thread.start()

    # ---------------------------------------------------------------- client
    def _call(
        self, requests: Mapping[int, Sequence[torch.Tensor]], kind: str
    ) -> dict[int, list[torch.Tensor]]:
        if self._closed:
            raise TransportError(f"rank {self.rank}: service {self.name} is closed")
        code = self.kinds.index(kind)
        tag = self.tag(kind)
        pending = []
        for peer, tensors in requests.items():
            slot = self._next_slot()
            message = pack(tensors)
            header = torch.tensor([code, slot, message.numel(), 0], dtype=torch.int64)
            reply = torch.empty(4, dtype=torch.int64)
            try:
                works = [
                    dist.isend(header, peer, group=self._group, tag=_REQUEST_TAG),
                    dist.isend(message, peer, group=self._group, tag=slot),
                ]
                answer = dist.irecv(reply, peer, group=self._group, tag=slot)
            except RuntimeError as error:
                raise self._fail(peer, kind, str(error)) from error
            self.transport.ledger.record_send(
                peer, f"{tag}.req", HEADER_BYTES + message.numel()
            )
            pending.append((peer, slot, works, answer, reply))
        out: dict[int, list[torch.Tensor]] = {}
        for peer, slot, works, answer, reply in pending:
            for work in works:
                self._wait(work, peer, kind)
            self._wait(answer, peer, kind)
            status, nbytes = int(reply[0]), int(reply[2])
            payload = torch.empty(nbytes, dtype=torch.uint8)
            try:
                work = dist.irecv(payload, peer, group=self._group, tag=slot)
            except RuntimeError as error:
                raise self._fail(peer, kind, str(error)) from error
            self._wait(work, peer, kind)
            self.transport.ledger.record_recv(peer, tag, HEADER_BYTES + nbytes)
            if status == _ERROR:
                text = bytes(payload.tolist()).decode("utf-8", "replace")
                raise self._fail(peer, kind, f"its handler raised: {text}")
            out[peer] = unpack(payload)
        return out

    def _next_slot(self) -> int:
        """A slot no other request in flight uses, this rank's own: a rank
        both calls and serves a peer, and its caller's receives must never
        match the peer's requests to its server."""
        with self._slot_lock:
            count = next(self._slots) % (1 << 20)
        return count * self.world_size + self.rank + 1

    def _wait(self, work: dist.Work | None, peer: int, kind: str) -> None:
        if work is None:  # not a member of the group: cannot happen here
            raise self._fail(peer, kind, "no work handle")
        try:
            with self.transport.waiting(
                f"{self.tag(kind)} request to rank {peer}", self.tag(kind), [peer]
            ):
                done = work.wait(timeout=self._timeout)
        except RuntimeError as error:
            raise self._fail(peer, kind, str(error)) from error
        if done is False:
            raise self._fail(peer, kind, f"no answer within {self._timeout}")

    # ---------------------------------------------------------------- server
    def _serve(self) -> None:
        header = torch.empty(4, dtype=torch.int64)
        try:
            while True:
                src = dist.recv(header, None, group=self._group, tag=_REQUEST_TAG)
                code, slot, nbytes = (int(v) for v in header[:3])
                if code == _STOP:
                    return
                request = torch.empty(nbytes, dtype=torch.uint8)
                dist.recv(request, src, group=self._group, tag=slot)
                kind = self.kinds[code]
                tag = self.tag(kind)
                self.transport.ledger.record_recv(
                    src, f"{tag}.req", HEADER_BYTES + nbytes
                )
                try:
                    response = pack(self._answer(src, kind, unpack(request)))
                    status = _OK
                except Exception as error:  # answered to the caller, not raised
                    text = f"{type(error).__name__}: {error}"
                    response = torch.tensor(list(text.encode()), dtype=torch.uint8)
                    status = _ERROR
                reply = torch.tensor(
                    [status, slot, response.numel(), 0], dtype=torch.int64
                )
                dist.send(reply, src, group=self._group, tag=slot)
                dist.send(response, src, group=self._group, tag=slot)
                self.transport.ledger.record_send(
                    src, tag, HEADER_BYTES + response.numel()
                )
        except BaseException as error:  # a peer died or the group was torn down
            self._server_error = error

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        if self.world_size > 1:
            self.transport.barrier()  # no rank sends another request
            stop = torch.tensor([_STOP, 0, 0, 0], dtype=torch.int64)
            dist.send(
                stop,
                (self.rank + 1) % self.world_size,
                group=self._group,
                tag=_REQUEST_TAG,
            )
            self._thread.join(timeout=self._timeout.total_seconds())
        dist.destroy_process_group(self._group)
