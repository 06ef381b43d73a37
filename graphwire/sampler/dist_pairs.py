"""`DistPairSampler`: link prediction's positives and negatives, by owner.

A seed's positive and negatives are drawn from its in-edges, which only its
owner stores (the owner-compute rule, as
:class:`~graphwire.sampler.dist.DistNeighborSampler` samples hops): the
seeds owned here are drawn here, each other owner's with one request
(``pair.pos``, ``pair.neg`` in the ledger: the nodes and the seed out, one
ID per node, or ``k``, back). The draws are hashed
(:mod:`~graphwire.sampler.links`), so they are the same whoever asks.
"""

from __future__ import annotations

import threading
from typing import Any

import torch

from graphwire.comm.base import Transport
from graphwire.partition.book import PartitionBook
from graphwire.sampler.dist import OwnedCSR, owner_groups
from graphwire.sampler.links import SamplingFunctions

__all__ = ["DistPairSampler"]

_TAGS = ("pos", "neg")


class DistPairSampler:
    """Draws positives and negatives of any seeds; every rank makes one.

    Args:
        csr: this rank's owned in-edges (as the sampler stores them).
        book: the partition book.
        transport: the run's transport (opens the service: collective).
        functions: the positive and negative functions, and ``k``.

    Attributes:
        counters: per tag (``pos``, ``neg``), ``remote_rows`` (seeds drawn
            by their owners elsewhere) and ``requests`` (messages to them).
    """

    def __init__(
        self,
        csr: OwnedCSR,
        book: PartitionBook,
        transport: Transport,
        functions: SamplingFunctions,
        *,
        service: str = "pair",
    ) -> None:
        self.csr, self.book, self.functions = csr, book, functions
        self.rank = transport.rank
        self.num_nodes = book.num_nodes
        self.counters = {tag: {"remote_rows": 0, "requests": 0} for tag in _TAGS}
        self._counting = threading.Lock()  # the pool's threads draw at once
        handlers: dict[str, Any] = {"pos": self._answer_pos, "neg": self._answer_neg}
        self.service = transport.open_service(service, handlers)

    @property
    def k(self) -> int:
        return self.functions.k

    def owners(self, nid: torch.Tensor) -> list[tuple[int, torch.Tensor]]:
        """``(owner, positions in nid)``, owners ascending."""
        return owner_groups(self.book, nid)

    # ----------------------------------------------------- one owner's share
    def positive_group(
        self, nid: torch.Tensor, where: torch.Tensor, peer: int, seed: int
    ) -> torch.Tensor:
        """int64 [len(where)]: the positives of ``nid[where]``, all owned by
        ``peer`` (drawn here, or by one request to it)."""
        if peer == self.rank:
            return self.functions.positive(self.csr, nid[where], seed)
        request = [nid[where], torch.tensor([seed])]
        self._count("pos", {peer: where})
        return self.service.call({peer: request}, "pos")[peer][0]

    def negative_group(
        self, nid: torch.Tensor, where: torch.Tensor, peer: int, seed: int
    ) -> torch.Tensor:
        """int64 [len(where), k]: the negatives of ``nid[where]`` (as
        :meth:`positive_group`)."""
        if peer == self.rank:
            return self._negatives(nid[where], seed)
        request = [nid[where], torch.tensor([seed])]
        self._count("neg", {peer: where})
        return self.service.call({peer: request}, "neg")[peer][0]

    # --------------------------------------------------------- all at once
    def positives(self, nid: torch.Tensor, seed: int) -> torch.Tensor:
        """int64 [n]: the positives of ``nid`` (one request per other owner,
        sent together)."""
        return self._all(nid, seed, "pos", torch.empty(nid.numel(), dtype=torch.int64))

    def negatives(self, nid: torch.Tensor, seed: int) -> torch.Tensor:
        """int64 [n, k]: the negatives of ``nid``."""
        out = torch.empty(nid.numel(), self.k, dtype=torch.int64)
        return self._all(nid, seed, "neg", out)

    def _all(
        self, nid: torch.Tensor, seed: int, tag: str, out: torch.Tensor
    ) -> torch.Tensor:
        requests = {}
        for peer, where in self.owners(nid):
            if peer == self.rank:
                out[where] = (
                    self.functions.positive(self.csr, nid[where], seed)
                    if tag == "pos"
                    else self._negatives(nid[where], seed)
                )
            else:
                requests[peer] = where
        if requests:
            self._count(tag, requests)
            answers = self.service.call(
                {p: [nid[w], torch.tensor([seed])] for p, w in requests.items()}, tag
            )
            for peer, where in requests.items():
                out[where] = answers[peer][0]
        return out

    def _count(self, tag: str, requests: dict[int, torch.Tensor]) -> None:
        with self._counting:
            self.counters[tag]["requests"] += len(requests)
            self.counters[tag]["remote_rows"] += sum(
                w.numel() for w in requests.values()
            )

    def close(self) -> None:
        """Collective: stop serving (after every rank's last draw)."""
        self.service.close()

    # ---------------------------------------------------------- the owner
    def _negatives(self, nid: torch.Tensor, seed: int) -> torch.Tensor:
        return self.functions.negative(self.csr, nid, self.k, seed, self.num_nodes)

    def _answer_pos(self, src: int, request: list[torch.Tensor]) -> list[torch.Tensor]:
        del src
        nid, seed = request
        return [self.functions.positive(self.csr, nid, int(seed[0]))]

    def _answer_neg(self, src: int, request: list[torch.Tensor]) -> list[torch.Tensor]:
        del src
        nid, seed = request
        return [self._negatives(nid, int(seed[0]))]
