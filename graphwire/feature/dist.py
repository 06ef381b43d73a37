"""`DistFeatureStore`: rows sharded by owner, remote rows pulled (DistDGL's KV store).

Each worker owns the features, labels and sparse-embedding rows of its part's
global-ID range ``[start, stop)`` and answers its peers' requests for them
from a serving thread (:mod:`graphwire.comm.service`). A pull:

1. ``owner = book.owner(nid)``; local rows are read straight from ``part.x``;
2. remote IDs are deduplicated (``torch.unique``: sorted, so grouped by owner,
   whose ranges are contiguous) and split into one request per owner;
3. ``service.call`` sends all requests at once (owners answer concurrently);
4. the answers, concatenated in owner order, are scattered back with the
   ``inverse`` of the unique, so repeats and order are restored.

Local rows come from memory shared by the processes of a machine: ``part.x``
is a read-only memory map of the part's ``x.npy``, so every process that maps
a part reads the same pages of the page cache, with no copy per process.

Shapes (N nodes, F features, n IDs asked, u unique remote IDs of one owner):
    part.x  float32 [stop - start, F]  (owner-local rows)
    pull    float32 [n, F or d]        labels  int64 [n]

Wire (service ``"kv"``; every tensor packed by :func:`~graphwire.comm.wire.pack`):
    <kind> (pull/prefetch/cache)  [nid int64 [u], dims int64 [d] (empty = all)]
                                  -> [rows float32 [u, F or d]]
    labels                        [nid int64 [u]] -> [y int64 [u]]
    emb.pull                      [name uint8 [*], nid int64 [u]]
                                  -> [rows float32 [u, D]]
    emb.push                      [name uint8 [*], nid int64 [u], grad float32
                                  [u, D]] -> []

Ledger tags: ``kv.<kind>.req`` for requests and ``kv.<kind>`` for answers,
each one message of ``32 + len(pack(tensors))`` bytes per owner asked; an owner
with no requested row gets no message. The kinds differ only in their tags,
so on-demand pulls, prefetches and cache fills are measured apart.

Sparse embeddings (DistDGL's ``DistEmbedding`` with a sparse optimizer): each
owner holds its rows of every table in shared memory, with the optimizer
state; ``push`` sums the gradients of repeated IDs, sends each owner its rows
(one ``emb.push`` request per owner) and the owner applies the update under
the table's lock. Initial rows are a hash of (seed, *original* node ID), so a
node starts with the same row whatever the partitioning.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import torch

from graphwire.comm.base import Transport, TransportError
from graphwire.feature.base import (
    DEFAULT_KINDS,
    FeatureStore,
    check_nid,
    dims_from_wire,
    dims_on_wire,
    select_columns,
)
from graphwire.partition.local import LocalPart

__all__ = [
    "OPTIMIZERS",
    "SERVICE",
    "DistFeatureStore",
    "EmbeddingSpec",
    "initial_embedding",
]

SERVICE = "kv"
_RESERVED = ("labels", "emb.pull", "emb.push")
ADAGRAD_EPS = 1e-10  # as DGL's SparseAdagrad

OptimizerStep = Callable[
    [torch.Tensor, torch.Tensor | None, torch.Tensor, torch.Tensor, float], None
]
"""``step(weight, state, local_nid, grad, lr)``: update rows ``local_nid``
(unique) of ``weight`` in place; ``state`` is the optimizer's, or None."""


def sgd_step(
    weight: torch.Tensor,
    state: torch.Tensor | None,
    idx: torch.Tensor,
    grad: torch.Tensor,
    lr: float,
) -> None:
    """``weight[idx] -= lr * grad`` (``idx`` unique)."""
    weight.index_add_(0, idx, grad, alpha=-lr)


def adagrad_step(
    weight: torch.Tensor,
    state: torch.Tensor | None,
    idx: torch.Tensor,
    grad: torch.Tensor,
    lr: float,
) -> None:
    """DGL's SparseAdagrad: ``state += g*g; w -= lr * g / (sqrt(state) + eps)``."""
    assert state is not None, "adagrad needs its state"
    state.index_add_(0, idx, grad * grad)
    std = state.index_select(0, idx).sqrt_().add_(ADAGRAD_EPS)
    weight.index_add_(0, idx, grad / std, alpha=-lr)


