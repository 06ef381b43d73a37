"""`FeatureStore`: feature rows and labels of nodes by global ID.

A mini-batch trainer asks for the input features of the nodes its sampler
reached, wherever they live. The store answers ``pull(nid)`` with one row per
ID, in the order asked (duplicates allowed, answered duplicated), whether the
row is local or has to be fetched from its owner. Implementations:

- :class:`TensorStore`: the whole ``x`` and ``y`` in one process;
- :class:`~graphwire.feature.dist.DistFeatureStore`: rows sharded by owner,
  remote rows pulled over a service (DistDGL's KV store).

Shapes (N nodes, F feature columns, n IDs asked, d columns asked):
    nid     int64 [n]      global IDs in ``[0, N)``, any order, repeats allowed
    dims    int64 [d]      distinct columns in ``[0, F)``; ``None`` = all F
    pull    float32 [n, d or F]
    labels  int64 [n]
    is_local  bool [n]     whether the row is read without asking a peer

Every pull is counted per *kind* (``"pull"`` on demand, ``"prefetch"``,
``"cache"`` fills, ...): calls, local rows, unique remote rows, requests and
remote rows per peer (:meth:`FeatureStore.stats`). Bytes are not counted here:
the transport's ledger has them, under the store's service tags.
"""

from __future__ import annotations

import threading
from abc import ABC, abstractmethod
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

__all__ = [
    "DEFAULT_KINDS",
    "FeatureStore",
    "PullCounters",
    "TensorStore",
    "check_dims",
    "check_nid",
    "dims_from_wire",
    "dims_on_wire",
    "select_columns",
]

DEFAULT_KINDS = ("pull", "prefetch", "cache")
"""Why rows are pulled: on demand, by a prefetcher, to fill a cache."""

_PER_PEER = "remote_rows_per_peer"


def check_nid(nid: Any, num_nodes: int, name: str = "nid") -> torch.Tensor:
    """``nid`` if it is a 1-D int64 tensor of IDs in ``[0, num_nodes)``.

    Raises:
        ValueError: naming what was expected and what was found.
    """
    return _check_index(nid, num_nodes, name, "IDs")


def _check_index(index: Any, bound: int, name: str, what: str) -> torch.Tensor:
    """``index`` if it is a 1-D int64 tensor of ``what`` in ``[0, bound)``."""
    if not isinstance(index, torch.Tensor):
        raise ValueError(f"{name}: expected an int64 tensor, found {type(index)}")
    if index.dtype != torch.int64 or index.dim() != 1:
        raise ValueError(
            f"{name}: expected a 1-D int64 tensor, found {index.dtype} with shape "
            f"{tuple(index.shape)}"
        )
    if index.numel() and (int(index.min()) < 0 or int(index.max()) >= bound):
        raise ValueError(
            f"{name}: {what} must lie in [0, {bound}), found range "
            f"[{int(index.min())}, {int(index.max())}]"
        )
    return index


def check_dims(dims: Any, dim: int) -> torch.Tensor | None:
    """``dims`` if ``None`` or a non-empty 1-D int64 tensor of distinct columns.

    The columns must lie in ``[0, dim)``.

    Raises:
        ValueError: naming what was expected and what was found.
    """
    if dims is None:
        return None
    checked = _check_index(dims, dim, "dims", "columns")
    if checked.numel() == 0:
        raise ValueError("dims: empty; pass None to pull every column")
    if torch.unique(checked).numel() != checked.numel():
        raise ValueError(f"dims: columns must be distinct, found {checked.tolist()}")
    return checked


def dims_on_wire(dims: torch.Tensor | None, dim: int) -> torch.Tensor:
    """The columns a pull asks for, as its request carries them: none (all),
    a bitmask of ``ceil(F / 8)`` bytes when they ascend (DGS's top
    dimensions: 13 bytes for F = 100 rather than 8 per column), else int64."""
    if dims is None:
        return torch.empty(0, dtype=torch.int64)
    if dims.numel() > 1 and not bool((dims[1:] > dims[:-1]).all()):
        return dims
    bits = np.zeros(dim, dtype=np.bool_)
    bits[dims.numpy()] = True
    return torch.from_numpy(np.packbits(bits))


