"""`MessageGraph` and the aggregation primitives every layer is written against.

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

The sums run as a sparse-CSR times dense product inside one
``torch.autograd.Function``; its backward multiplies by the transposed CSR, which
is built once per MessageGraph (a stable argsort of ``indices``) and cached, as
is the permuted copy of the graph's own constant weights (``edge_weight``,
``sym_norm``, ``mean_weight``; rebuilt after an in-place change, never kept for
a weight that requires grad). Plain ``torch.sparse.mm`` under autograd
re-transposes the matrix every backward.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from functools import cached_property
from typing import Any

import torch

from graphwire.graph.graph import Graph
from graphwire.graph.order import index_dtype, stable_order
from graphwire.graph.seeds import is_int

__all__ = [
    "MessageGraph",
    "ProjectsToOutput",
    "check_size",
    "edge_dots",
    "edge_softmax",
    "sparse_csr",
    "spmm",
    "spmm_mean",
    "spmm_sum",
]


def check_size(value: Any, name: str) -> int:
    """``value`` as a plain int if it is a valid width or count (an integer
    >= 1); ``ValueError`` naming ``name`` otherwise. A width of 0 builds a
    model whose output is a constant (its bias), and a negative one fails
    deep in torch, so layers and ``build_model`` check their sizes first."""
    if not is_int(value) or value < 1:
        raise ValueError(f"{name}: expected an integer >= 1, got {value!r}")
    return int(value)


def sparse_csr(
    crow: torch.Tensor, col: torch.Tensor, values: torch.Tensor, size: tuple[int, int]
) -> torch.Tensor:
    """Sparse CSR ``size`` (torch's beta warning silenced; invariants unchecked:
    callers build valid arrays)."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="Sparse CSR tensor support")
        return torch.sparse_csr_tensor(
            crow, col, values, size=size, check_invariants=False
        )


def spmm(a: torch.Tensor, h: torch.Tensor) -> torch.Tensor:
    """``a @ h`` for a sparse CSR ``a`` [n, m] and a dense ``h`` [m, w]: the
    values ``torch.sparse.mm`` gives, bit for bit, in a new tensor.

    On CPU the product is written by ``addmm`` with ``beta=0`` straight into
    an uninitialised result: ``torch.sparse.mm`` zero-fills a result, then
    copies the product into it, two passes over the output that took 25-30%
    of the whole product (a 100,910-row CSR with 1.79M entries times widths
    47 to 128, one thread, float32 and float64). ``out=`` records no autograd,
    so a product autograd would record goes through ``torch.sparse.mm``, as
    does any other device.
    """
    records = torch.is_grad_enabled() and (a.requires_grad or h.requires_grad)
    if records or h.device.type != "cpu":
        return torch.sparse.mm(a, h)
    out = h.new_empty((a.shape[0], h.shape[1]))
    return torch.addmm(out, a, h, beta=0, out=out)


# Edges per block of the gathered fallback of edge_dots (a block's two gathers
# are 2 x block x H x F values: 64 MiB at H x F = 512, float32).
_DOTS_BLOCK = 1 << 14