OPTIMIZERS: dict[str, OptimizerStep] = {"sgd": sgd_step, "adagrad": adagrad_step}
_NEEDS_STATE = {"adagrad"}


@dataclass(frozen=True, kw_only=True, slots=True)
class EmbeddingSpec:
    """One sparse embedding table: N rows of ``dim`` floats, updated by owner.

    Args:
        dim: row width D.
        optimizer: a name in :data:`OPTIMIZERS` (``"sgd"``, ``"adagrad"``).
        lr: learning rate.
        init_std: standard deviation of the normal initial rows (0: zeros).
        seed: with the original node ID, fixes a node's initial row.
    """

    dim: int
    optimizer: str = "sgd"
    lr: float = 0.01
    init_std: float = 0.01
    seed: int = 0

    def __post_init__(self) -> None:
        if self.dim < 1:
            raise ValueError(f"dim: must be >= 1, found {self.dim}")
        if self.optimizer not in OPTIMIZERS:
            raise ValueError(
                f"optimizer: expected one of {sorted(OPTIMIZERS)}, "
                f"found {self.optimizer!r}"
            )
        if not self.lr > 0:
            raise ValueError(f"lr: must be > 0, found {self.lr}")
        if not self.init_std >= 0:
            raise ValueError(f"init_std: must be >= 0, found {self.init_std}")
        if not 0 <= self.seed < 2**63:
            raise ValueError(f"seed: must lie in [0, 2**63), found {self.seed}")


_GOLDEN = np.uint64(0x9E3779B97F4A7C15)
_BLOCK_ELEMENTS = 1 << 22  # bounds the hash temporaries (~32 MiB each)


def _mix64(x: np.ndarray) -> np.ndarray:
    """splitmix64's finaliser: a bijective scramble of uint64 (wraps mod 2**64)."""
    x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return x ^ (x >> np.uint64(31))


def _uniform(key: np.ndarray) -> np.ndarray:
    """float64 in (0, 1): the top 53 bits of the mixed key, centred."""
    return ((_mix64(key) >> np.uint64(11)).astype(np.float64) + 0.5) * 2.0**-53


