"""Aggregation primitives: dense references, gradcheck, caching, validation."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from graphwire.graph.graph import Graph
from graphwire.nn.aggregate import spmm_mean, spmm_sum
from graphwire.nn.base import MessageGraph
from graphwire.nn.edges import edge_dots, edge_softmax
from graphwire.nn.sparse import sparse_csr, spmm


def _bipartite(num_src: int, num_dst: int, num_edges: int, seed: int) -> MessageGraph:
    """A random bipartite MessageGraph (duplicates allowed, some empty rows)."""
    rng = np.random.default_rng(seed)
    dst = np.sort(rng.integers(0, num_dst, num_edges))
    src = rng.integers(0, num_src, num_edges)
    indptr = np.zeros(num_dst + 1, dtype=np.int64)
    np.cumsum(np.bincount(dst, minlength=num_dst), out=indptr[1:])
    return MessageGraph(
        torch.from_numpy(indptr), torch.from_numpy(src), num_src, num_dst
    )


def _dense(mg: MessageGraph, weight: torch.Tensor | None = None) -> torch.Tensor:
    """Dense [num_dst, num_src] matrix: the sum of edge weights per (dst, src)."""
    values = torch.ones(mg.num_edges, dtype=torch.float64) if weight is None else weight
    dense = torch.zeros(mg.num_dst, mg.num_src, dtype=values.dtype)
    return dense.index_put_((mg.dst_of_edges, mg.indices), values, accumulate=True)


@given(
    num_src=st.integers(1, 12),
    extra=st.integers(0, 5),
    num_edges=st.integers(0, 40),
    seed=st.integers(0, 1000),
)
def test_sum_and_mean_match_dense_products(num_src, extra, num_edges, seed) -> None:
    mg = _bipartite(num_src + extra, num_src, num_edges, seed)
    h = torch.randn(mg.num_src, 3, dtype=torch.float64)
    weight = torch.rand(mg.num_edges, dtype=torch.float64)
    dense = _dense(mg)
    torch.testing.assert_close(spmm_sum(mg, h), dense @ h)
    torch.testing.assert_close(spmm_sum(mg, h, weight), _dense(mg, weight) @ h)
    mean = dense / dense.sum(1, keepdim=True).clamp(min=1)
    torch.testing.assert_close(spmm_mean(mg, h), mean @ h)


def _csr(num_dst: int, num_src: int, num_edges: int, index, dtype) -> torch.Tensor:
    """A random sparse CSR [num_dst, num_src] (some rows without entries)."""
    rng = np.random.default_rng(3)
    dst = np.sort(rng.integers(0, max(num_dst, 1), num_edges))
    indptr = np.zeros(num_dst + 1, dtype=np.int64)
    np.cumsum(np.bincount(dst, minlength=num_dst), out=indptr[1:])
    src = rng.integers(0, max(num_src, 1), num_edges)
    return sparse_csr(
        torch.from_numpy(indptr).to(index),
        torch.from_numpy(src).to(index),
        torch.rand(num_edges, dtype=dtype),
        (num_dst, num_src),
    )


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("index", [torch.int32, torch.int64])
@pytest.mark.parametrize(
    ("num_dst", "num_src", "num_edges", "width"),
    [(40, 30, 200, 5), (40, 30, 3, 5), (40, 30, 0, 5), (0, 30, 0, 5), (40, 0, 0, 5)],
)
def test_spmm_writes_what_sparse_mm_gives_without_calling_it(
    monkeypatch, dtype, index, num_dst, num_src, num_edges, width
) -> None:
    """Bit for bit torch.sparse.mm's values, rows without entries too (the
    result starts uninitialised: NaN here), for contiguous and strided rows."""
    a = _csr(num_dst, num_src, num_edges, index, dtype)
    rows = torch.randn(num_src, 3, width, dtype=dtype)
    cases = [rows[:, 0].contiguous(), rows[:, 1]]
    expected = [torch.sparse.mm(a, h) for h in cases]
    new_empty = torch.Tensor.new_empty

    def nan_filled(self, *args, **kwargs):
        return new_empty(self, *args, **kwargs).fill_(float("nan"))

    monkeypatch.setattr(torch.Tensor, "new_empty", nan_filled)
    monkeypatch.setattr(torch.sparse, "mm", None)
    for h, want in zip(cases, expected, strict=True):
        assert torch.equal(spmm(a, h), want)


def test_spmm_is_differentiable_where_autograd_records_it() -> None:
    mg = _bipartite(9, 6, 30, seed=2)
    a = sparse_csr(mg.indptr, mg.indices, torch.rand(30, dtype=torch.float64), (6, 9))
    h = torch.randn(9, 4, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda h: spmm(a, h), (h,))
    with torch.no_grad():
        assert not spmm(a, h).requires_grad


def _gathered_dots(mg: MessageGraph, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """The reference: both ends' rows of every edge gathered at once."""
    return (a[mg.dst_of_edges] * b[mg.indices]).sum(-1)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("heads", [None, 1, 3])