def dims_from_wire(wire: torch.Tensor, dim: int) -> torch.Tensor | None:
    """:func:`dims_on_wire`'s columns, checked (None: all).

    Raises:
        ValueError: a bitmask of the wrong size or naming no column, or
            columns outside ``[0, dim)`` or repeated.
    """
    if wire.numel() == 0:
        return None
    if wire.dtype != torch.uint8:
        return check_dims(wire, dim)
    if wire.numel() != (dim + 7) // 8:
        raise ValueError(
            f"dims: a bitmask of {wire.numel()} bytes, expected {(dim + 7) // 8}"
        )
    bits = np.unpackbits(wire.numpy())
    if bits[dim:].any():
        raise ValueError(f"dims: the bitmask names columns at or past {dim}")
    return check_dims(torch.from_numpy(bits[:dim].nonzero()[0].astype(np.int64)), dim)


class PullCounters:
    """Thread-safe per-kind counters of one store.

    Per kind: ``calls``; ``local_rows`` (rows answered from this process,
    repeats counted); ``remote_rows`` (unique rows fetched from peers);
    ``remote_requests`` (requests sent: one per owner asked);
    ``remote_rows_per_peer`` (list by rank).
    """

    def __init__(self, kinds: Sequence[str], world_size: int) -> None:
        self.world_size = world_size
        self._kinds = tuple(kinds)
        self._lock = threading.Lock()
        self._table: dict[str, dict[str, Any]] = {}
        self.reset()

    def reset(self) -> None:
        with self._lock:
            self._table = {kind: self._zero() for kind in self._kinds}

    def _zero(self) -> dict[str, Any]:
        return {
            "calls": 0,
            "local_rows": 0,
            "remote_rows": 0,
            "remote_requests": 0,
            _PER_PEER: [0] * self.world_size,
        }

    def record(
        self, kind: str, num_local: int, remote_per_peer: torch.Tensor | None = None
    ) -> None:
        """Count one call of ``kind``.

        Args:
            kind: why the rows were pulled.
            num_local: rows answered locally.
            remote_per_peer: int64 [world_size]: unique rows asked of each peer.
        """
        per_peer = (
            [0] * self.world_size
            if remote_per_peer is None
            else [int(v) for v in remote_per_peer.tolist()]
        )
        with self._lock:
            entry = self._table.setdefault(kind, self._zero())
            entry["calls"] += 1
            entry["local_rows"] += num_local
            entry["remote_rows"] += sum(per_peer)
            entry["remote_requests"] += sum(1 for v in per_peer if v)
            entry[_PER_PEER] = [
                a + b for a, b in zip(entry[_PER_PEER], per_peer, strict=True)
            ]

    def as_dict(self) -> dict[str, dict[str, Any]]:
        """JSON-ready copy: ``{kind: {counter: value}}``."""
        with self._lock:
            return {
                kind: {**entry, "remote_rows_per_peer": list(entry[_PER_PEER])}
                for kind, entry in self._table.items()
            }