def initial_embedding(spec: EmbeddingSpec, orig_nid: torch.Tensor) -> torch.Tensor:
    """float32 [len(orig_nid), dim]: initial rows of original node IDs.

    Entry (v, c) is ``init_std`` times a standard normal (Box-Muller) drawn
    from a hash of (seed, v, c): a pure function of the node, not of which
    part holds it or how many parts there are.
    """
    rows = orig_nid.numel()
    out = torch.zeros(rows, spec.dim, dtype=torch.float32)
    if spec.init_std == 0 or rows == 0:
        return out
    salt = _mix64(np.array([spec.seed], dtype=np.uint64) + _GOLDEN)
    ids = orig_nid.numpy().astype(np.uint64)
    cols = np.arange(spec.dim, dtype=np.uint64)
    block = max(1, _BLOCK_ELEMENTS // spec.dim)
    for first in range(0, rows, block):  # a loop over blocks of rows, not nodes
        element = ids[first : first + block, None] * np.uint64(spec.dim) + cols
        key = element * np.uint64(2) * _GOLDEN + salt
        radius = np.sqrt(-2.0 * np.log(_uniform(key)))
        angle = (2.0 * np.pi) * _uniform(key + _GOLDEN)
        normal = radius * np.cos(angle) * spec.init_std
        out[first : first + block] = torch.from_numpy(normal.astype(np.float32))
    return out


class _Shard:
    """One owner's rows of one table, and their optimizer state, in shared
    memory. The serving thread and the owner's own threads update it under
    ``lock``."""

    def __init__(self, spec: EmbeddingSpec, orig_nid: torch.Tensor) -> None:
        self.spec = spec
        self.weight = initial_embedding(spec, orig_nid).share_memory_()
        self.state = (
            torch.zeros_like(self.weight).share_memory_()
            if spec.optimizer in _NEEDS_STATE
            else None
        )
        self.step = OPTIMIZERS[spec.optimizer]
        self.lock = threading.Lock()

    def rows(self, local_nid: torch.Tensor) -> torch.Tensor:
        with self.lock:  # no torn row while an update runs
            return self.weight.index_select(0, local_nid)

    def apply(self, local_nid: torch.Tensor, grad: torch.Tensor) -> None:
        # A gradient that requires grad (pushed straight from a backward)
        # would record the in-place update on the table, as an optimizer's
        # step must not: the table would require grad and keep the pusher's
        # graph alive.
        unique_nid, summed = sum_duplicates(local_nid, grad.detach())
        with self.lock:
            self.step(self.weight, self.state, unique_nid, summed, self.spec.lr)


def sum_duplicates(
    nid: torch.Tensor, grad: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(unique_nid [u], summed [u, D])``: one gradient row per ID, sorted."""
    unique_nid, inverse = torch.unique(nid, return_inverse=True)
    summed = grad.new_zeros(unique_nid.numel(), grad.shape[1])
    return unique_nid, summed.index_add_(0, inverse, grad)


def _name_tensor(name: str) -> torch.Tensor:
    return torch.tensor(list(name.encode()), dtype=torch.uint8)


class DistFeatureStore(FeatureStore):
    """This rank's end of the sharded feature store (see the module docstring).

    Collective constructor and :meth:`close`: every rank builds its store at
    the same point, with the same ``kinds`` and ``embeddings``.

    Args:
        part: this rank's part (``part.part_id == transport.rank``), with ``x``.
        transport: the run's transport; its ledger records the traffic.
        kinds: pull kinds, each its own handler and ledger tag.
        embeddings: sparse embedding tables by name, or None.

    Attributes:
        service: the ``"kv"`` :class:`~graphwire.comm.service.Service`.
    """

    def __init__(
        self,
        part: LocalPart,
        transport: Transport,
        *,
        kinds: Sequence[str] = DEFAULT_KINDS,
        embeddings: Mapping[str, EmbeddingSpec] | None = None,
    ) -> None:
        _check_part(part, transport)
        assert part.x is not None
        clash = sorted(set(kinds) & set(_RESERVED))
        if clash:
            raise ValueError(f"kinds: {clash} are reserved for {_RESERVED}")
        embeddings = dict(embeddings or {})
        super().__init__(
            part.book.num_nodes,
            part.x.shape[1],
            kinds,
            transport.world_size,
            counted=_RESERVED if embeddings else _RESERVED[:1],
        )
        self.part, self.book, self.rank = part, part.book, transport.rank
        self.transport = transport  # the fetchers' collectives go through it too
        self.x, self.y = part.x, part.y
        self.start, self.stop = part.global_range
        self.tables = {n: _Shard(s, part.orig_nid) for n, s in embeddings.items()}
        handlers = {kind: self._serve_rows for kind in kinds}
        handlers["labels"] = self._serve_labels
        if embeddings:
            handlers["emb.pull"] = self._serve_emb_pull
            handlers["emb.push"] = self._serve_emb_push
        self.service = transport.open_service(SERVICE, handlers)
        self._closed = False

    # ------------------------------------------------------------- features
    def _pull(
        self, nid: torch.Tensor, dims: torch.Tensor | None, kind: str
    ) -> torch.Tensor:
        wire = dims_on_wire(dims, self.dim)
        return self._fetch(
            nid,
            kind,
            lambda local: select_columns(self.x.index_select(0, local), dims),
            lambda chunk: [chunk, wire],
        )

    def _labels(self, nid: torch.Tensor) -> torch.Tensor:
        return self._fetch(nid, "labels", self._local_labels, lambda c: [c])

    def _is_local(self, nid: torch.Tensor) -> torch.Tensor:
        return (nid >= self.start) & (nid < self.stop)

    def _local_labels(self, local_nid: torch.Tensor) -> torch.Tensor:
        if self.y is None:
            raise ValueError(f"labels: part {self.rank} was written without y")
        return self.y.index_select(0, local_nid)

    # ----------------------------------------------------------- embeddings
    def pull_embedding(self, name: str, nid: torch.Tensor) -> torch.Tensor:
        """float32 [len(nid), D]: rows of table ``name``, in the order of ``nid``."""
        shard = self._table(name)
        nid = check_nid(nid, self.num_nodes)
        wire_name = _name_tensor(name)
        return self._fetch(nid, "emb.pull", shard.rows, lambda c: [wire_name, c])

    def push(self, name: str, nid: torch.Tensor, grad: torch.Tensor) -> None:
        """Apply ``grad`` (float32 [len(nid), D]) to table ``name`` at ``nid``.

        Gradients of repeated IDs are summed; each owner gets one request
        with its rows and applies the table's optimizer. Returns when every
        owner has applied its rows.
        """
        shard = self._table(name)
        nid = check_nid(nid, self.num_nodes)
        if grad.dtype != torch.float32 or grad.shape != (nid.numel(), shard.spec.dim):
            raise ValueError(
                f"grad: expected float32 [{nid.numel()}, {shard.spec.dim}], found "
                f"{grad.dtype} with shape {tuple(grad.shape)}"
            )
        unique_nid, summed = sum_duplicates(nid, grad)
        counts = self._rows_per_owner(unique_nid)
        nid_chunks = torch.split(unique_nid, counts.tolist())
        grad_chunks = torch.split(summed, counts.tolist())
        wire_name = _name_tensor(name)
        requests = {
            p: [wire_name, nid_chunks[p], grad_chunks[p]]
            for p in self._peers_asked(counts)
        }
        shard.apply(nid_chunks[self.rank] - self.start, grad_chunks[self.rank])
        self.service.call(requests, "emb.push")
        local = int(counts[self.rank])
        counts[self.rank] = 0
        self.counters.record("emb.push", local, counts)

    def _table(self, name: str) -> _Shard:
        if name not in self.tables:
            raise ValueError(
                f"embedding: no table {name!r}; known: {sorted(self.tables)}"
            )
        return self.tables[name]

    # -------------------------------------------------------------- the pull
    def _fetch(
        self,
        nid: torch.Tensor,
        kind: str,
        read_local: Callable[[torch.Tensor], torch.Tensor],
        request: Callable[[torch.Tensor], list[torch.Tensor]],
    ) -> torch.Tensor:
        """Rows of ``nid``: local ones read, remote ones asked of their owners
        (one request per owner, unique IDs), all scattered into place."""
        is_local = self._is_local(nid)
        local_pos = is_local.nonzero().squeeze(1)
        remote_pos = (~is_local).nonzero().squeeze(1)
        local_rows = read_local(nid.index_select(0, local_pos) - self.start)
        out = local_rows.new_empty((nid.numel(), *local_rows.shape[1:]))
        out.index_copy_(0, local_pos, local_rows)
        # Sorted unique IDs are grouped by owner: owners hold contiguous ranges.
        unique_nid, inverse = torch.unique(
            nid.index_select(0, remote_pos), return_inverse=True
        )
        counts = self._rows_per_owner(unique_nid)
        chunks = torch.split(unique_nid, counts.tolist())
        peers = self._peers_asked(counts)
        if peers:
            answers = self.service.call({p: request(chunks[p]) for p in peers}, kind)
            remote_rows = torch.cat(
                [_one_answer(answers[p], chunks[p], local_rows, p, kind) for p in peers]
            )
            out.index_copy_(0, remote_pos, remote_rows.index_select(0, inverse))
        self.counters.record(kind, local_pos.numel(), counts)
        return out

    def _rows_per_owner(self, unique_nid: torch.Tensor) -> torch.Tensor:
        """int64 [P]: how many of the sorted ``unique_nid`` each part owns."""
        return torch.bincount(
            self.book.owner(unique_nid), minlength=self.book.num_parts
        )

    def _peers_asked(self, counts: torch.Tensor) -> list[int]:
        return [p for p in counts.nonzero().squeeze(1).tolist() if p != self.rank]

    # ------------------------------------------------------------- handlers
    def _serve_rows(self, src: int, request: list[torch.Tensor]) -> list[torch.Tensor]:
        nid, dims = _unpack_request(request, 2, "rows")
        local = self._owned_local(src, nid)
        checked = dims_from_wire(dims, self.dim)
        return [select_columns(self.x.index_select(0, local), checked)]

    def _serve_labels(
        self, src: int, request: list[torch.Tensor]
    ) -> list[torch.Tensor]:
        (nid,) = _unpack_request(request, 1, "labels")
        return [self._local_labels(self._owned_local(src, nid))]

    def _serve_emb_pull(
        self, src: int, request: list[torch.Tensor]
    ) -> list[torch.Tensor]:
        name, nid = _unpack_request(request, 2, "emb.pull")
        shard = self._table(_decode_name(name))
        return [shard.rows(self._owned_local(src, nid))]

    def _serve_emb_push(
        self, src: int, request: list[torch.Tensor]
    ) -> list[torch.Tensor]:
        name, nid, grad = _unpack_request(request, 3, "emb.push")
        shard = self._table(_decode_name(name))
        local = self._owned_local(src, nid)
        if grad.dtype != torch.float32 or grad.shape != (nid.numel(), shard.spec.dim):
            raise ValueError(
                f"emb.push from rank {src}: grad is {grad.dtype} "
                f"{tuple(grad.shape)}, expected float32 [{nid.numel()}, "
                f"{shard.spec.dim}]"
            )
        shard.apply(local, grad)
        return []

    def _owned_local(self, src: int, nid: torch.Tensor) -> torch.Tensor:
        """Owner-local rows of ``nid``, which must all be this rank's."""
        if nid.dtype != torch.int64 or nid.dim() != 1:
            raise ValueError(
                f"rank {self.rank}: request from rank {src}: nid must be 1-D "
                f"int64, found {nid.dtype} {tuple(nid.shape)}"
            )
        if nid.numel() and (int(nid.min()) < self.start or int(nid.max()) >= self.stop):
            raise ValueError(
                f"rank {self.rank} owns global IDs [{self.start}, {self.stop}); "
                f"rank {src} asked for IDs in [{int(nid.min())}, {int(nid.max())}]"
            )
        return nid - self.start

    def close(self) -> None:
        """Collective: stop serving once no rank pulls any more."""
        if not self._closed:
            self._closed = True
            self.service.close()


def _check_part(part: LocalPart, transport: Transport) -> None:
    if part.part_id != transport.rank or part.num_parts != transport.world_size:
        raise ValueError(
            f"part: rank {transport.rank} of {transport.world_size} must hold part "
            f"{transport.rank} of {transport.world_size}, found part {part.part_id} "
            f"of {part.num_parts}"
        )
    if part.x is None or part.x.dim() != 2 or part.x.dtype != torch.float32:
        found = None if part.x is None else f"{part.x.dtype} {tuple(part.x.shape)}"
        raise ValueError(
            f"part {part.part_id}: expected features x float32 [n, F], found {found}"
        )


def _unpack_request(
    request: list[torch.Tensor], expected: int, what: str
) -> list[torch.Tensor]:
    if len(request) != expected:
        raise ValueError(
            f"{what} request: expected {expected} tensors, found {len(request)}"
        )
    return request


def _decode_name(name: torch.Tensor) -> str:
    return bytes(name.tolist()).decode("utf-8", "replace")


def _one_answer(
    answer: list[torch.Tensor],
    chunk: torch.Tensor,
    like: torch.Tensor,
    peer: int,
    kind: str,
) -> torch.Tensor:
    """The one tensor of an owner's answer, checked against what was asked."""
    want = (chunk.numel(), *like.shape[1:])
    if len(answer) != 1 or answer[0].shape != want or answer[0].dtype != like.dtype:
        found = [(t.dtype, tuple(t.shape)) for t in answer]
        raise TransportError(
            f"{SERVICE}.{kind}: rank {peer} answered {found}, expected "
            f"{like.dtype} {want}"
        )
    return answer[0]
