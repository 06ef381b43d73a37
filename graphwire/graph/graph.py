"""The `Graph`: an immutable CSR of in-edges plus node data.

Row ``v`` of the CSR lists the sources of the edges that end at ``v``
(``indices[indptr[v]:indptr[v + 1]]``), so aggregating messages into a node is a
row-wise reduction. This is the layout DGL calls "in-CSR" and PyG gets from
``SparseTensor(row=dst, col=src)``.

Shapes (N nodes, E edges, F features):
    indptr    int64 [N + 1]
    indices   int64 [E]        source node of each in-edge
    x         float32 [N, F]   optional
    y         int64 [N]        optional, class labels
    train_idx, val_idx, test_idx   int64 [*]  optional node-index splits

Everything is a ``torch.Tensor``; arrays that came from ``np.load(mmap_mode="r")``
stay memory-mapped (``torch.from_numpy`` shares their memory).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from functools import cached_property
from typing import Any

import numpy as np
import torch

from graphwire.graph.checks import (
    GraphError,
    as_tensor,
    check_disjoint,
    check_inferred_rows,
    check_permutation,
    check_split,
    node_count,
    node_ids,
)
from graphwire.graph.order import stable_order

__all__ = ["Graph", "GraphError", "check_inferred_rows", "node_count", "node_ids"]


@dataclass(frozen=True, eq=False)
class Graph:
    """A directed graph stored as CSR over in-edges, with node data.

    Build one with :meth:`from_edge_index`, :meth:`from_scipy`, :meth:`from_pyg`
    or :meth:`from_dgl`; the plain constructor takes a ready CSR and validates it.
    """

    indptr: torch.Tensor
    indices: torch.Tensor
    x: torch.Tensor | None = None
    y: torch.Tensor | None = None
    train_idx: torch.Tensor | None = None
    val_idx: torch.Tensor | None = None
    test_idx: torch.Tensor | None = None
    name: str = "graph"

    def __post_init__(self) -> None:
        set_ = object.__setattr__
        set_(self, "indptr", as_tensor(self.indptr, torch.int64, "indptr"))
        set_(self, "indices", as_tensor(self.indices, torch.int64, "indices"))
        if self.indptr.dim() != 1 or self.indptr.numel() < 1:
            raise GraphError(
                f"indptr: expected a 1-D array of length num_nodes + 1, "
                f"found shape {tuple(self.indptr.shape)}"
            )
        if self.indices.dim() != 1:
            raise GraphError(
                f"indices: expected a 1-D array, found shape "
                f"{tuple(self.indices.shape)}"
            )
        num_nodes = self.indptr.numel() - 1
        if int(self.indptr[0]) != 0 or int(self.indptr[-1]) != self.indices.numel():
            raise GraphError(
                f"indptr: must start at 0 and end at len(indices)="
                f"{self.indices.numel()}, found {int(self.indptr[0])}..."
                f"{int(self.indptr[-1])}"
            )
        if num_nodes > 0 and bool((self.indptr[1:] < self.indptr[:-1]).any()):
            raise GraphError("indptr: must be non-decreasing")
        if self.indices.numel() > 0:
            low, high = int(self.indices.min()), int(self.indices.max())
            if low < 0 or high >= num_nodes:
                raise GraphError(
                    f"indices: node IDs must lie in [0, {num_nodes}), "
                    f"found range [{low}, {high}]"
                )
        if self.x is not None:
            # Integer or boolean features (bag-of-words counts) become float32,
            # numpy's and torch's alike; a caller's autograd graph is cut off,
            # so training never writes .grad into the caller's tensor.
            x = as_tensor(self.x, torch.float32, "x").detach()
            if x.dim() != 2 or x.shape[0] != num_nodes:
                raise GraphError(
                    f"x: expected shape [num_nodes={num_nodes}, F], "
                    f"found {tuple(x.shape)}"
                )
            set_(self, "x", x)
        if self.y is not None:
            y = as_tensor(self.y, torch.int64, "y")
            if y.dim() != 1 or y.shape[0] != num_nodes:
                raise GraphError(
                    f"y: expected shape [num_nodes={num_nodes}], found {tuple(y.shape)}"
                )
            if y.numel() and int(y.min()) < -1:
                raise GraphError("y: labels must be >= 0 (or -1 for unlabelled)")
            set_(self, "y", y)
        splits: dict[str, torch.Tensor] = {}
        for split in ("train_idx", "val_idx", "test_idx"):
            value = getattr(self, split)
            if value is None:
                continue
            idx = node_ids(value, split, num_nodes)
            check_split(split, idx, self.y)
            set_(self, split, idx)
            splits[split] = idx
        check_disjoint(splits)

    # ------------------------------------------------------------------ sizes
    @property
    def num_nodes(self) -> int:
        return self.indptr.numel() - 1

    @property
    def num_edges(self) -> int:
        return self.indices.numel()

    @property
    def num_features(self) -> int:
        return 0 if self.x is None else int(self.x.shape[1])

    @property
    def num_classes(self) -> int:
        if self.y is None or self.y.numel() == 0:
            return 0
        return int(self.y.max()) + 1

    def __repr__(self) -> str:
        return (
            f"Graph(name={self.name!r}, num_nodes={self.num_nodes}, "
            f"num_edges={self.num_edges}, num_features={self.num_features}, "
            f"num_classes={self.num_classes})"
        )

    # ----------------------------------------------------------- constructors
    @classmethod
    def from_edge_index(
        cls,
        src: Any,
        dst: Any,
        num_nodes: int | None = None,
        **node_data: Any,
    ) -> Graph:
        """Build from parallel source/destination arrays (edge ``src[k] -> dst[k]``).

        Edges keep their input order within each destination row (stable sort).
        Duplicates and self-loops are kept; see :meth:`deduplicate`. Without
        ``num_nodes`` the graph has ``max(src, dst) + 1`` nodes, so nodes after
        the last one with an edge need ``num_nodes``.
        """
        src_np = np.asarray(src.cpu().numpy() if isinstance(src, torch.Tensor) else src)
        dst_np = np.asarray(dst.cpu().numpy() if isinstance(dst, torch.Tensor) else dst)
        if src_np.shape != dst_np.shape or src_np.ndim != 1:
            raise GraphError(
                f"edge index: src and dst must be 1-D arrays of equal length, "
                f"found shapes {src_np.shape} and {dst_np.shape}"
            )
        for label, arr in (("src", src_np), ("dst", dst_np)):
            if arr.size and not np.issubdtype(arr.dtype, np.integer):
                raise GraphError(
                    f"edge index: {label} must be integers, found {arr.dtype}"
                )
            if arr.dtype == np.uint64 and arr.size and int(arr.max()) >= 1 << 63:
                raise GraphError(  # int64 would wrap it to a negative ID
                    f"edge index: {label} holds node ID {int(arr.max())}, beyond int64"
                )
        src_np = src_np.astype(np.int64, copy=False)
        dst_np = dst_np.astype(np.int64, copy=False)
        if num_nodes is None:
            num_nodes = int(max(src_np.max(initial=-1), dst_np.max(initial=-1))) + 1
            check_inferred_rows(num_nodes, {k: node_data.get(k) for k in ("x", "y")})
        num_nodes = node_count(num_nodes, "num_nodes")
        if src_np.size:
            low = int(min(src_np.min(), dst_np.min()))
            high = int(max(src_np.max(), dst_np.max()))
            if low < 0 or high >= num_nodes:
                raise GraphError(
                    f"edge index: node IDs must lie in [0, {num_nodes}), "
                    f"found range [{low}, {high}]"
                )
        indptr, indices = _csr_from_coo(src_np, dst_np, num_nodes)
        return cls(
            indptr=torch.from_numpy(indptr),
            indices=torch.from_numpy(indices),
            **node_data,
        )

    @classmethod
    def from_scipy(cls, matrix: Any, **node_data: Any) -> Graph:
        """Build from a square scipy sparse adjacency ``A`` (``A[src, dst] != 0``).

        Explicitly stored zeros are not edges; ``matrix`` is left as it was.
        """
        import scipy.sparse as sp

        if (
            not sp.issparse(matrix)
            or len(matrix.shape) != 2
            or matrix.shape[0] != matrix.shape[1]
        ):
            raise GraphError(
                f"scipy matrix: expected a square sparse matrix, found "
                f"{type(matrix).__name__} of shape {getattr(matrix, 'shape', None)}"
            )
        # A copy (row = dst): the caller's matrix is neither pruned nor sorted.
        in_csr = sp.csr_matrix(matrix.T, copy=True)
        in_csr.eliminate_zeros()
        in_csr.sort_indices()
        return cls(
            indptr=torch.from_numpy(in_csr.indptr.astype(np.int64)),
            indices=torch.from_numpy(in_csr.indices.astype(np.int64)),
            **node_data,
        )

    @classmethod
    def from_pyg(cls, data: Any) -> Graph:
        """Build from a ``torch_geometric.data.Data`` (needs PyG only to make one).

        Reads ``edge_index`` [2, E], ``x``, ``y`` and the boolean
        ``train_mask`` / ``val_mask`` / ``test_mask`` [N].
        """
        from graphwire.graph.interop import pyg_parts

        src, dst, num_nodes, node_data = pyg_parts(data)
        return cls.from_edge_index(src, dst, num_nodes=num_nodes, **node_data)

    @classmethod
    def from_dgl(cls, graph: Any) -> Graph:
        """Build from a homogeneous ``dgl.DGLGraph`` (needs DGL only to make one).

        Reads ``ndata`` ``feat``, ``label`` and the boolean ``train_mask`` /
        ``val_mask`` / ``test_mask`` [N].
        """
        from graphwire.graph.interop import dgl_parts

        src, dst, num_nodes, node_data = dgl_parts(graph)
        return cls.from_edge_index(src, dst, num_nodes=num_nodes, **node_data)

    # -------------------------------------------------------------- accessors
    def edge_index(self) -> tuple[torch.Tensor, torch.Tensor]:
        """Return ``(src, dst)``, int64 [E] each, in CSR order."""
        return self.indices, self.dst_of_edges

    @cached_property
    def dst_of_edges(self) -> torch.Tensor:
        """int64 [E]: the destination of every CSR entry."""
        return torch.repeat_interleave(
            torch.arange(self.num_nodes, dtype=torch.int64), self.in_degrees()
        )

    def in_degrees(self) -> torch.Tensor:
        """int64 [N]: number of in-edges of each node."""
        return self.indptr[1:] - self.indptr[:-1]

    @cached_property
    def _out_degrees(self) -> torch.Tensor:
        return torch.bincount(self.indices, minlength=self.num_nodes)

    def out_degrees(self) -> torch.Tensor:
        """int64 [N]: number of out-edges of each node."""
        return self._out_degrees

    def to_scipy(self) -> Any:
        """The in-adjacency as ``scipy.sparse.csr_matrix`` [N, N] (row = dst)."""
        import scipy.sparse as sp

        data = np.ones(self.num_edges, dtype=np.float32)
        return sp.csr_matrix(
            (data, self.indices.numpy(), self.indptr.numpy()),
            shape=(self.num_nodes, self.num_nodes),
        )

    def replace(self, **changes: Any) -> Graph:
        """A copy with some fields replaced (structure or node data)."""
        return dataclasses.replace(self, **changes)

    def node_data(self) -> dict[str, Any]:
        return {
            "x": self.x,
            "y": self.y,
            "train_idx": self.train_idx,
            "val_idx": self.val_idx,
            "test_idx": self.test_idx,
            "name": self.name,
        }

    # ----------------------------------------------------- structural helpers
    def _rebuild(self, src: np.ndarray, dst: np.ndarray) -> Graph:
        indptr, indices = _csr_from_coo(src, dst, self.num_nodes)
        return Graph(
            indptr=torch.from_numpy(indptr),
            indices=torch.from_numpy(indices),
            **self.node_data(),
        )

    def _coo(self) -> tuple[np.ndarray, np.ndarray]:
        return self.indices.numpy(), self.dst_of_edges.numpy()

    @cached_property
    def reverse(self) -> Graph:
        """The graph with every edge flipped (CSR of out-edges of this one)."""
        src, dst = self._coo()
        return self._rebuild(dst, src)

    @cached_property
    def symmetric(self) -> Graph:
        """``u -> v`` and ``v -> u`` for every edge, without duplicates."""
        src, dst = self._coo()
        return self._rebuild(
            np.concatenate([src, dst]), np.concatenate([dst, src])
        ).deduplicate()

    def symmetrize(self) -> Graph:
        return self.symmetric

    def deduplicate(self) -> Graph:
        """Drop repeated edges; each row's sources come out sorted."""
        src, dst = self._coo()
        key = dst * np.int64(self.num_nodes) + src
        key = np.unique(key)
        return self._rebuild(key % self.num_nodes, key // self.num_nodes)

    def remove_self_loops(self) -> Graph:
        src, dst = self._coo()
        keep = src != dst
        if keep.all():
            return self
        return self._rebuild(src[keep], dst[keep])

    def add_self_loops(self) -> Graph:
        """Add one ``v -> v`` edge to every node (existing self-loops removed first)."""
        base = self.remove_self_loops()
        src, dst = base._coo()
        loops = np.arange(self.num_nodes, dtype=np.int64)
        return self._rebuild(np.concatenate([src, loops]), np.concatenate([dst, loops]))

    @cached_property
    def gcn_norm(self) -> torch.Tensor:
        """float32 [E]: GCN edge weights ``1 / sqrt(deg_out(src) * deg_in(dst))``.

        Degrees are taken of this graph as it is (add self-loops first); zero
        degrees count as one. In matrix form ``D_in^-1/2 A D_out^-1/2`` with
        ``A[dst, src]`` = 1 per edge, ``D_in`` its row sums and ``D_out`` its
        column sums (DGL's ``norm="both"``). On a symmetric graph both are
        ``D``, giving Kipf & Welling's ``D^-1/2 (A + I) D^-1/2`` after
        self-loops; on a directed one PyG's ``gcn_norm`` differs: it uses the
        in-degree at both ends.
        """
        in_deg = self.in_degrees().clamp(min=1).to(torch.float32)
        out_deg = self.out_degrees().clamp(min=1).to(torch.float32)
        src, dst = self.edge_index()
        return (out_deg[src] * in_deg[dst]).rsqrt()

    def permute(self, order: Any) -> Graph:
        """The same graph with its nodes renumbered by ``order``.

        Node ``i`` of the result is node ``order[i]`` of this one (``order``: a
        permutation of ``[0, N)``). Edges, features, labels and splits follow
        their nodes; each node's in-edges stay in their order, renumbered."""
        order = node_ids(order, "order", self.num_nodes)
        check_permutation(order, "order", self.num_nodes)
        new_of_old = torch.empty_like(order)
        new_of_old[order] = torch.arange(self.num_nodes, dtype=torch.int64)
        indptr, sources = self.subgraph_in_edges(order)

        def renumbered(idx: torch.Tensor | None) -> torch.Tensor | None:
            return None if idx is None else torch.sort(new_of_old[idx]).values

        return dataclasses.replace(
            self,
            indptr=indptr,
            indices=new_of_old[sources],
            x=None if self.x is None else self.x[order],
            y=None if self.y is None else self.y[order],
            train_idx=renumbered(self.train_idx),
            val_idx=renumbered(self.val_idx),
            test_idx=renumbered(self.test_idx),
        )

    def subgraph_in_edges(self, nodes: Any) -> tuple[torch.Tensor, torch.Tensor]:
        """CSR rows of ``nodes`` as ``(indptr [k + 1], sources [*])``, global IDs.

        ``nodes``: IDs as a tensor, array or list."""
        nodes = node_ids(nodes, "nodes", self.num_nodes)
        counts = self.in_degrees()[nodes]
        indptr = torch.zeros(nodes.numel() + 1, dtype=torch.int64)
        torch.cumsum(counts, 0, out=indptr[1:])
        starts = self.indptr[nodes]
        offsets = torch.arange(
            int(indptr[-1]), dtype=torch.int64
        ) - torch.repeat_interleave(indptr[:-1], counts)
        sources = self.indices[torch.repeat_interleave(starts, counts) + offsets]
        return indptr, sources


def _csr_from_coo(
    src: np.ndarray, dst: np.ndarray, num_nodes: int
) -> tuple[np.ndarray, np.ndarray]:
    """Sort edges by destination (stable) into CSR ``(indptr, indices)``."""
    counts = np.bincount(dst, minlength=num_nodes).astype(np.int64)
    indptr = np.zeros(num_nodes + 1, dtype=np.int64)
    np.cumsum(counts, out=indptr[1:])
    if dst.size and np.all(dst[1:] >= dst[:-1]):
        # Always a copy: ascontiguousarray can return the caller's own array,
        # and writing into it would change the graph.
        indices = np.array(src, dtype=np.int64, copy=True)
    else:
        keys = torch.from_numpy(np.require(dst, np.int64, "W"))  # from_numpy: writable
        order = stable_order(keys).numpy()
        indices = src[order].astype(np.int64, copy=False)
    return indptr, indices
