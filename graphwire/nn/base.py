"""`MessageGraph`: the bipartite graph every layer aggregates over.

A :class:`MessageGraph` is a bipartite CSR whose row ``d`` lists the source rows of
the edges that end at destination ``d``. Following DGL's blocks, the first
``num_dst`` source rows *are* the destination nodes, so a layer's self (root) term
is ``h_src[:num_dst]``, unless ``dst_index`` names the source row of each
destination (a G3 bin reading a whole table of rows); layers read their
destinations' rows through :meth:`MessageGraph.dst_rows`. Three producers
build one:

- full-graph training: ``MessageGraph.from_graph(graph)`` (``num_src == num_dst``);
- the samplers: a :class:`~graphwire.sampler.base.Block` per layer;
- distributed engines: owned nodes first, then halo nodes, with ``edge_weight``
  taken from *global* degrees (which is why GCN uses ``edge_weight`` when given).

Shapes (S = num_src, D = num_dst, E edges, H heads, F features):
    indptr       int64 [D + 1]
    indices      int64 [E]       source row of each edge, in [0, S)
    edge_weight  float32 [E]     optional, in CSR order
    dst_index    int64 [D]       optional, source row of each destination

The aggregations (:mod:`graphwire.nn.aggregate`) multiply by its sparse
adjacency forward and by its transpose backward. The graph builds the
transposed CSR once (a stable argsort of ``indices``) and caches it, as it
does the permuted copy of its own constant weights (``edge_weight``,
``sym_norm``, ``mean_weight``; rebuilt after an in-place change, never kept
for a weight that requires grad).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

import torch

from graphwire.graph.graph import Graph
from graphwire.graph.order import index_dtype, stable_order
from graphwire.nn.sparse import HeadsIndex, heads_index, sparse_csr

__all__ = ["MessageGraph"]


@dataclass(frozen=True, eq=False)
class MessageGraph:
    """Bipartite in-edge CSR: row = destination, ``indices`` index source rows.

    Attributes:
        indptr: int64 [num_dst + 1], row pointers.
        indices: int64 [E], source row of every edge.
        num_src: number of source rows (``>= num_dst``; unless ``dst_index``
            is given, the first ``num_dst`` of them are the destinations
            themselves).
        num_dst: number of destination rows.
        edge_weight: optional float32 [E] per-edge weight in CSR order.
        dst_index: optional int64 [num_dst], the source row holding each
            destination's own row (None: the first ``num_dst``).
    """

    indptr: torch.Tensor
    indices: torch.Tensor
    num_src: int
    num_dst: int
    edge_weight: torch.Tensor | None = None
    dst_index: torch.Tensor | None = None

    def __post_init__(self) -> None:
        if self.indptr.dtype != torch.int64 or self.indices.dtype != torch.int64:
            raise ValueError(
                f"MessageGraph: indptr/indices must be int64, found "
                f"{self.indptr.dtype}/{self.indices.dtype}"
            )
        if self.indptr.shape != (self.num_dst + 1,):
            raise ValueError(
                f"MessageGraph.indptr: expected shape [num_dst + 1 = "
                f"{self.num_dst + 1}], found {tuple(self.indptr.shape)}"
            )
        if self.dst_index is None and self.num_src < self.num_dst:
            raise ValueError(
                f"MessageGraph: num_src ({self.num_src}) must be >= num_dst "
                f"({self.num_dst}): destinations are the first source rows"
            )
        if self.dst_index is not None and (
            self.dst_index.dtype != torch.int64
            or self.dst_index.shape != (self.num_dst,)
        ):
            raise ValueError(
                f"MessageGraph.dst_index: expected int64 [num_dst = "
                f"{self.num_dst}], found {self.dst_index.dtype} "
                f"{list(self.dst_index.shape)}"
            )
        if self.indices.dim() != 1:
            raise ValueError(
                f"MessageGraph.indices: expected shape [E], found "
                f"{tuple(self.indices.shape)}"
            )
        self._check_csr()
        if self.edge_weight is not None and self.edge_weight.shape != (self.num_edges,):
            raise ValueError(
                f"MessageGraph.edge_weight: expected shape [E = {self.num_edges}], "
                f"found {tuple(self.edge_weight.shape)}"
            )

    def _check_csr(self) -> None:
        """Refuse a CSR the sparse kernels would read out of bounds.

        The kernels run with ``check_invariants=False`` and read garbage memory
        (or crash) on bad input. Samplers build a MessageGraph per layer per
        batch, so this stays O(E) and vectorised: one min/max per array, one
        host sync for all of them.
        """
        num_edges = self.num_edges
        steps = self.indptr[1:] - self.indptr[:-1]
        zero = self.indptr.new_zeros(1)
        lo_idx, hi_idx = (
            torch.aminmax(self.indices) if num_edges else (zero[0], zero[0])
        )
        dst_index = self.dst_index
        lo_dst, hi_dst = (
            torch.aminmax(dst_index)
            if dst_index is not None and dst_index.numel()
            else (zero[0], zero[0])
        )
        stats = torch.stack(
            [
                self.indptr[0],
                self.indptr[-1],
                steps.min() if steps.numel() else zero[0],
                lo_idx,
                hi_idx,
                lo_dst,
                hi_dst,
            ]
        ).tolist()
        first, last, min_step, lo, hi, lo_d, hi_d = stats
        if first != 0:
            raise ValueError(f"MessageGraph.indptr: must start at 0, found {first}")
        if last != num_edges:
            raise ValueError(
                f"MessageGraph.indptr: must end at len(indices) = {num_edges}, "
                f"found {last}"
            )
        if min_step < 0:
            row = int(torch.nonzero(steps < 0)[0])
            raise ValueError(
                f"MessageGraph.indptr: must be non-decreasing, found "
                f"indptr[{row}] = {int(self.indptr[row])} > "
                f"indptr[{row + 1}] = {int(self.indptr[row + 1])}"
            )
        if num_edges and (lo < 0 or hi >= self.num_src):
            raise ValueError(
                f"MessageGraph.indices: source rows must lie in [0, num_src = "
                f"{self.num_src}), found range [{lo}, {hi}]"
            )
        bad_dst = lo_d < 0 or hi_d >= self.num_src
        if self.num_dst and dst_index is not None and bad_dst:
            raise ValueError(
                f"MessageGraph.dst_index: source rows must lie in [0, num_src = "
                f"{self.num_src}), found range [{lo_d}, {hi_d}]"
            )

    @classmethod
    def from_graph(
        cls, graph: Graph, *, add_self_loops: bool = False, gcn_weights: bool = False
    ) -> MessageGraph:
        """The whole graph as a MessageGraph (``num_src == num_dst == N``).

        Args:
            graph: the in-edge CSR graph.
            add_self_loops: replace self-loops by exactly one per node first.
            gcn_weights: attach ``graph.gcn_norm`` (of the looped graph if
                ``add_self_loops``) as ``edge_weight``.
        """
        if add_self_loops:
            graph = graph.add_self_loops()
        weight = graph.gcn_norm if gcn_weights else None
        n = graph.num_nodes
        return cls(graph.indptr, graph.indices, n, n, weight)

    # ------------------------------------------------------------- structure
    @property
    def num_edges(self) -> int:
        return int(self.indices.numel())

    def dst_rows(self, h_src: torch.Tensor) -> torch.Tensor:
        """The destinations' own rows of ``h_src``: [num_src, ...] -> [num_dst, ...].

        The first ``num_dst``, or those ``dst_index`` names."""
        if self.dst_index is None:
            return h_src[: self.num_dst]
        return h_src.index_select(0, self.dst_index)

    def in_degrees(self) -> torch.Tensor:
        """int64 [num_dst]: in-edges of each destination."""
        return self.indptr[1:] - self.indptr[:-1]

    @cached_property
    def out_degrees(self) -> torch.Tensor:
        """int64 [num_src]: edges leaving each source row within this graph."""
        return torch.bincount(self.indices, minlength=self.num_src)

    @cached_property
    def dst_of_edges(self) -> torch.Tensor:
        """int64 [E]: the destination row of every edge (CSR order)."""
        return torch.repeat_interleave(
            torch.arange(self.num_dst, dtype=torch.int64), self.in_degrees()
        )

    @cached_property
    def sym_norm(self) -> torch.Tensor:
        """float32 [E]: GCN weights ``1/sqrt(out_deg(src) * in_deg(dst))``.

        From this graph's own degrees (zero degrees count as one)."""
        out_deg = self.out_degrees.clamp(min=1).to(torch.float32)
        in_deg = self.in_degrees().clamp(min=1).to(torch.float32)
        return (out_deg[self.indices] * in_deg[self.dst_of_edges]).rsqrt()

    @cached_property
    def mean_weight(self) -> torch.Tensor:
        """float32 [E]: ``1 / in_deg(dst)``, turning a sum into a mean."""
        inv = 1.0 / self.in_degrees().clamp(min=1).to(torch.float32)
        return inv[self.dst_of_edges]

    @cached_property
    def _index(self) -> tuple[torch.Tensor, torch.Tensor]:
        dtype = index_dtype(self.num_edges, self.num_src)
        return self.indptr.to(dtype), self.indices.to(dtype)

    @cached_property
    def _transpose(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """``(crow [S + 1], col [E], perm [E])`` of the transposed CSR.

        Transposed entry ``j`` is edge ``perm[j]``: its values are
        ``values[perm]``. Built once (a stable counting sort of ``indices``),
        then reused.
        """
        perm = stable_order(self._index[1])
        crow = torch.zeros(self.num_src + 1, dtype=torch.int64)
        torch.cumsum(self.out_degrees, 0, out=crow[1:])
        dtype = self._index[0].dtype
        return crow.to(dtype), self.dst_of_edges[perm].to(dtype), perm

    @cached_property
    def _transposed_weights(self) -> dict[str, tuple[int, torch.Tensor]]:
        """Cached ``(weight._version, w[perm])`` of the weights this graph owns,
        by name."""
        return {}

    def own_weight_name(self, weight: torch.Tensor) -> str | None:
        """The name of ``weight`` if it is one of this graph's cacheable arrays.

        A weight that requires grad is never cached: its ``w[perm]`` would carry
        one forward's autograd graph into every later backward. Neither is an
        inference-mode tensor, which has no version counter.
        """
        if weight.requires_grad or weight.is_inference():
            return None
        for name in ("edge_weight", "sym_norm", "mean_weight"):
            if weight is self.__dict__.get(name):
                return name
        return None

    def transposed(self, name: str, weight: torch.Tensor) -> torch.Tensor:
        """``weight[perm]`` for one of this graph's own weight arrays, cached.

        The cache is keyed on ``weight._version``, so an in-place change to the
        weight (``edge_weight.mul_(2)``) rebuilds it rather than reading stale
        values.
        """
        cache = self._transposed_weights
        version = weight._version
        hit = cache.get(name)
        if hit is None or hit[0] != version:
            hit = (version, weight[self._transpose[2]])
            cache[name] = hit
        return hit[1]

    def adjacency(self, values: torch.Tensor) -> torch.Tensor:
        """Sparse CSR [num_dst, num_src] with the given per-edge ``values``."""
        crow, col = self._index
        return sparse_csr(crow, col, values, (self.num_dst, self.num_src))

    def adjacency_t(self, values_t: torch.Tensor) -> torch.Tensor:
        """Sparse CSR [num_src, num_dst] of the transpose (values already permuted)."""
        crow, col, _ = self._transpose
        return sparse_csr(crow, col, values_t, (self.num_src, self.num_dst))

    @cached_property
    def _heads_index(self) -> dict[tuple[int, bool], HeadsIndex]:
        """:func:`heads_index` of this graph (``True``: of its transpose), by
        head count: built once, then reused."""
        return {}

    def heads_adjacency(
        self, values: torch.Tensor, transposed: bool = False
    ) -> torch.Tensor:
        """Sparse CSR [num_dst * H, num_src * H]: one block of the adjacency per head.

        Row ``d * H + k`` holds row ``d``'s edges with head ``k``'s
        ``values`` [E, H] at columns ``s * H + k``. Times the rows [S, H, F]
        viewed as [S * H, F], it gives every head's product as [D * H, F], the
        view of [D, H, F]: no copy of a head's strided rows, no stack of the
        heads' results. ``transposed``: the same of the transpose, from the
        transpose's ``values`` (``values[perm]``)."""
        heads = int(values.shape[1])
        if heads == 1:  # the adjacency itself
            flat = values.reshape(-1)
            return self.adjacency_t(flat) if transposed else self.adjacency(flat)
        key = (heads, transposed)
        index = self._heads_index.get(key)
        if index is None:
            if transposed:
                crow, col, _ = self._transpose
                index = heads_index(crow, col, self.num_dst, heads)
            else:
                crow, col = self._index
                index = heads_index(crow, col, self.num_src, heads)
            self._heads_index[key] = index
        rows, cols = (
            (self.num_src, self.num_dst) if transposed else (self.num_dst, self.num_src)
        )
        entries = torch.index_select(values.reshape(-1), 0, index.order)
        return sparse_csr(index.crow, index.col, entries, (rows * heads, cols * heads))
