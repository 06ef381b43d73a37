"""`SwitchCore`: the emulated programmable switch's data plane, without sockets.

It holds what SwitchGNN's P4 program holds (paper §3, §4; digest §2.2–2.8):

- the **match table**, per plan (one per exchanged row width) and block: the
  block's edges ``u -> v``, so that a row of source ``u`` is multicast into
  the aggregators of every destination ``v`` it feeds (backward passes use
  the same table reversed: gradients of ``v`` are summed into ``u``'s);
- an **aggregator pool** of ``mem // (ceil(4F / 128) * 128)`` rows for rows
  of ``F`` floats (128-byte aggregators, ``ceil(4F / 128)`` per row), handed
  out first come first served; each aggregator counts the rows summed into it
  against the destination's expected count;
- **completion**: the sum goes to the destination's owner (RESULT) and the
  aggregator is released;
- **overflow** (no free aggregator): the row is forwarded raw to the
  destination's owner, who sums it on the host (the strawman's behaviour);
- **reliability**: a resent row (RESEND) or a fetch (FETCH) releases the
  destination's aggregator, drops its partial sum and puts the destination
  in bypass: its rows go straight to the owner from then on;
- the **block-complete multicast** once every worker reported the block done;
- the **all-sent multicast** once every worker's rows of the block are in
  (ours: every result that needs no recovery is queued before it, so a
  worker fetches what it still lacks then, without waiting for a timeout
  that cannot tell a lost row from a slow peer);
- seeded **loss** of DATA frames (``--switch-loss``), for the protocol's sake.

ECN marking is the server's (:mod:`.server`): it knows its queues.
:meth:`SwitchCore.handle` takes one frame from a worker and returns the
frames to send, as ``(rank, frame)``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from graphwire.comm.switch.frames import BACKWARD, BYPASS, RESEND, Frame, Kind
from graphwire.comm.switch.stats import sum_stats, zero_stats

__all__ = ["SwitchCore", "SwitchProtocolError", "pool_rows", "run_starts"]

AGGREGATOR_BYTES = 128


def pool_rows(mem_bytes: int, width: int) -> int:
    """Rows of ``width`` floats an aggregator memory of ``mem_bytes`` holds
    (0: unlimited, returned as a huge number)."""
    if mem_bytes <= 0:
        return 1 << 62
    per_row = math.ceil(4 * width / AGGREGATOR_BYTES) * AGGREGATOR_BYTES
    return mem_bytes // per_row


def run_starts(ids: np.ndarray) -> np.ndarray:
    """Index of the run (of equal consecutive values) each entry of ``ids`` is in."""
    if ids.size == 0:
        return np.zeros(0, dtype=np.int64)
    change = np.empty(ids.size, dtype=bool)
    change[0] = False
    np.not_equal(ids[1:], ids[:-1], out=change[1:])
    return np.cumsum(change)


class SwitchProtocolError(RuntimeError):
    """A worker sent something the switch's tables cannot place."""


@dataclass
class _Direction:
    """One block's table in one direction: aggregators per destination."""

    up: np.ndarray  # int64 [U] sorted unique uploading IDs
    indptr: np.ndarray  # int64 [U + 1]: targets of each uploader
    targets: np.ndarray  # int64 [P]: aggregator of each pair
    pair_up: np.ndarray  # int64 [P]: uploader ID of each pair (CSR order)
    agg: np.ndarray  # int64 [A] sorted unique destination IDs
    expected: np.ndarray  # int64 [A]

    @classmethod
    def build(cls, up_ids: np.ndarray, dst_ids: np.ndarray) -> _Direction:
        order = np.lexsort((dst_ids, up_ids))
        u, v = up_ids[order], dst_ids[order]
        up, counts = np.unique(u, return_counts=True)
        indptr = np.zeros(up.size + 1, dtype=np.int64)
        np.cumsum(counts, out=indptr[1:])
        agg, targets, expected = np.unique(v, return_inverse=True, return_counts=True)
        return cls(up, indptr, targets.astype(np.int64), u, agg, expected)