class FeatureStore(ABC):
    """Feature rows and labels by global ID (see the module docstring).

    Subclasses implement ``_pull``, ``_labels`` and ``_is_local`` on inputs
    this class has already checked.

    Args:
        num_nodes: N, the number of global IDs.
        dim: F, the number of feature columns.
        kinds: the kinds :meth:`pull` accepts (each counted apart).
        world_size: ranks, for the per-peer counters.
        counted: other counter names (``"labels"``, ...).
    """

    def __init__(
        self,
        num_nodes: int,
        dim: int,
        kinds: Sequence[str],
        world_size: int = 1,
        *,
        counted: Sequence[str] = ("labels",),
    ) -> None:
        kinds = tuple(kinds)
        if not kinds or len(set(kinds)) != len(kinds):
            raise ValueError(f"kinds: expected distinct names, found {kinds}")
        self.num_nodes = num_nodes
        self.dim = dim
        self.kinds = kinds
        # Counted besides the pull kinds: labels, embedding pulls and pushes.
        self.counters = PullCounters((*kinds, *counted), world_size)

    def pull(
        self, nid: torch.Tensor, dims: torch.Tensor | None = None, kind: str = "pull"
    ) -> torch.Tensor:
        """float32 [len(nid), F or len(dims)]: the rows of ``nid``, in order.

        Raises:
            ValueError: ``nid``, ``dims`` or ``kind`` is invalid.
        """
        nid = check_nid(nid, self.num_nodes)
        checked_dims = check_dims(dims, self.dim)
        if kind not in self.kinds:
            raise ValueError(f"kind: expected one of {self.kinds}, found {kind!r}")
        return self._pull(nid, checked_dims, kind)

    def labels(self, nid: torch.Tensor) -> torch.Tensor:
        """int64 [len(nid)]: the labels of ``nid``, in order."""
        return self._labels(check_nid(nid, self.num_nodes))

    def is_local(self, nid: torch.Tensor) -> torch.Tensor:
        """bool [len(nid)]: whether each row is read without asking a peer."""
        return self._is_local(check_nid(nid, self.num_nodes))

    def stats(self) -> dict[str, dict[str, Any]]:
        """JSON-ready per-kind counters (see :class:`PullCounters`)."""
        return self.counters.as_dict()

    def reset_stats(self) -> None:
        self.counters.reset()

    def close(self) -> None:  # noqa: B027 - optional hook
        """Release the store (collective for distributed stores)."""

    @abstractmethod
    def _pull(
        self, nid: torch.Tensor, dims: torch.Tensor | None, kind: str
    ) -> torch.Tensor: ...

    @abstractmethod
    def _labels(self, nid: torch.Tensor) -> torch.Tensor: ...

    @abstractmethod
    def _is_local(self, nid: torch.Tensor) -> torch.Tensor: ...


def select_columns(rows: torch.Tensor, dims: torch.Tensor | None) -> torch.Tensor:
    """``rows[:, dims]`` (all columns when ``dims`` is None)."""
    return rows if dims is None else rows.index_select(1, dims)


class TensorStore(FeatureStore):
    """Everything local: ``x`` float32 [N, F] and optionally ``y`` int64 [N].

    Args:
        x: features (any floating dtype; kept as float32).
        y: labels, or None (then :meth:`labels` raises).
        kinds: the pull kinds to accept and count.
    """

    def __init__(
        self,
        x: torch.Tensor,
        y: torch.Tensor | None = None,
        *,
        kinds: Sequence[str] = DEFAULT_KINDS,
    ) -> None:
        if x.dim() != 2 or not x.is_floating_point():
            raise ValueError(
                f"x: expected a floating [N, F] tensor, found {x.dtype} with "
                f"shape {tuple(x.shape)}"
            )
        if y is not None and (y.dtype != torch.int64 or y.shape != x.shape[:1]):
            raise ValueError(
                f"y: expected int64 [{x.shape[0]}], found {y.dtype} with shape "
                f"{tuple(y.shape)}"
            )
        super().__init__(x.shape[0], x.shape[1], kinds)
        self.x = x.to(torch.float32)
        self.y = y

    def _pull(
        self, nid: torch.Tensor, dims: torch.Tensor | None, kind: str
    ) -> torch.Tensor:
        self.counters.record(kind, nid.numel())
        return select_columns(self.x.index_select(0, nid), dims)

    def _labels(self, nid: torch.Tensor) -> torch.Tensor:
        if self.y is None:
            raise ValueError("labels: this TensorStore was built without y")
        self.counters.record("labels", nid.numel())
        return self.y.index_select(0, nid)

    def _is_local(self, nid: torch.Tensor) -> torch.Tensor:
        return torch.ones(nid.numel(), dtype=torch.bool)
