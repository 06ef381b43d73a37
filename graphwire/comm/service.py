"""`Service`: requests one rank sends another, answered by the owner's thread.

Full-graph exchanges are collective: every rank knows what every other rank
sends and all of them move in step. A mini-batch trainer instead asks a peer
for *some* rows (features of sampled nodes, the neighbours of a frontier) at a
moment only it knows, and the peer must answer whatever it is doing. That is a
request/response service, DistDGL's KV store's shape:

- every rank registers the same handler names (``"pull"``, ``"hop"``, ...) and
  a *serving thread* answers peers' requests with them, one at a time;
- :meth:`Service.call` sends one request to each of several peers at once and
  waits for all the answers (requests to different owners overlap);
- requests and responses are lists of tensors (:func:`~graphwire.comm.wire.pack`):
  no pickling, so a peer cannot make this rank run code.

What crosses the wire for one call to one peer: a 32-byte header and the packed
request, then a 32-byte header and the packed response. The ledger counts each
header-and-payload pair as one message of ``32 + payload`` bytes, under
``"{service}.{handler}.req"`` for the request and ``"{service}.{handler}"``
for the response, on both ranks (the caller's sends are the server's
receives). A handler may be registered under several names so that traffic
with different purposes (``pull``, ``prefetch``, ``cache``) is told apart.

A handler that raises answers with its error message: the caller raises
:class:`~graphwire.comm.base.TransportError` naming the peer and handler, and
the server keeps serving.

:meth:`Service.close` is collective: after a barrier no rank sends more
requests, so each serving thread can be told to stop.
"""

from __future__ import annotations

import threading
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping, Sequence

import torch

from graphwire.comm.base import Transport, TransportError

__all__ = ["HEADER_BYTES", "Handler", "Service"]

Handler = Callable[[int, list[torch.Tensor]], Sequence[torch.Tensor]]
"""``handler(src_rank, request_tensors) -> response_tensors``."""

HEADER_BYTES = 32  # int64 [4]: handler (or status), slot, payload bytes, spare


class Service(ABC):
    """One rank's end of a named request/response service.

    Args:
        transport: the run's transport (its ledger records the traffic).
        name: the service name, the first part of every ledger tag.
        handlers: the same names on every rank.
    """

    def __init__(
        self, transport: Transport, name: str, handlers: Mapping[str, Handler]
    ) -> None:
        if not handlers:
            raise ValueError(f"service {name!r}: no handlers")
        self.transport = transport
        self.rank = transport.rank
        self.world_size = transport.world_size
        self.name = name
        self.kinds = sorted(handlers)
        self.handlers = dict(handlers)
        self._serve_lock = threading.Lock()  # one request served at a time

    def call(
        self, requests: Mapping[int, Sequence[torch.Tensor]], kind: str
    ) -> dict[int, list[torch.Tensor]]:
        """Send ``requests[p]`` to each peer ``p``; wait for every answer.

        Args:
            requests: per peer (never this rank), the request's tensors.
            kind: the handler that answers.

        Returns:
            Each peer's response tensors, by peer.

        Raises:
            TransportError: a peer died, timed out, or its handler failed.
        """
        if kind not in self.handlers:
            raise ValueError(
                f"service {self.name!r}: no handler {kind!r}; known: {self.kinds}"
            )
        for peer in requests:
            if not 0 <= peer < self.world_size or peer == self.rank:
                raise ValueError(
                    f"service {self.name!r}: peer must be another rank in "
                    f"[0, {self.world_size}), got {peer} on rank {self.rank}"
                )
        if not requests:
            return {}
        return self._call(requests, kind)

    @abstractmethod
    def _call(
        self, requests: Mapping[int, Sequence[torch.Tensor]], kind: str
    ) -> dict[int, list[torch.Tensor]]: ...

    @abstractmethod
    def close(self) -> None:
        """Collective: wait until no rank calls any more, stop serving."""

    def _answer(
        self, src: int, kind: str, request: list[torch.Tensor]
    ) -> list[torch.Tensor]:
        """Run the handler for one request (serialised: one at a time)."""
        with self._serve_lock:
            return list(self.handlers[kind](src, request))

    def tag(self, kind: str) -> str:
        return f"{self.name}.{kind}"

    def _fail(self, peer: int, kind: str, problem: str) -> TransportError:
        return TransportError(
            f"rank {self.rank}: {self.name}.{kind} request to rank {peer} "
            f"failed: {problem}"
        )