@dataclass
class _Block:
    """A block being aggregated: its table, pool and per-aggregator state."""

    table: _Direction
    pool: np.ndarray  # float32 [slots, F]
    slot: np.ndarray  # int64 [A]: -1 none
    count: np.ndarray  # int64 [A]: rows summed in the switch
    raw: np.ndarray  # int64 [A]: rows forwarded raw (overflow)
    bypass: np.ndarray  # bool [A]
    done: np.ndarray  # bool [A]
    free: list[int]
    done_workers: set[int] = field(default_factory=set)
    sent_workers: set[int] = field(default_factory=set)
    # tracing: per aggregator and worker, the last frame that fed it
    deps: np.ndarray | None = None  # int64 [A, world]


class SwitchCore:
    """The data plane (module docstring).

    Args:
        world_size: number of workers.
        offsets: int64 [world_size + 1], the global ID range each worker owns.
        mem_bytes: aggregator memory (0: unlimited).
        loss: probability of dropping a DATA frame.
        seed: seeds the drops.
    """

    def __init__(
        self,
        world_size: int,
        offsets: list[int],
        mem_bytes: int,
        loss: float = 0.0,
        seed: int = 0,
    ) -> None:
        self.world_size = world_size
        self.offsets = np.asarray(offsets, dtype=np.int64)
        self.mem_bytes = int(mem_bytes)
        self.loss = float(loss)
        self._rng = np.random.default_rng(seed)
        # plan -> (width, number of blocks, {block: (src, dst)})
        self.plans: dict[int, tuple[int, int, dict[int, tuple[np.ndarray, ...]]]] = {}
        self._tables: dict[tuple[int, int, bool], _Direction] = {}
        self._active: dict[tuple[int, int], _Block] = {}  # (seq, block)
        self._finished: dict[int, int] = {}  # seq -> blocks completed
        self._by_seq: dict[int, dict[str, Any]] = {}
        self.stats = zero_stats()  # the counters of the frame in hand
        # Causality for the simulator (the server's trace): the frame in hand
        # is number `number` of its sender's.
        self.causal = False
        self.number = -1
        self.seen = np.full(world_size, -1, dtype=np.int64)  # last frame each

    # ------------------------------------------------------------ accounting
    def stats_for(self, seq: int) -> dict[str, Any]:
        """The counters of pass ``seq`` (created empty)."""
        stats = self._by_seq.get(seq)
        if stats is None:
            stats = self._by_seq[seq] = zero_stats()
        return stats

    def take_stats(self, first: int, end: int) -> dict[str, Any]:
        """The counters of passes ``first..end-1`` summed
        (:func:`~.stats.sum_stats`); every pass before ``end`` is forgotten."""
        total = sum_stats(s for q, s in self._by_seq.items() if first <= q < end)
        for seq in [q for q in self._by_seq if q < end]:
            del self._by_seq[seq]
        return total

    def owner(self, ids: np.ndarray) -> np.ndarray:
        return np.searchsorted(self.offsets, ids, side="right") - 1

    # ----------------------------------------------------------------- frames
    def handle(self, frame: Frame) -> list[tuple[int, Frame]]:
        """Frames to send for one frame from worker ``frame.sender``."""
        self.stats = self.stats_for(frame.seq)
        if frame.kind == Kind.TABLE:
            return self._table(frame)
        if frame.kind in (Kind.DATA, Kind.FETCH, Kind.ACK, Kind.DONE, Kind.SENT):
            block = self._block(frame)
            if block is None:
                self.stats["late_frames"] += 1
                return []
            if frame.kind == Kind.DATA:
                if frame.flags & RESEND:
                    return self._resend(frame, block)
                return self._data(frame, block)
            if frame.kind == Kind.FETCH:
                return self._fetch(frame, block)
            if frame.kind == Kind.ACK:
                return self._ack(frame, block)
            if frame.kind == Kind.SENT:
                return self._sent(frame, block)
            return self._done(frame, block)
        raise SwitchProtocolError(f"unexpected {frame.name} frame from a worker")

    def _table(self, frame: Frame) -> list[tuple[int, Frame]]:
        width, blocks, edges = self.plans.setdefault(
            frame.plan, (frame.rows.shape[1], frame.seq, {})
        )
        if frame.block >= blocks or frame.ids1.size != frame.ids2.size:
            raise SwitchProtocolError(
                f"plan {frame.plan}: bad TABLE frame for block {frame.block} of "
                f"{blocks} ({frame.ids1.size} sources, {frame.ids2.size} "
                "destinations)"
            )
        edges[frame.block] = (frame.ids1.copy(), frame.ids2.copy())
        if len(edges) < blocks:
            return []
        return [(frame.sender, Frame(Kind.READY, plan=frame.plan))]

    def _direction(self, plan: int, block: int, backward: bool) -> _Direction:
        key = (plan, block, backward)
        table = self._tables.get(key)
        if table is None:
            src, dst = self.plans[plan][2][block]
            table = (
                _Direction.build(dst, src) if backward else _Direction.build(src, dst)
            )
            self._tables[key] = table
        return table

    def _block(self, frame: Frame) -> _Block | None:
        """The state of the frame's block; None for a block already complete."""
        key = (frame.seq, frame.block)
        block = self._active.get(key)
        if block is not None:
            return block
        if frame.plan not in self.plans:
            raise SwitchProtocolError(
                f"{frame.name} frame for unknown plan {frame.plan}"
            )
        width, blocks, _ = self.plans[frame.plan]
        if frame.block >= blocks:
            raise SwitchProtocolError(
                f"{frame.name} frame for block {frame.block} of plan "
                f"{frame.plan}, which has {blocks}"
            )
        if frame.block < self._finished.get(frame.seq, 0):
            return None  # a straggling copy of a finished block's frame
        table = self._direction(frame.plan, frame.block, bool(frame.flags & BACKWARD))
        slots = min(pool_rows(self.mem_bytes, width), table.agg.size)
        self.stats["pool_rows"][str(width)] = pool_rows(self.mem_bytes, width)
        n = table.agg.size
        block = _Block(
            table,
            np.zeros((slots, width), dtype=np.float32),
            np.full(n, -1, dtype=np.int64),
            np.zeros(n, dtype=np.int64),
            np.zeros(n, dtype=np.int64),
            np.zeros(n, dtype=bool),
            np.zeros(n, dtype=bool),
            list(range(slots - 1, -1, -1)),
        )
        if self.causal:
            block.deps = np.full((n, self.world_size), -1, dtype=np.int64)
        self._active[key] = block
        return block

    def _agg_of(self, block: _Block, ids: np.ndarray, what: str) -> np.ndarray:
        table = block.table
        at = np.searchsorted(table.agg, ids)
        if ids.size and (at.max() >= table.agg.size or (table.agg[at] != ids).any()):
            raise SwitchProtocolError(f"{what}: destination not in the block's table")
        return at

    def _occupancy(self, block: _Block) -> None:
        used = block.pool.shape[0] - len(block.free)
        self.stats["peak_slots"] = max(self.stats["peak_slots"], used)
        self.stats["occupancy_sum"] += used
        self.stats["occupancy_samples"] += 1

    def _data(self, frame: Frame, block: _Block) -> list[tuple[int, Frame]]:
        rows = frame.rows
        self.stats["rows_in"] += rows.shape[0]
        if self.loss > 0.0 and self._rng.random() < self.loss:
            self.stats["dropped_frames"] += 1
            self.stats["dropped_rows"] += rows.shape[0]
            return []
        table = block.table
        at = np.searchsorted(table.up, frame.ids1)
        if frame.ids1.size and (
            at.max() >= table.up.size or (table.up[at] != frame.ids1).any()
        ):
            raise SwitchProtocolError(
                "DATA: a row that the block's table does not send"
            )
        starts, ends = table.indptr[at], table.indptr[at + 1]
        counts = ends - starts
        pair_row = np.repeat(np.arange(at.size), counts)
        offsets = np.arange(pair_row.size) - np.repeat(
            np.cumsum(counts) - counts, counts
        )
        pair_agg = table.targets[np.repeat(starts, counts) + offsets]
        out: list[tuple[int, Frame]] = []
        by = block.bypass[pair_agg]
        if by.any():
            out += self._forward_raw(frame, block, pair_row[by], pair_agg[by], True)
            pair_row, pair_agg = pair_row[~by], pair_agg[~by]
        # First come, first served: destinations without an aggregator take
        # free ones in the order their rows arrived; the rest overflow.
        need = pair_agg[block.slot[pair_agg] < 0]
        if need.size:
            _, first = np.unique(need, return_index=True)
            need = need[np.sort(first)]
            take = min(need.size, len(block.free))
            for agg in need[:take].tolist():
                block.slot[agg] = block.free.pop()
        has = block.slot[pair_agg] >= 0
        spill_agg = pair_agg[~has]
        if spill_agg.size:
            np.add.at(block.raw, spill_agg, 1)
            out += self._forward_raw(frame, block, pair_row[~has], spill_agg, False)
        pair_row, pair_agg = pair_row[has], pair_agg[has]
        np.add.at(block.pool, block.slot[pair_agg], rows[pair_row])
        np.add.at(block.count, pair_agg, 1)
        if block.deps is not None:
            block.deps[pair_agg, frame.sender] = self.number
        self.stats["aggregated"] += int(pair_agg.size)
        self._occupancy(block)
        touched = np.unique(np.concatenate([pair_agg, spill_agg]))
        return out + self._complete(frame, block, touched)

    def _complete(
        self, frame: Frame, block: _Block, aggs: np.ndarray
    ) -> list[tuple[int, Frame]]:
        """Results of the aggregators among ``aggs`` that have every row."""
        if aggs.size == 0:
            return []
        done = aggs[
            ~block.done[aggs]
            & ~block.bypass[aggs]
            & (block.count[aggs] + block.raw[aggs] == block.table.expected[aggs])
        ]
        if done.size == 0:
            return []
        block.done[done] = True
        # Destinations whose every row overflowed have no aggregator: the
        # owner has them all raw, and no result is sent.
        done = done[block.slot[done] >= 0]
        slots = block.slot[done]
        rows = block.pool[slots].copy()
        block.pool[slots] = 0.0
        block.free.extend(slots.tolist())
        block.slot[done] = -1
        self.stats["results"] += int(done.size)
        ids = block.table.agg[done]
        out = []
        for rank, pick in self._by_owner(ids):
            result = frame.reply(
                Kind.RESULT,
                ids1=ids[pick],
                ids2=block.count[done[pick]],
                rows=rows[pick],
            )
            if block.deps is not None:  # every row summed into it
                result.deps = block.deps[done[pick]].max(axis=0)
            out.append((rank, result))
        return out

    def _by_owner(self, ids: np.ndarray) -> list[tuple[int, np.ndarray]]:
        owners = self.owner(ids)
        return [(int(r), np.flatnonzero(owners == r)) for r in np.unique(owners)]

    def _forward_raw(
        self,
        frame: Frame,
        block: _Block,
        pair_row: np.ndarray,
        pair_agg: np.ndarray,
        bypass: bool,
    ) -> list[tuple[int, Frame]]:
        """RAW frames: rows ``frame.rows[pair_row]`` for destinations
        ``pair_agg``. Overflow sends a copy per destination (the strawman:
        each multicast copy that finds no aggregator goes on as it is);
        bypass, one row per (source, owner), which the owner caches."""
        self.stats["bypassed" if bypass else "raw"] += int(pair_row.size)
        src = frame.ids1[pair_row]
        dst = block.table.agg[pair_agg]
        out = []
        for rank, pick in self._by_owner(dst):
            order = pick[np.lexsort((dst[pick], src[pick]))]
            if bypass:  # one row per (source, owner): the owner caches it
                runs = run_starts(src[order])
                first = np.flatnonzero(np.r_[True, runs[1:] != runs[:-1]])
            else:  # overflow: the strawman's copy per destination
                first = np.arange(order.size)
            raw = frame.reply(
                Kind.RAW,
                BYPASS if bypass else 0,
                ids1=src[order],
                ids2=dst[order],
                rows=frame.rows[pair_row[order[first]]],
            )
            out.append((rank, raw))
        return out

    def _release(self, block: _Block, aggs: np.ndarray) -> None:
        """Drop the partial sums of ``aggs``; their rows bypass from now on."""
        held = aggs[block.slot[aggs] >= 0]
        slots = block.slot[held]
        block.pool[slots] = 0.0
        block.free.extend(slots.tolist())
        block.slot[held] = -1
        block.bypass[aggs] = True

    def _resend(self, frame: Frame, block: _Block) -> list[tuple[int, Frame]]:
        """Retransmitted pairs: release their aggregators, forward them raw."""
        aggs = self._agg_of(block, frame.ids2, "DATA (resend)")
        self._release(block, np.unique(aggs))
        # One row per run of equal sources in the frame, as RAW frames carry.
        runs = run_starts(frame.ids1)
        expanded = Frame(
            frame.kind,
            frame.flags,
            frame.plan,
            frame.sender,
            frame.seq,
            frame.block,
            frame.ids1,
            frame.ids2,
            frame.rows[runs],
        )
        pair_row = np.arange(frame.ids1.size)
        return self._forward_raw(expanded, block, pair_row, aggs, True)

    def _fetch(self, frame: Frame, block: _Block) -> list[tuple[int, Frame]]:
        """A destination owner's fetch: release, then ask the sources' owners."""
        aggs = self._agg_of(block, frame.ids2, "FETCH")
        self._release(block, np.unique(aggs))
        self.stats["fetches"] += int(frame.ids1.size)
        out = []
        for rank, pick in self._by_owner(frame.ids1):
            fetch = frame.reply(
                Kind.FETCH, ids1=frame.ids1[pick], ids2=frame.ids2[pick]
            )
            out.append((rank, fetch))
        return out

    def _ack(self, frame: Frame, block: _Block) -> list[tuple[int, Frame]]:
        """ACK multicast: to the owners of the acknowledged destinations' sources."""
        aggs = self._agg_of(block, frame.ids1, "ACK")
        table = block.table
        mark = np.zeros(table.agg.size, dtype=bool)
        mark[aggs] = True
        hit = mark[table.targets]
        owners = self.owner(table.pair_up[hit])
        dests = table.agg[table.targets[hit]]
        out = []
        for rank in np.unique(owners).tolist():
            ids = np.unique(dests[owners == rank])
            out.append((rank, frame.reply(Kind.ACK, ids1=ids)))
        return out

    def _sent(self, frame: Frame, block: _Block) -> list[tuple[int, Frame]]:
        """A worker's rows of the block are all out; once every worker's are
        in, say so to all (every result they will get without a fetch is
        queued before it: what is missing then was lost)."""
        block.sent_workers.add(frame.sender)
        if len(block.sent_workers) < self.world_size:
            return []
        sent = frame.reply(Kind.SENT)
        sent.deps = self.seen.copy() if self.causal else None
        return [(rank, sent) for rank in range(self.world_size)]

    def _done(self, frame: Frame, block: _Block) -> list[tuple[int, Frame]]:
        block.done_workers.add(frame.sender)
        if len(block.done_workers) < self.world_size:
            return []
        del self._active[(frame.seq, frame.block)]
        self._finished[frame.seq] = frame.block + 1
        blocks = self.stats["blocks"]
        blocks[str(frame.plan)] = blocks.get(str(frame.plan), 0) + 1
        complete = frame.reply(Kind.COMPLETE)
        complete.deps = self.seen.copy() if self.causal else None
        return [(rank, complete) for rank in range(self.world_size)]
