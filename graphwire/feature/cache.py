"""RapidGNN's feature path: a double-buffered hot-node cache, and batch assembly.

:class:`HotCache` holds the features of ``n_hot`` remote nodes in one of two
preallocated buffers ``[n_hot, F]``:

- the *steady* buffer serves lookups during an epoch;
- the *next* epoch's hot set is built into the other buffer by a background
  thread (rows already in the steady buffer are copied, the rest pulled from
  their owners in one request per owner, ledger tag ``kv.cache``); when the
  hot set is smaller than ``n_hot``, the free slots keep rows of the steady
  buffer, so rows leave the cache only when the space is needed;
- :meth:`HotCache.swap` makes the next buffer steady at the epoch boundary,
  and only once it is complete: if the build is still running, the swap (and
  any lookup for that epoch, such as the prefetcher's when it runs ahead)
  waits for it; the counter ``swap_waits`` says how often that happened;
- :meth:`HotCache.close` ends every such wait (with an error): a prefetcher
  more than an epoch ahead waits for a buffer that is built only when the
  trainer starts the epoch before, which after an early stop it never does.

The prefetcher that serves batches from this cache is
:class:`graphwire.feature.prefetch.Prefetcher`.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass

import torch

from graphwire.comm.base import TransportError
from graphwire.feature.base import FeatureStore

__all__ = ["HotCache", "assemble_inputs", "from_thread"]


@dataclass
class _Buffer:
    ids: torch.Tensor  # int64 [k <= n_hot], sorted
    rows: torch.Tensor  # float32 [n_hot, F]; rows[:k] hold ids' features
    epoch: int = -1  # the epoch whose hot set this is (-1: none)
    complete: bool = False  # False while it is (re)built


class HotCache:
    """Two buffers of ``n_hot`` feature rows, one per epoch's hot set.

    The buffer of epoch ``e`` serves every lookup for a batch of epoch ``e``
    (the trainer's, and the prefetcher's when it runs ahead into the next
    epoch), so what a batch finds in the cache depends on the schedule only,
    never on timing.

    Args:
        store: where rows come from (remote rows with ``kind="cache"``).
        n_hot: rows per buffer, at most ``store.num_nodes`` (a buffer holds
            distinct nodes; a larger value is cut to that, and ``n_hot`` is
            the value used).
    """

    def __init__(self, store: FeatureStore, n_hot: int) -> None:
        if n_hot < 0:
            raise ValueError(f"n_hot: expected >= 0, got {n_hot}")
        self.store = store
        self.n_hot = min(n_hot, store.num_nodes)
        empty = torch.empty(0, dtype=torch.int64)
        self._buffers = [
            _Buffer(empty, torch.zeros(self.n_hot, store.dim)),
            _Buffer(empty, torch.zeros(self.n_hot, store.dim)),
        ]
        self._cond = threading.Condition()
        self._builder: threading.Thread | None = None
        self._build_error: BaseException | None = None
        self._closed = False
        self._nbytes: int | None = None  # set by free()
        self.epoch = -1  # the steady buffer's epoch
        self.counters = {
            "swaps": 0,
            "swap_waits": 0,
            "copied_rows": 0,
            "filled_rows": 0,
        }

    @property
    def nbytes(self) -> int:
        """Bytes of both buffers' rows (once :meth:`free` ran, what they took)."""
        if self._nbytes is not None:
            return self._nbytes
        return sum(b.rows.numel() * b.rows.element_size() for b in self._buffers)

    def fill(self, epoch: int, hot_ids: torch.Tensor) -> None:
        """Build ``epoch``'s buffer now, in this thread, and make it steady."""
        self.build(epoch, hot_ids, background=False)
        self.swap(epoch)

    def build(self, epoch: int, hot_ids: torch.Tensor, background: bool = True) -> None:
        """Build ``epoch``'s buffer from its ranked hot IDs, in the non-steady buffer.

        The buffer holds the first ``n_hot`` distinct hot IDs (a repeat keeps
        its first rank); rows the steady buffer holds are copied, the others
        pulled (one request per owner).

        Args:
            epoch: the epoch whose lookups the buffer serves; not the steady
                buffer's (two buffers of one epoch would leave lookups to
                serve the old one).
            hot_ids: int [k], node IDs, most wanted first.

        Raises:
            ValueError: a negative or the steady epoch, or ``hot_ids`` not 1-D.
        """
        if epoch < 0:
            raise ValueError(f"cache: build: epoch must be >= 0, got {epoch}")
        if epoch == self.epoch:
            raise ValueError(
                f"cache: build({epoch}): epoch {epoch}'s buffer is the steady "
                "one; a buffer is built once per epoch"
            )
        if hot_ids.dim() != 1:
            raise ValueError(
                f"cache: hot_ids: expected a 1-D tensor of node IDs, found shape "
                f"{tuple(hot_ids.shape)}"
            )
        self._join_builder()
        ids = torch.sort(_first_distinct(hot_ids.to(torch.int64), self.n_hot)).values
        with self._cond:
            steady = self._find(self.epoch)
            target = (
                self._buffers[1] if steady is self._buffers[0] else self._buffers[0]
            )
            target.epoch, target.complete = epoch, False

        def work() -> None:
            self._build(target, steady, ids)

        if background:
            self._builder = threading.Thread(target=work, name="hot-cache", daemon=True)
            self._builder.start()
        else:
            work()
            self._raise_build_error()

    def _build(
        self, target: _Buffer, source: _Buffer | None, ids: torch.Tensor
    ) -> None:
        try:
            ids = _with_retained(ids, source, self.n_hot)
            rows = target.rows[: ids.numel()]
            hit = torch.zeros(ids.numel(), dtype=torch.bool)
            if source is not None and source.ids.numel():
                hit, found = _search(source, ids)
                rows[hit] = found
            missing = ids[~hit]
            if missing.numel():
                rows[~hit] = self.store.pull(missing, kind="cache")
            self.counters["copied_rows"] += int(hit.sum())
            self.counters["filled_rows"] += missing.numel()
            with self._cond:
                target.ids, target.complete = ids, True
                self._cond.notify_all()
        except BaseException as error:  # re-raised by swap / lookup
            with self._cond:
                self._build_error = error
                self._cond.notify_all()

    def swap(self, epoch: int) -> None:
        """Make ``epoch``'s buffer steady, waiting until it is complete.

        The trainer calls this at the epoch boundary, before the next build.

        Raises:
            ValueError: no buffer holds ``epoch`` or is being built for it.
        """
        with self._cond:
            if self._find(epoch) is None:
                raise ValueError(
                    f"cache: swap({epoch}): no buffer holds epoch {epoch} or is "
                    f"being built for it; build({epoch}, hot_ids) first"
                )
        self._wait_complete(epoch)
        with self._cond:
            self.epoch = epoch
        self.counters["swaps"] += 1

    def lookup(
        self, nid: torch.Tensor, epoch: int | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """``(hit bool [n], rows [hits, F])`` of ``nid`` in ``epoch``'s buffer.

        ``epoch`` defaults to the steady buffer's. Waits until the buffer is
        complete (also for an epoch whose build has not started yet).

        Raises:
            RuntimeError: nothing was filled or built yet, so no buffer will
                ever serve the lookup (raised at once, never waited for).
        """
        with self._cond:
            wanted = self.epoch if epoch is None else epoch
            if wanted < 0 or all(b.epoch < 0 for b in self._buffers):
                what = "the steady buffer" if epoch is None else f"epoch {epoch}"
                raise RuntimeError(
                    f"cache: lookup in {what} before any fill(): no buffer is "
                    "built or being built"
                )
        buffer = self._wait_complete(wanted)
        return _search(buffer, nid)

    def wait_built(self) -> None:
        """Block until a background build (if any) has finished."""
        self._join_builder()

    def free(self) -> None:
        """Let go of both buffers' rows (after :meth:`close` and
        :meth:`wait_built`): the cache serves nothing more; ``nbytes`` keeps
        what they took."""
        with self._cond:
            self._nbytes = self.nbytes
            empty = torch.empty(0, dtype=torch.int64)
            for buffer in self._buffers:
                buffer.ids, buffer.rows = empty, buffer.rows[:0].clone()
                buffer.epoch, buffer.complete = -1, False

    def close(self) -> None:
        """Serve no more lookups or swaps.

        Those waiting for a buffer (and any later ones) raise RuntimeError. A
        background build goes on to its end (:meth:`wait_built`)."""
        with self._cond:
            self._closed = True
            self._cond.notify_all()

    # ------------------------------------------------------------- helpers
    def _find(self, epoch: int) -> _Buffer | None:
        for buffer in self._buffers:
            if buffer.epoch == epoch and epoch >= 0:
                return buffer
        return None

    def _wait_complete(self, epoch: int) -> _Buffer:
        """Wait, with no deadline of its own, until ``epoch``'s buffer is
        complete. Every way the wait can end notifies: a build completes or
        fails (its pulls have the transport's timeout), or :meth:`close`,
        which the trainer calls whatever ends its run. A prefetcher Q batches
        ahead looks up epoch e+2 while the trainer still evaluates epoch e,
        before e+1's build starts: that wait is as long as the evaluation and
        checkpoint take, so no fixed deadline fits it."""
        waited = False
        with self._cond:
            while True:
                if self._closed:
                    raise RuntimeError(
                        f"cache: closed, so epoch {epoch}'s buffer is not served"
                    )
                self._raise_build_error()
                buffer = self._find(epoch)
                if buffer is not None and buffer.complete:
                    break
                waited = True
                self._cond.wait()
            if waited:  # under the lock: the trainer and prefetcher both count
                self.counters["swap_waits"] += 1
        return buffer

    def _join_builder(self) -> None:
        if self._builder is not None:
            self._builder.join()
            self._builder = None
        self._raise_build_error()

    def _raise_build_error(self) -> None:
        if self._build_error is not None:
            error = self._build_error
            raise from_thread("cache: building a buffer failed", error)


def _first_distinct(ranked: torch.Tensor, n: int) -> torch.Tensor:
    """The first ``n`` distinct IDs of ``ranked`` (int64 [k]), in the order
    of their first appearance."""
    unique, inverse = torch.unique(ranked, return_inverse=True)
    first = torch.full((unique.numel(),), ranked.numel(), dtype=torch.int64)
    first.scatter_reduce_(0, inverse, torch.arange(ranked.numel()), "amin")
    return unique.index_select(0, torch.argsort(first)[:n])


def _with_retained(
    hot: torch.Tensor, source: _Buffer | None, n_hot: int
) -> torch.Tensor:
    """The IDs a new buffer holds: the epoch's hot set (sorted), then, in the
    slots it leaves free, rows the steady buffer already holds (lowest IDs
    first). Retained rows are copied, never pulled, so a node that drops out
    of one epoch's hot set and comes back later is not fetched again."""
    spare = n_hot - hot.numel()
    if source is None or spare <= 0 or not source.ids.numel():
        return hot
    kept = source.ids[~torch.isin(source.ids, hot)][:spare]
    return torch.sort(torch.cat([hot, kept])).values


def _search(buffer: _Buffer, nid: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    ids = buffer.ids
    if not ids.numel():
        return torch.zeros(nid.numel(), dtype=torch.bool), buffer.rows[:0]
    pos = torch.searchsorted(ids, nid).clamp(max=ids.numel() - 1)
    hit = ids.index_select(0, pos) == nid
    return hit, buffer.rows.index_select(0, pos[hit])


def assemble_inputs(
    store: FeatureStore,
    cache: HotCache | None,
    nid: torch.Tensor,
    local: torch.Tensor,
    kind: str,
    epoch: int | None = None,
    dims: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, int]]:
    """Input features of one batch: cache, then local rows, then pulls for the rest.

    The rest is pulled with one request per owner; with ``dims`` (DGS), only
    those columns of it, the others zero.

    Returns:
        ``(x float32 [len(nid), F], counts)`` with ``cache_hits``,
        ``local_rows`` and ``missed_rows``.
    """
    x = torch.empty(nid.numel(), store.dim)
    remote = ~local
    remote_pos = remote.nonzero().view(-1)
    hits = 0
    if cache is not None and remote_pos.numel():
        hit, rows = cache.lookup(nid[remote_pos], epoch)
        x[remote_pos[hit]] = rows
        hits = int(hit.sum())
        remote_pos = remote_pos[~hit]
    local_pos = local.nonzero().view(-1)
    x[local_pos] = store.pull(nid[local_pos], kind=kind)
    if remote_pos.numel() and dims is None:
        x[remote_pos] = store.pull(nid[remote_pos], kind=kind)
    elif remote_pos.numel():
        rows = torch.zeros(remote_pos.numel(), store.dim)
        rows[:, dims] = store.pull(nid[remote_pos], dims, kind=kind)
        x[remote_pos] = rows
    counts = {
        "cache_hits": hits,
        "local_rows": local_pos.numel(),
        "missed_rows": remote_pos.numel(),
    }
    return x, counts


def from_thread(what: str, error: BaseException) -> Exception:
    """The error a background thread met, to raise on the trainer's thread.

    A :class:`TransportError` stays one (a peer died or hung: the launcher
    blames that peer, not this rank), anything else is a RuntimeError."""
    kind = TransportError if isinstance(error, TransportError) else RuntimeError
    raised = kind(f"{what}: {error}")
    raised.__cause__ = error
    return raised