@pytest.mark.parametrize("num_edges", [0, 1, 57])
def test_edge_dots_match_the_gathered_products(dtype, heads, num_edges) -> None:
    """Duplicate edges and destinations without edges included (_bipartite);
    the rows are strided views, as GAT's heads are."""
    mg = _bipartite(11, 7, num_edges, seed=num_edges)
    shape = (4,) if heads is None else (heads, 4)
    # Rows laid out column-major: views whose rows are not contiguous.
    a = torch.randn(*reversed(shape), 7, dtype=dtype).transpose(0, -1)
    b = torch.randn(*reversed(shape), 11, dtype=dtype).transpose(0, -1)
    got = edge_dots(mg, a, b)
    assert got.shape == ((num_edges,) if heads is None else (num_edges, heads))
    assert got.dtype == dtype
    torch.testing.assert_close(got, _gathered_dots(mg, a, b))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_edge_dots_of_more_edges_than_the_graph_has_places(dtype) -> None:
    """A multigraph with more edges than num_dst * num_src (repeated edges):
    torch's sampled product refuses its pattern, so the dots are gathered
    (it raised "only sparse compressed tensors with the same number of
    specified elements")."""
    for num_src, num_dst, num_edges in [(13, 9, 120), (4, 1, 5), (2, 1, 3)]:
        mg = _bipartite(num_src, num_dst, num_edges, seed=num_edges)
        a = torch.randn(num_dst, 2, 5, dtype=dtype)
        b = torch.randn(num_src, 2, 5, dtype=dtype)
        torch.testing.assert_close(edge_dots(mg, a, b), _gathered_dots(mg, a, b))