def edge_dots(mg: MessageGraph, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Per edge ``e`` of ``mg`` (CSR order), ``<a[dst(e)], b[src(e)]>``, per
    head for 3-D rows: the gradient of an aggregation's edge weights (a
    sampled dense-dense product).

    float32 and float64 on CPU go through ``torch.sparse.sampled_addmm`` on
    ``mg``'s pattern, one head at a time, on strided views (no copy of the
    rows); anything else (another dtype or device, where that kernel is
    untested here, or more edges than ``num_dst * num_src``, repeated edges
    the kernel refuses) gathers both ends' rows a block of edges at a time.
    Gathering every edge's rows at once, as before, held two [E, H, F]
    tensors: 4 GB for 8 heads of 64 over a million edges, whose product then
    took 14-16 s against 0.7 s here (one thread).

    Args:
        mg: message graph with E edges.
        a: float [num_dst, F] or [num_dst, H, F] (the output's gradient).
        b: float [num_src, F] or [num_src, H, F], same dtype and heads.

    Returns:
        float [E] for 2-D rows, [E, H] for 3-D.
    """
    if a.dim() == 2:  # one head
        return edge_dots(mg, a.unsqueeze(1), b.unsqueeze(1)).squeeze(1)
    num_edges = mg.indices.shape[0]
    out = a.new_empty((num_edges, a.shape[1]))
    sampled = a.dtype in (torch.float32, torch.float64) and a.device.type == "cpu"
    # sampled_addmm refuses a pattern with more entries than its shape has
    # places ("only sparse compressed tensors with the same number of
    # specified elements"): a multigraph's repeated edges can make one.
    sampled = sampled and num_edges <= mg.num_dst * mg.num_src
    if sampled and num_edges:
        pattern = mg.adjacency(a.new_zeros(num_edges))
        for k in range(a.shape[1]):
            dots = torch.sparse.sampled_addmm(pattern, a[:, k], b[:, k].t(), beta=0.0)
            out[:, k].copy_(dots.values())
        return out
    dst, src = mg.dst_of_edges, mg.indices
    for start in range(0, num_edges, _DOTS_BLOCK):
        end = min(start + _DOTS_BLOCK, num_edges)
        block = a[dst[start:end]].mul_(b[src[start:end]])
        torch.sum(block, dim=-1, out=out[start:end])
    return out


class ProjectsToOutput:
    """For a layer whose row-wise ``project`` maps rows to ``message_width``
    columns (``out_dim`` unless overridden: GCN's ``W``, GraphSAGE's
    ``W_neigh``; GAT's ``lin`` gives every head) before aggregating: projecting
    first narrows the rows the sparse product, and a distributed exchange,
    move when ``message_width < in_dim``."""

    in_dim: int
    out_dim: int

    @property
    def projects_first(self) -> bool:
        return self.message_width < self.in_dim

    @property
    def message_width(self) -> int:
        """Width of ``project``'s rows."""
        return self.out_dim

    @property
    def transforms_sources(self) -> bool:
        """Whether ``forward`` transforms every source row (work per source
        row) rather than only aggregating them (work per edge): a caller may
        hand a layer that does not a whole table of rows as its sources, with
        ``MessageGraph.dst_index``, instead of gathering the rows it reads."""
        return self.projects_first


@dataclass(frozen=True, eq=False)
class HeadsIndex:
    """The index arrays of an adjacency expanded to H heads
    (:meth:`MessageGraph.heads_adjacency`): ``crow`` [R * H + 1] and ``col``
    [E * H] of the expanded CSR, and ``order`` [E * H], the entry of the
    values [E, H] (flattened) each expanded entry takes."""

    crow: torch.Tensor
    col: torch.Tensor
    order: torch.Tensor


def heads_index(
    crow: torch.Tensor, col: torch.Tensor, num_cols: int, heads: int
) -> HeadsIndex:
    """The CSR ``crow``/``col`` (R rows, E entries) expanded to ``heads``
    blocks: row ``r * H + k`` holds row ``r``'s entries in their order, at
    columns ``c * H + k``, with the values of head ``k``. Entry ``(e, k)``
    lands at ``H * crow[r] + k * deg(r) + (e - crow[r])``; built a head at a
    time, so that no [E, H] int64 array is ever held."""
    num_rows, num_entries = crow.numel() - 1, col.numel()
    dtype = index_dtype(num_entries * heads, num_cols * heads)
    device = crow.device
    crow64 = crow.to(torch.int64)
    degrees = crow64[1:] - crow64[:-1]
    starts = heads * crow64[:-1]  # row r's first place, head 0
    expanded_crow = torch.empty(num_rows * heads + 1, dtype=dtype, device=device)
    expanded_crow[-1] = num_entries * heads
    expanded_col = torch.empty(num_entries * heads, dtype=dtype, device=device)
    order = torch.empty(num_entries * heads, dtype=dtype, device=device)
    row_of = torch.repeat_interleave(torch.arange(num_rows, device=device), degrees)
    # Entry e's place for head 0: its row's start plus its rank in the row.
    rank = torch.arange(num_entries, device=device) - crow64[:-1][row_of]
    place = starts[row_of] + rank
    step = degrees[row_of]  # from head k to head k + 1: the row's length
    del row_of, rank
    shifted = col.to(torch.int64) * heads
    entries = torch.arange(num_entries, dtype=torch.int64, device=device) * heads
    for k in range(heads):
        expanded_crow[k : num_rows * heads : heads] = starts + k * degrees
        at = place + k * step
        expanded_col[at] = (shifted + k).to(dtype)
        order[at] = (entries + k).to(dtype)
    return HeadsIndex(expanded_crow, expanded_col, order)


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
        """The destinations' own rows of ``h_src`` (float [num_src, ...] ->
        [num_dst, ...]): the first ``num_dst``, or those ``dst_index`` names."""
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
        """float32 [E]: ``1/sqrt(out_deg(src) * in_deg(dst))`` from this graph's own
        degrees (zero degrees count as one)."""
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
        """Sparse CSR [num_dst * H, num_src * H]: one block of the adjacency per
        head, row ``d * H + k`` holding row ``d``'s edges with head ``k``'s
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


class _CSRSpMM(torch.autograd.Function):
    """``out[d] = sum_e w[e] * h[src[e]]`` over in-edges ``e`` of ``d``.

    ``weight`` is [E] for h [S, F] or [E, H] for h [S, H, F]; ``weight_t`` is
    ``weight[perm]`` when the caller has it cached (else it is gathered here).
    Gradients flow to ``h`` and, when it requires them, to ``weight``.

    Per-head weights take one product over every head, forward and backward
    (:meth:`MessageGraph.heads_adjacency`): a product per head read each
    head's strided rows through a copy, and stacked the heads' results; one
    thread, 8 heads of 128 over 720,000 edges (60,000 x 100,000 rows): the
    forward 0.59-0.79 s -> 0.33-0.35 s, the backward (both gradients)
    1.6-1.7 s -> 1.2-1.3 s. Its index costs 8 bytes per edge and head and
    direction, kept with the graph.
    """

    @staticmethod
    def forward(  # type: ignore[override]
        ctx: Any,
        mg: MessageGraph,
        weight: torch.Tensor,
        weight_t: torch.Tensor | None,
        h: torch.Tensor,
    ) -> torch.Tensor:
        ctx.mg = mg
        ctx.weight_t = weight_t
        ctx.save_for_backward(weight, h if ctx.needs_input_grad[1] else None)
        if h.dim() == 2:
            return spmm(mg.adjacency(weight), h)
        num_src, heads, width = h.shape
        product = spmm(mg.heads_adjacency(weight), h.reshape(num_src * heads, width))
        return product.view(mg.num_dst, heads, width)

    @staticmethod
    def backward(  # type: ignore[override]
        ctx: Any, grad_out: torch.Tensor
    ) -> tuple[None, torch.Tensor | None, None, torch.Tensor | None]:
        mg: MessageGraph = ctx.mg
        weight, h = ctx.saved_tensors
        grad_out = grad_out.contiguous()
        grad_h = grad_w = None
        if ctx.needs_input_grad[3]:
            weight_t = ctx.weight_t
            if weight_t is None:
                weight_t = weight[mg._transpose[2]]
            if grad_out.dim() == 2:
                grad_h = spmm(mg.adjacency_t(weight_t), grad_out)
            else:
                num_dst, heads, width = grad_out.shape
                adjacency_t = mg.heads_adjacency(weight_t, transposed=True)
                rows = grad_out.view(num_dst * heads, width)
                grad_h = spmm(adjacency_t, rows).view(mg.num_src, heads, width)
        if ctx.needs_input_grad[1]:
            # Sampled dense-dense product: <grad_out[dst(e)], h[src(e)]> per edge.
            grad_w = edge_dots(mg, grad_out, h)
        return None, grad_w, None, grad_h


def spmm_sum(
    mg: MessageGraph, h_src: torch.Tensor, weight: torch.Tensor | None = None
) -> torch.Tensor:
    """Weighted sum of source rows into each destination.

    Args:
        mg: the message graph.
        h_src: float [num_src, F], or [num_src, H, F].
        weight: optional per-edge weights: [E], shared by every head of a 3-D
            ``h_src``, or [E, H] (one per head, 3-D ``h_src`` only); ``None``
            means all ones. May require grad (GAT attention).

    Returns:
        float [num_dst, F] (or [num_dst, H, F]) in ``h_src``'s dtype.
    """
    if h_src.shape[0] != mg.num_src:
        raise ValueError(
            f"h_src: expected {mg.num_src} rows (num_src), found {h_src.shape[0]}"
        )
    if h_src.dim() == 3 and (weight is None or weight.dim() == 1):
        # One weight per edge for every head: the heads' features are columns
        # of one [S, H * F] product (one sparse product, not H).
        num_src, heads, width = h_src.shape
        flat = spmm_sum(mg, h_src.reshape(num_src, heads * width), weight)
        return flat.view(mg.num_dst, heads, width)
    if weight is not None and weight.dim() != h_src.dim() - 1:
        raise ValueError(
            f"weight: expected [E] or, with h_src [S, H, F], [E, H]; found "
            f"{list(weight.shape)} with h_src {list(h_src.shape)}"
        )
    if weight is not None and weight.dim() == 2 and weight.shape[1] != h_src.shape[1]:
        raise ValueError(
            f"weight: expected one column per head of h_src ({h_src.shape[1]}), "
            f"found {weight.shape[1]}"
        )
    weight_t: torch.Tensor | None = None
    if weight is None:
        # All-ones values: the transpose needs no permutation.
        weight = torch.ones(mg.num_edges, dtype=h_src.dtype)
        weight_t = weight
    else:
        name = mg.own_weight_name(weight)
        if name is not None:
            weight_t = mg.transposed(name, weight).to(h_src.dtype)
        weight = weight.to(h_src.dtype)
    out: torch.Tensor = _CSRSpMM.apply(mg, weight, weight_t, h_src)
    return out


def spmm_mean(mg: MessageGraph, h_src: torch.Tensor) -> torch.Tensor:
    """Mean of source rows over each destination's in-edges (0 where there are none).

    Args:
        mg: the message graph.
        h_src: float [num_src, F] or [num_src, H, F].

    Returns:
        float [num_dst, F] (or [num_dst, H, F]).
    """
    return spmm_sum(mg, h_src, mg.mean_weight)


def edge_softmax(mg: MessageGraph, scores: torch.Tensor) -> torch.Tensor:
    """Softmax of edge scores over each destination's in-edges.

    Subtracts the per-destination maximum first (``scatter_reduce`` amax), so large
    scores do not overflow; the maximum is a constant shift and is detached.

    Args:
        mg: the message graph.
        scores: float [E] or [E, H].

    Returns:
        float, same shape as ``scores``; sums to one over each destination's edges.
    """
    dst = mg.dst_of_edges
    index = dst.view(-1, *([1] * (scores.dim() - 1))).expand_as(scores)
    shape = (mg.num_dst, *scores.shape[1:])
    peak = torch.full(shape, float("-inf"), dtype=scores.dtype)
    peak = peak.scatter_reduce(0, index, scores.detach(), "amax", include_self=True)
    exp = (scores - peak[dst]).exp()
    denom = torch.zeros(shape, dtype=scores.dtype).index_add(0, dst, exp)
    return exp / denom[dst]
