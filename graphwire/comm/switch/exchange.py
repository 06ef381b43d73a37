"""One pass of rows through the switch: the worker's side of SwitchGNN's protocol.

A pass sums, for every destination row a worker owns, the rows of its
remote sources (a forward layer), or, reversed, the gradients of the rows
that read each source (its backward). It runs block by block
(SwitchGNN §3.3): per block a worker

1. sends the rows it uploads, in the block's send order (GAMR or random),
   a window of frames at a time; the window halves on an ECN mark and grows
   by one frame per clean poll (DCQCN-like: multiplicative decrease,
   additive increase);
2. collects, per destination it owns, the switch's RESULT (a sum and the
   number of rows in it) and any RAW rows (overflowed, resent or fetched),
   with a **reception bitmap** per (source, destination) pair so that no
   row is added twice; RAW rows are **cached** for the block, and a fetch
   first looks there;
3. multicasts an ACK for each finished destination through the switch; its
   own sent pairs are done when their destinations' ACKs are back (the
   **sending/ACK bitmap**);
4. says SENT after its last row; when the switch has every worker's, it
   multicasts SENT, behind every result it could give without recovery:
   the worker then **fetches** what its unfinished destinations lack at
   once (the switch drops their partial sums, puts them in bypass and asks
   the sources' owners to resend); as a fallback, after no progress for
   ``timeout_s`` since then (doubled at each timeout within the block,
   TCP's backoff), it fetches again, and after twice that **resends**
   (RESEND) its own unacknowledged pairs;
5. says DONE when its destinations are finished and its pairs acknowledged,
   and starts the next block on the switch's COMPLETE multicast.

Rows of a source ``u`` reach a destination ``v`` once, by exactly one of:
the aggregate (``count`` rows), or a RAW row per pair. A destination in
bypass (it fetched, or a RAW row came marked BYPASS) counts RAW rows only.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import numpy as np

from graphwire.comm.switch.core import run_starts
from graphwire.comm.switch.frames import (
    BACKWARD,
    BYPASS,
    ECN,
    PACKET_BYTES,
    RESEND,
    Frame,
    Kind,
)
from graphwire.comm.switch.link import SwitchError, SwitchLink

__all__ = ["BlockView", "PassCounters", "block_views", "run_pass"]

_MAX_WINDOW = 64


@dataclass(frozen=True)
class BlockView:
    """One worker's part of one block, in one direction.

    Attributes:
        up_gid: int64 [U], the rows it uploads, in send order.
        up_row: int64 [U], their owned (local) rows.
        s_src, s_dst: int64 [S], its pairs as a sender (``s_src`` its own).
        s_ack: int64 [S], each pair's position in ``ack_dst``.
        ack_dst: int64 [K], sorted destinations its pairs wait on.
        d_gid: int64 [D], sorted destinations it owns in the block.
        d_row: int64 [D], their owned rows.
        expected: int64 [D], rows each destination sums.
        r_key: int64 [R], sorted keys ``src * num_nodes + dst`` of its pairs as
            a receiver; ``r_src``, ``r_dest`` (index into ``d_gid``) aligned.
        num_nodes: the graph's nodes (the keys' base).
        base: this worker's first global ID (owned row = ID - base).
    """

    up_gid: np.ndarray
    up_row: np.ndarray
    s_src: np.ndarray
    s_dst: np.ndarray
    s_ack: np.ndarray
    ack_dst: np.ndarray
    d_gid: np.ndarray
    d_row: np.ndarray
    expected: np.ndarray
    r_key: np.ndarray
    r_src: np.ndarray
    r_dest: np.ndarray
    num_nodes: int
    base: int

    @property
    def idle(self) -> bool:
        """Whether this worker neither sends nor receives in the block."""
        return self.up_gid.size == 0 and self.d_gid.size == 0


def block_views(
    src: np.ndarray,
    dst: np.ndarray,
    blocks: list[np.ndarray],
    orders: list[np.ndarray],
    offsets: np.ndarray,
    rank: int,
    *,
    backward: bool,
) -> list[BlockView]:
    """This worker's :class:`BlockView` of every block.

    Args:
        src, dst: int64 [E], the plan's edges ``src -> dst`` (global IDs).
        blocks: edge indices of each block.
        orders: each block's vertices in send order.
        offsets: int64 [world + 1], each worker's global ID range.
        rank: this worker.
        backward: the reversed direction (gradients of ``dst`` summed into
            ``src``).
    """
    base, end = int(offsets[rank]), int(offsets[rank + 1])
    num_nodes = int(offsets[-1])
    views = []
    for edges, order in zip(blocks, orders, strict=True):
        u, v = (dst[edges], src[edges]) if backward else (src[edges], dst[edges])
        mine = (u >= base) & (u < end)
        s_src, s_dst = u[mine], v[mine]
        ups = np.unique(s_src)
        by_id = np.argsort(order, kind="stable")
        position = by_id[np.searchsorted(order[by_id], ups)]  # in the send order
        up_gid = ups[np.argsort(position, kind="stable")]
        ack_dst = np.unique(s_dst)
        owned = (v >= base) & (v < end)
        r_src, r_dst = u[owned], v[owned]
        d_gid, r_dest, expected = np.unique(
            r_dst, return_inverse=True, return_counts=True
        )
        key = r_src * num_nodes + r_dst
        by_key = np.argsort(key, kind="stable")
        views.append(
            BlockView(
                up_gid.astype(np.int64),
                up_gid.astype(np.int64) - base,
                s_src,
                s_dst,
                np.searchsorted(ack_dst, s_dst),
                ack_dst,
                d_gid,
                d_gid - base,
                expected,
                key[by_key],
                r_src[by_key],
                r_dest.reshape(-1)[by_key],
                num_nodes,
                base,
            )
        )
    return views


@dataclass
class PassCounters:
    """What a worker's passes cost it beyond the rows (summed over passes)."""

    retransmitted: int = 0  # rows resent (RESEND): fetched or unacknowledged
    fetched: int = 0  # pairs this worker fetched after a timeout
    cache_hits: int = 0  # fetches answered from the block's RAW-row cache
    timeouts: int = 0
    ecn: int = 0  # ECN-marked frames received
    stale: int = 0  # frames of a finished block, ignored
    blocks: dict[str, int] = field(default_factory=dict)

    def as_dict(self) -> dict[str, object]:
        return {
            "retransmitted": self.retransmitted,
            "fetched": self.fetched,
            "cache_hits": self.cache_hits,
            "timeouts": self.timeouts,
            "ecn": self.ecn,
            "stale": self.stale,
            "blocks": dict(self.blocks),
        }