def test_edge_dots_take_the_sampled_product_without_gathering_rows(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """float32 on CPU: one sampled_addmm per head and no [E, H, F] gather
    (before, a[dst] and b[src] held 4 GB for GAT on a million edges)."""
    mg = _bipartite(30, 20, 200, seed=3)
    a, b = torch.randn(20, 2, 5), torch.randn(30, 2, 5)
    want = _gathered_dots(mg, a, b)
    calls = []
    sampled = torch.sparse.sampled_addmm

    def counted(*args, **kwargs):
        calls.append(args[1].shape)
        return sampled(*args, **kwargs)

    monkeypatch.setattr(torch.sparse, "sampled_addmm", counted)
    got = edge_dots(mg, a, b)
    assert calls == [(20, 5), (20, 5)]
    torch.testing.assert_close(got, want)


def test_edge_dots_elsewhere_gather_a_block_of_edges_at_a_time(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """bfloat16 (no sampled kernel): the gathered path, in blocks smaller
    than the edges, gives the one-shot gather's values."""
    import graphwire.nn.edges as edges

    monkeypatch.setattr(edges, "_DOTS_BLOCK", 16)
    mg = _bipartite(30, 20, 200, seed=4)
    a = torch.randn(20, 3, 5).to(torch.bfloat16)
    b = torch.randn(30, 3, 5).to(torch.bfloat16)
    torch.testing.assert_close(edge_dots(mg, a, b), _gathered_dots(mg, a, b))
    assert edge_dots(_bipartite(30, 20, 0, seed=4), a, b).shape == (0, 3)


def test_gradcheck_sum_mean_and_edge_weights() -> None:
    mg = _bipartite(9, 6, 30, seed=1)
    h = torch.randn(9, 4, dtype=torch.float64, requires_grad=True)
    w = torch.rand(30, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda h: spmm_sum(mg, h), (h,))
    assert torch.autograd.gradcheck(lambda h, w: spmm_sum(mg, h, w), (h, w))
    assert torch.autograd.gradcheck(lambda h: spmm_mean(mg, h), (h,))
    # Per-head weights (GAT): h [S, H, F], w [E, H].
    h3 = torch.randn(9, 2, 3, dtype=torch.float64, requires_grad=True)
    w3 = torch.rand(30, 2, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda h, w: spmm_sum(mg, h, w), (h3, w3))


def test_gradcheck_with_cached_graph_weights() -> None:
    """The cached transposed edge_weight gives the same gradient as a fresh one."""
    base = _bipartite(7, 7, 25, seed=2)
    weight = torch.rand(25, dtype=torch.float64)
    mg = MessageGraph(base.indptr, base.indices, 7, 7, weight)
    h = torch.randn(7, 3, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda h: spmm_sum(mg, h, mg.edge_weight), (h,))
    assert mg.own_weight_name(mg.edge_weight) == "edge_weight"
    (grad,) = torch.autograd.grad(spmm_sum(mg, h, mg.edge_weight).sum(), h)
    (fresh,) = torch.autograd.grad(spmm_sum(mg, h, weight.clone()).sum(), h)
    torch.testing.assert_close(grad, fresh)
    torch.testing.assert_close(
        grad, _dense(mg, weight).sum(0).unsqueeze(1).expand(7, 3)
    )


def test_a_shared_weight_applies_to_every_head_of_3d_rows() -> None:
    """h [S, H, F] with no weight, an [E] weight or spmm_mean: every head is
    aggregated with the same per-edge weights (it raised IndexError)."""
    mg = _bipartite(9, 6, 30, seed=8)
    h = torch.randn(9, 2, 3, dtype=torch.float64, requires_grad=True)
    w = torch.rand(30, dtype=torch.float64, requires_grad=True)
    dense = _dense(mg)
    torch.testing.assert_close(spmm_sum(mg, h), torch.einsum("ds,shf->dhf", dense, h))
    torch.testing.assert_close(
        spmm_sum(mg, h, w), torch.einsum("ds,shf->dhf", _dense(mg, w), h)
    )
    mean = dense / dense.sum(1, keepdim=True).clamp(min=1)
    torch.testing.assert_close(spmm_mean(mg, h), torch.einsum("ds,shf->dhf", mean, h))
    assert torch.autograd.gradcheck(lambda h, w: spmm_sum(mg, h, w), (h, w))
    with pytest.raises(ValueError, match=r"one column per head of h_src \(2\)"):
        spmm_sum(mg, h, torch.rand(30, 3, dtype=torch.float64))
    with pytest.raises(ValueError, match=r"weight: expected \[E\] or"):
        spmm_sum(mg, h[:, 0], torch.rand(30, 2, dtype=torch.float64))


@pytest.mark.parametrize(("num_edges", "heads"), [(0, 3), (1, 1), (45, 3), (200, 8)])
def test_per_head_weights_use_one_product_over_every_head(num_edges, heads) -> None:
    """GAT's per-head weights [E, H]: one sparse product of the heads' blocks
    (row d * H + k, column s * H + k) over the rows viewed as [S * H, F]. Its
    values and both gradients equal each head's own product, it keeps the
    in-edge order of every row (float32: the same sums, bit for bit, as one
    head's product alone), and its index is built once per head count and
    direction."""
    mg = _bipartite(13, 9, num_edges, seed=num_edges)
    h = torch.randn(13, heads, 5, requires_grad=True)
    w = torch.rand(num_edges, heads, requires_grad=True)
    out = spmm_sum(mg, h, w)
    for k in range(heads):  # each head alone: the [E] weight path
        torch.testing.assert_close(
            out[:, k], spmm_sum(mg, h[:, k], w[:, k]), rtol=0, atol=0
        )
    grad = torch.randn_like(out)
    grad_h, grad_w = torch.autograd.grad(out, (h, w), grad)
    dense = torch.stack([_dense(mg, w[:, k].double()) for k in range(heads)])
    expected_h = torch.einsum("kds,dkf->skf", dense, grad.double())
    torch.testing.assert_close(grad_h.double(), expected_h, rtol=1e-5, atol=1e-5)
    src, dst = mg.indices, mg.dst_of_edges
    expected_w = (grad[dst] * h[src]).sum(-1)
    torch.testing.assert_close(grad_w, expected_w.detach(), rtol=1e-5, atol=1e-5)
    if heads == 1:  # the adjacency itself: no index of its own
        assert not mg._heads_index
    else:
        index = mg._heads_index[(heads, False)]
        spmm_sum(mg, h, w)  # again: the same index, not a new one
        assert mg._heads_index[(heads, False)] is index
        assert set(mg._heads_index) == {(heads, False), (heads, True)}
    strided = torch.randn(13, 5, heads).transpose(1, 2)  # not contiguous
    torch.testing.assert_close(
        spmm_sum(mg, strided, w.detach()),
        spmm_sum(mg, strided.contiguous(), w.detach()),
        rtol=0,
        atol=0,
    )


def test_a_graph_weight_that_requires_grad_backpropagates_every_step() -> None:
    """An edge_weight parameter is not cached: a second backward neither crashes
    ("backward through the graph a second time") nor reuses the first's values."""
    base = _bipartite(7, 7, 25, seed=6)
    weight = torch.nn.Parameter(torch.rand(25, dtype=torch.float64))
    mg = MessageGraph(base.indptr, base.indices, 7, 7, weight)
    h = torch.randn(7, 3, dtype=torch.float64, requires_grad=True)
    for _ in range(2):
        grad_h, grad_w = torch.autograd.grad(
            spmm_sum(mg, h, mg.edge_weight).sum(), (h, weight)
        )
        ref_h, ref_w = torch.autograd.grad((_dense(mg, weight) @ h).sum(), (h, weight))
        torch.testing.assert_close(grad_h, ref_h)
        torch.testing.assert_close(grad_w, ref_w)
        with torch.no_grad():
            weight.mul_(3)


def test_an_in_place_change_to_a_graph_weight_rebuilds_its_transpose() -> None:
    """The cached weight[perm] follows the weight's version counter."""
    base = _bipartite(7, 7, 25, seed=7)
    weight = torch.rand(25, dtype=torch.float64)
    mg = MessageGraph(base.indptr, base.indices, 7, 7, weight)
    h = torch.randn(7, 3, dtype=torch.float64, requires_grad=True)
    spmm_sum(mg, h, mg.edge_weight).sum().backward()
    weight.mul_(10)
    (grad,) = torch.autograd.grad(spmm_sum(mg, h, mg.edge_weight).sum(), h)
    torch.testing.assert_close(
        grad, _dense(mg, weight).sum(0).unsqueeze(1).expand(7, 3)
    )


def test_float32_gradient_matches_dense_autograd() -> None:
    mg = _bipartite(50, 40, 300, seed=3)
    h = torch.randn(50, 8, requires_grad=True)
    upstream = torch.randn(40, 8)
    (ours,) = torch.autograd.grad(spmm_mean(mg, h), h, upstream)
    dense = _dense(mg).float()
    dense = dense / dense.sum(1, keepdim=True).clamp(min=1)
    (ref,) = torch.autograd.grad(dense @ h, h, upstream)
    torch.testing.assert_close(ours, ref)


def test_edge_softmax_is_a_stable_per_destination_softmax() -> None:
    mg = _bipartite(8, 5, 24, seed=4)
    scores = torch.randn(24, 3, dtype=torch.float64) * 5 + 1000  # would overflow exp
    alpha = edge_softmax(mg, scores)
    assert torch.isfinite(alpha).all()
    dense = torch.full((5, 24, 3), float("-inf"), dtype=torch.float64)
    dense[mg.dst_of_edges, torch.arange(24)] = scores
    ref = torch.softmax(dense, dim=1)[mg.dst_of_edges, torch.arange(24)]
    torch.testing.assert_close(alpha, ref)
    sums = torch.zeros(5, 3, dtype=torch.float64).index_add(0, mg.dst_of_edges, alpha)
    has_edges = mg.in_degrees() > 0
    torch.testing.assert_close(sums[has_edges], torch.ones_like(sums[has_edges]))
    s = torch.randn(24, 2, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda s: edge_softmax(mg, s), (s,))


def test_from_graph_and_degree_views() -> None:
    graph = Graph.from_edge_index(
        torch.tensor([0, 1, 2, 2]), torch.tensor([1, 2, 0, 1]), num_nodes=3
    )
    mg = MessageGraph.from_graph(graph)
    assert (mg.num_src, mg.num_dst, mg.num_edges) == (3, 3, 4)
    assert mg.edge_weight is None
    looped = MessageGraph.from_graph(graph, add_self_loops=True, gcn_weights=True)
    assert looped.num_edges == 7
    assert looped.edge_weight is not None
    torch.testing.assert_close(looped.edge_weight, graph.add_self_loops().gcn_norm)
    # The block's own symmetric normalisation equals gcn_norm on a full graph.
    torch.testing.assert_close(looped.sym_norm, looped.edge_weight)
    assert mg.out_degrees.tolist() == [1, 1, 2]


def test_transpose_is_built_once() -> None:
    mg = _bipartite(6, 4, 12, seed=5)
    h = torch.randn(6, 2, requires_grad=True)
    spmm_mean(mg, h).sum().backward()
    first = mg._transpose
    spmm_mean(mg, h).sum().backward()
    assert mg._transpose is first
    assert mg.transposed("mean_weight", mg.mean_weight) is mg.transposed(
        "mean_weight", mg.mean_weight
    )


def test_bad_shapes_are_rejected() -> None:
    indptr, indices = torch.tensor([0, 1, 2]), torch.tensor([0, 1])
    with pytest.raises(ValueError, match="num_src"):
        MessageGraph(indptr, indices, 1, 2)
    with pytest.raises(ValueError, match="indptr"):
        MessageGraph(indptr, indices, 3, 3)
    with pytest.raises(ValueError, match="int64"):
        MessageGraph(indptr.int(), indices, 2, 2)
    with pytest.raises(ValueError, match="edge_weight"):
        MessageGraph(indptr, indices, 2, 2, torch.ones(3))
    mg = MessageGraph(indptr, indices, 2, 2)
    with pytest.raises(ValueError, match="h_src"):
        spmm_sum(mg, torch.ones(3, 1))


@pytest.mark.parametrize(
    ("indptr", "indices", "match"),
    [
        (
            [0, 1, 2],
            [0, 5],
            r"source rows must lie in \[0, num_src = 2\), found "
            r"range \[0, 5\]",
        ),
        ([0, 1, 2], [0, -1], r"source rows .* found range \[-1, 0\]"),
        ([0, 1, 5], [0, 1], r"indptr: must end at len\(indices\) = 2, found 5"),
        ([1, 1, 2], [0, 1], r"indptr: must start at 0, found 1"),
        ([0, 3, 2], [0, 1], r"non-decreasing, found indptr\[1\] = 3 > indptr\[2\]"),
        ([0, 2], [0, 1], r"indptr: expected shape \[num_dst \+ 1 = 3\]"),
    ],
)
def test_invalid_csr_is_refused(indptr, indices, match) -> None:
    # The CSR kernels skip invariant checks: these read stray memory or crash.
    with pytest.raises(ValueError, match=match):
        MessageGraph(torch.tensor(indptr), torch.tensor(indices), 2, 2)


def test_edgeless_csr_is_valid() -> None:
    empty = torch.zeros(0, dtype=torch.int64)
    mg = MessageGraph(torch.zeros(3, dtype=torch.int64), empty, 4, 2)
    assert torch.equal(spmm_sum(mg, torch.ones(4, 2)), torch.zeros(2, 2))
    assert MessageGraph(torch.zeros(1, dtype=torch.int64), empty, 0, 0).num_dst == 0


@pytest.mark.parametrize(
    ("dst_index", "match"),
    [
        (torch.tensor([0, 1], dtype=torch.int32), r"dst_index: expected int64"),
        (torch.tensor([0]), r"dst_index: expected int64 \[num_dst = 2\]"),
        (torch.tensor([0, 3]), r"dst_index: .* found range \[0, 3\]"),
        (torch.tensor([-1, 1]), r"dst_index: .* found range \[-1, 1\]"),
    ],
)
def test_a_bad_dst_index_is_refused(dst_index, match) -> None:
    indptr, indices = torch.tensor([0, 1, 2]), torch.tensor([0, 2])
    with pytest.raises(ValueError, match=match):
        MessageGraph(indptr, indices, 3, 2, dst_index=dst_index)


def test_dst_rows_are_the_first_rows_or_those_dst_index_names() -> None:
    h = torch.arange(8.0).view(4, 2)
    indptr, indices = torch.tensor([0, 1, 2]), torch.tensor([0, 3])
    assert torch.equal(MessageGraph(indptr, indices, 4, 2).dst_rows(h), h[:2])
    named = MessageGraph(indptr, indices, 4, 2, dst_index=torch.tensor([3, 1]))
    assert torch.equal(named.dst_rows(h), h[[3, 1]])
