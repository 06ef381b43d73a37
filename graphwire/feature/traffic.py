"""One rank's traffic in windows that tile its run: set-up, epochs, teardown.

A rank's ledger counts every byte it sends and receives from the moment its
transport opens, and its feature store every row it pulls from another rank.
:class:`TrafficWindows` cuts both into consecutive windows, each starting
where the one before ended:

- ``setup``, up to the start of the first epoch this process trains: loading
  the part, the set-up collectives, rapid's presampling (``sample.hop``) and
  first hot-cache fill (``kv.cache``), what the prefetcher fetched by then;
- one per epoch, to the end of its evaluation (the barriers of a checkpoint,
  saved after the epoch's record, count in the next window);
- ``teardown``: closing the services, and what a background thread finished
  after the last epoch (the next epoch's cache build, after an early stop).

Every byte and row falls in exactly one window, so the windows add up to the
run's totals: the ledger's ``bytes_sent`` and ``bytes_recv``, the feature
traffic (:func:`fetch_traffic`) and the store's remote rows
(:func:`fetched_rows`). Traffic counts when it moves: rows the prefetcher or
the cache builder fetched ahead of the trainer count in the window that
fetched them (a batch's cache hits and misses, in the epoch that trains on
it), and the answers a rank served its peers in the window it was in then.

A window, as :meth:`TrafficWindows.cut` returns it::

    comm             {bytes_sent, bytes_recv, by_tag, by_peer} (by_*: sends)
    remote_rows      int: rows pulled from other ranks (pull, prefetch, cache)
    remote_bytes     int: ``kv.<kind>.req`` requests sent and ``kv.<kind>``
                     answers received, ``kind`` in :data:`FETCH_KINDS`
    remote_messages  int: those requests and answers

Labels (``kv.labels``) and embedding traffic (``kv.emb.*``) are in ``comm``
only: the three ``remote_*`` counters are the input-feature fetches.
"""

from __future__ import annotations

from typing import Any

from graphwire.comm.base import Transport
from graphwire.comm.ledger import LedgerWindows
from graphwire.feature.base import FeatureStore
from graphwire.feature.dist import SERVICE

__all__ = ["FETCH_KINDS", "TrafficWindows", "fetch_traffic", "fetched_rows"]

# The store's pull kinds that fetch input features (labels are not counted).
FETCH_KINDS = ("pull", "prefetch", "cache")


_ANSWER_TAGS = frozenset(f"{SERVICE}.{kind}" for kind in FETCH_KINDS)
_REQUEST_TAGS = frozenset(f"{tag}.req" for tag in _ANSWER_TAGS)


def fetch_traffic(snapshot: dict[str, Any]) -> tuple[int, int]:
    """``(bytes, messages)`` of this rank's feature fetches as a client.

    The fetches are those of :data:`FETCH_KINDS`, as :func:`fetched_rows`
    counts their rows: its ``kv.<kind>.req`` requests sent and the
    ``kv.<kind>`` answers it received.
    """
    requests = [r for r in snapshot["sent"] if r[2] in _REQUEST_TAGS]
    answers = [r for r in snapshot["recv"] if r[2] in _ANSWER_TAGS]
    rows = requests + answers
    return sum(r[3] for r in rows), sum(r[4] for r in rows)


def fetched_rows(stats: dict[str, dict[str, Any]]) -> int:
    """Rows a store has pulled from other ranks (:data:`FETCH_KINDS`).

    Read from its :meth:`~graphwire.feature.base.FeatureStore.stats`."""
    return sum(int(stats[kind]["remote_rows"]) for kind in FETCH_KINDS if kind in stats)


class TrafficWindows:
    """Cuts a rank's traffic into consecutive windows (module docstring).

    Args:
        transport: its ledger counts the bytes, from the transport's start.
        store: its counters count the rows, from the store's start.
    """

    def __init__(self, transport: Transport, store: FeatureStore) -> None:
        self.store = store
        self._ledger = LedgerWindows(transport.ledger)
        self._rows = 0

    def cut(self, snapshot: dict[str, Any] | None = None) -> dict[str, Any]:
        """The traffic since the last cut (the first: since the start).

        Args:
            snapshot: the ledger's snapshot now, if the caller has taken it
                (the run's last, which it reports as its totals).
        """
        after = self._ledger.ledger.snapshot() if snapshot is None else snapshot
        rows = fetched_rows(self.store.stats())
        fetched, before = fetch_traffic(after), fetch_traffic(self._ledger.last)
        window = {
            "comm": self._ledger.cut(after),
            "remote_rows": rows - self._rows,
            "remote_bytes": fetched[0] - before[0],
            "remote_messages": fetched[1] - before[1],
        }
        self._rows = rows
        return window