def run_pass(
    link: SwitchLink,
    views: list[BlockView],
    x: np.ndarray,
    *,
    plan: int,
    seq: int,
    backward: bool,
    timeout_s: float,
    counters: PassCounters,
) -> np.ndarray:
    """Sum every owned destination's remote rows through the switch.

    Args:
        link: the connection to the switch.
        views: this worker's part of each block (:func:`block_views`).
        x: float32 [n_owned, F], the owned rows (pre-scaled).
        plan: the plan's ID at the switch.
        seq: the pass's number (the same on every worker).
        backward: the plan's reversed direction.
        timeout_s: no progress for this long starts recovery.
        counters: where the pass adds its retransmissions and the like.

    Returns:
        float32 [n_owned, F]: the sums (zero for rows without remote sources).
    """
    out = np.zeros_like(x)
    for block, view in enumerate(views):
        _BlockRun(
            link, view, x, out, plan, seq, block, backward, timeout_s, counters
        ).run()
    return out


class _BlockRun:
    def __init__(
        self,
        link: SwitchLink,
        view: BlockView,
        x: np.ndarray,
        out: np.ndarray,
        plan: int,
        seq: int,
        block: int,
        backward: bool,
        timeout_s: float,
        counters: PassCounters,
    ) -> None:
        self.link, self.view, self.x, self.out = link, view, x, out
        self.head = (plan, seq, block, BACKWARD if backward else 0)
        self.template = Frame(Kind.DATA, self.head[3], plan, seq=seq, block=block)
        self.timeout_s, self.c = timeout_s, counters
        width = x.shape[1]
        nd = view.d_gid.size
        self.res = np.zeros((nd, width), dtype=np.float32)
        self.has_res = np.zeros(nd, dtype=bool)
        self.res_cnt = np.zeros(nd, dtype=np.int64)
        self.raw = np.zeros((nd, width), dtype=np.float32)
        self.bits = np.zeros(view.r_key.size, dtype=bool)
        self.nbits = np.zeros(nd, dtype=np.int64)
        self.fetch = np.zeros(nd, dtype=bool)
        self.done = np.zeros(nd, dtype=bool)
        self.acked = np.zeros(view.ack_dst.size, dtype=bool)
        self.cache: dict[int, np.ndarray] = {}
        self.all_in = False  # the switch said every worker's rows are in
        per = max(1, PACKET_BYTES // (4 * max(width, 1)))
        self.packets = [slice(i, i + per) for i in range(0, view.up_gid.size, per)]

    def frame(self, kind: int, flags: int = 0, **arrays: np.ndarray) -> Frame:
        """A frame of this block's pass and direction."""
        return self.template.reply(kind, flags, **arrays)

    def run(self) -> None:
        link, view = self.link, self.view
        sent, window = 0, 4
        done_sent = complete = False
        if not self.packets:
            link.send(self.frame(Kind.SENT))
        last_progress = last_frame = time.monotonic()
        resent_at = last_progress
        rto = self.timeout_s  # doubles at each timeout of the block (backoff)
        while not complete:
            if sent < len(self.packets) and link.pending < window * PACKET_BYTES:
                for part in self.packets[sent : sent + window]:
                    rows = self.x[view.up_row[part]]
                    link.send(self.frame(Kind.DATA, ids1=view.up_gid[part], rows=rows))
                sent = min(len(self.packets), sent + window)
                if sent == len(self.packets):
                    link.send(self.frame(Kind.SENT))
            more = sent < len(self.packets)
            # (select wakes on a writable socket too: no spinning while a
            # shaped link drains what is queued)
            frames = link.poll(min(0.05, rto / 4))
            now = time.monotonic()
            marked = False
            for at, frame in enumerate(frames):
                last_frame = now
                if (frame.plan, frame.seq, frame.block) != self.head[:3]:
                    self.c.stale += 1
                    continue
                marked |= bool(frame.flags & ECN)
                last_progress = now
                if self.on_frame(frame):
                    # What follows COMPLETE is the next block's: kept for it.
                    link.unread(frames[at + 1 :])
                    complete = True
                    break
            if marked:
                self.c.ecn += 1
                window = max(1, window // 2)
            elif frames:
                window = min(_MAX_WINDOW, window + 1)
            if not done_sent and not more and self.done.all() and self.acked.all():
                link.send(self.frame(Kind.DONE))
                done_sent = True
            if complete and not done_sent:
                raise SwitchError(
                    "the switch completed a block this worker had not finished"
                )
            if now - last_frame > link.timeout_s:
                raise SwitchError(
                    f"no frame from the switch at {link.address} in "
                    f"{link.timeout_s:g}s (block {self.head[2]} of pass "
                    f"{self.head[1]})"
                )
            if not self.all_in:
                resent_at = now  # the timers start when every row is in
                continue
            if done_sent or now - last_progress < rto:
                continue
            self.c.timeouts += 1
            resend = now - resent_at >= 2 * rto
            self.recover(resend=resend)
            if resend:
                resent_at = now
            last_progress = now
            # A worker held up (a shared CPU, a slow peer) is no loss: each
            # timeout doubles the next, so stalls do not breed fetch storms.
            rto *= 2

    # ---------------------------------------------------------------- frames
    def on_frame(self, frame: Frame) -> bool:
        """Handle one frame of this block; True on COMPLETE."""
        kind = frame.kind
        if kind == Kind.RESULT:
            self.on_result(frame)
        elif kind == Kind.RAW:
            self.on_raw(frame)
        elif kind == Kind.ACK:
            at = np.searchsorted(self.view.ack_dst, frame.ids1)
            self.acked[at] = True
        elif kind == Kind.FETCH:
            self.resend(frame.ids1, frame.ids2)
        elif kind == Kind.SENT:
            # Every worker's rows are in, and every result that needed no
            # recovery came before this: what is missing was lost.
            self.all_in = True
            todo = np.flatnonzero(~self.done)
            if todo.size:
                self.start_fetch(todo)
        elif kind == Kind.COMPLETE:
            return True
        else:
            raise SwitchError(f"unexpected {frame.name} frame from the switch")
        return False

    def _dests(self, ids: np.ndarray) -> np.ndarray:
        at = np.searchsorted(self.view.d_gid, ids)
        d = self.view.d_gid
        if ids.size and (at.max() >= d.size or (d[at] != ids).any()):
            raise SwitchError(
                "the switch sent rows for a destination this worker lacks"
            )
        return at

    def on_result(self, frame: Frame) -> None:
        at = self._dests(frame.ids1)
        take = ~self.done[at] & ~self.fetch[at] & ~self.has_res[at]
        at = at[take]
        self.res[at] = frame.rows[take]
        self.res_cnt[at] = frame.ids2[take]
        self.has_res[at] = True
        self.finish(at)

    def on_raw(self, frame: Frame) -> None:
        view = self.view
        keys = frame.ids1 * view.num_nodes + frame.ids2
        at = np.searchsorted(view.r_key, keys)
        if keys.size and (
            at.max() >= view.r_key.size or (view.r_key[at] != keys).any()
        ):
            raise SwitchError(
                "the switch forwarded a pair this worker does not receive"
            )
        # A row per pair (overflow), or per run of pairs of one source.
        one_each = frame.rows.shape[0] == frame.ids1.size
        rows = frame.rows if one_each else frame.rows[run_starts(frame.ids1)]
        for gid, row in zip(frame.ids1.tolist(), rows, strict=True):
            self.cache.setdefault(gid, row)
        self.add_pairs(at, rows)
        if frame.flags & BYPASS:
            dests = np.unique(view.r_dest[at])
            dests = dests[~self.done[dests] & ~self.fetch[dests]]
            if dests.size:
                self.start_fetch(dests)

    def add_pairs(self, at: np.ndarray, rows: np.ndarray) -> None:
        """Add the rows of receiving pairs ``at`` not yet counted."""
        _, first = np.unique(at, return_index=True)
        at, rows = at[first], rows[first]
        dest = self.view.r_dest[at]
        new = ~self.bits[at] & ~self.done[dest]
        at, rows, dest = at[new], rows[new], dest[new]
        self.bits[at] = True
        np.add.at(self.raw, dest, rows)
        np.add.at(self.nbits, dest, 1)
        self.finish(np.unique(dest))

    def finish(self, at: np.ndarray) -> None:
        """Finish the destinations among ``at`` that have every row; ACK them."""
        at = at[~self.done[at]]
        expected = self.view.expected[at]
        nbits = self.nbits[at]
        by_result = self.has_res[at] & ~self.fetch[at]
        ok = (nbits == expected) | (by_result & (self.res_cnt[at] + nbits == expected))
        at, by_result = at[ok], by_result[ok]
        if at.size == 0:
            return
        total = self.raw[at]
        total[by_result] += self.res[at[by_result]]
        self.out[self.view.d_row[at]] += total  # (a row may be in several blocks)
        self.done[at] = True
        self.link.send(self.frame(Kind.ACK, ids1=self.view.d_gid[at]))

    # -------------------------------------------------------------- recovery
    def start_fetch(self, dests: np.ndarray) -> None:
        """Put ``dests`` in bypass: fetch the pairs they lack (the cache first)."""
        view = self.view
        self.fetch[dests] = True
        want = np.zeros(view.d_gid.size, dtype=bool)
        want[dests] = True
        missing = np.flatnonzero(want[view.r_dest] & ~self.bits)
        cached = np.array(
            [int(view.r_src[p]) in self.cache for p in missing.tolist()], dtype=bool
        )
        if cached.any():
            hit = missing[cached]
            rows = np.stack([self.cache[int(view.r_src[p])] for p in hit.tolist()])
            self.c.cache_hits += int(hit.size)
            self.add_pairs(hit, rows)
            missing = missing[~cached]
        missing = missing[~self.done[view.r_dest[missing]]]
        if missing.size:
            self.c.fetched += int(missing.size)
            dst = view.d_gid[view.r_dest[missing]]
            self.link.send(self.frame(Kind.FETCH, ids1=view.r_src[missing], ids2=dst))

    def resend(self, src: np.ndarray, dst: np.ndarray) -> None:
        """RESEND pairs ``src -> dst`` of this worker's rows (a fetch's answer,
        or unacknowledged pairs)."""
        if src.size == 0:
            return
        order = np.lexsort((dst, src))
        src, dst = src[order], dst[order]
        runs = run_starts(src)
        first = np.flatnonzero(np.r_[True, runs[1:] != runs[:-1]])
        rows = self.x[src[first] - self.view.base]
        self.c.retransmitted += int(src.size)
        self.link.send(self.frame(Kind.DATA, RESEND, ids1=src, ids2=dst, rows=rows))

    def recover(self, *, resend: bool) -> None:
        """No progress for a timeout: fetch, and maybe resend unacknowledged pairs."""
        todo = np.flatnonzero(~self.done)
        if todo.size:
            self.start_fetch(todo)
        if resend:
            waiting = ~self.acked[self.view.s_ack]
            self.resend(self.view.s_src[waiting], self.view.s_dst[waiting])
