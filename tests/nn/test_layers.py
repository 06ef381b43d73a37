"""GCN, SAGE and GAT layers against dense-adjacency references, and on blocks.

Tolerances: float64 everywhere except the block tests (float32, default
``assert_close`` tolerances: the same sums in a different order).
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from graphwire.graph.graph import Graph
from graphwire.nn import GATConv, GCNConv, MessageGraph, SAGEConv, build_model
from graphwire.nn.aggregate import spmm_sum
from graphwire.nn.models import projects_first, sums_sources
from graphwire.sampler import UniformNeighborSampler


def _graph(num_nodes: int = 30, num_edges: int = 120, seed: int = 0) -> Graph:
    rng = np.random.default_rng(seed)
    src = rng.integers(0, num_nodes, num_edges)
    dst = rng.integers(0, num_nodes, num_edges)
    x = rng.standard_normal((num_nodes, 5)).astype(np.float32)
    graph = Graph.from_edge_index(src, dst, num_nodes=num_nodes, x=x)
    return graph.deduplicate()


def _adjacency(mg: MessageGraph) -> torch.Tensor:
    """Dense 0/1 float64 [num_dst, num_src]."""
    dense = torch.zeros(mg.num_dst, mg.num_src, dtype=torch.float64)
    dense[mg.dst_of_edges, mg.indices] = 1.0
    return dense


def _gcn_reference(layer: GCNConv, adj: torch.Tensor, h: torch.Tensor) -> torch.Tensor:
    out_deg = adj.sum(0).clamp(min=1)
    in_deg = adj.sum(1).clamp(min=1)
    norm = in_deg.rsqrt().unsqueeze(1) * adj * out_deg.rsqrt().unsqueeze(0)
    assert layer.bias is not None
    return norm @ h @ layer.weight + layer.bias


def _sage_reference(
    layer: SAGEConv, adj: torch.Tensor, h: torch.Tensor
) -> torch.Tensor:
    mean = adj / adj.sum(1, keepdim=True).clamp(min=1)
    assert layer.bias is not None
    num_dst = adj.shape[0]
    return (
        h[:num_dst] @ layer.lin_self.weight.T
        + mean @ h @ layer.lin_neigh.weight.T
        + layer.bias
    )


def _gat_reference(layer: GATConv, adj: torch.Tensor, h: torch.Tensor) -> torch.Tensor:
    z = (h @ layer.lin.weight.T).view(h.shape[0], layer.heads, layer.out_dim)
    score_src = (z * layer.att_src).sum(-1)  # [S, H]
    score_dst = (z[: adj.shape[0]] * layer.att_dst).sum(-1)  # [D, H]
    scores = score_dst.unsqueeze(1) + score_src.unsqueeze(0)  # [D, S, H]
    scores = F.leaky_relu(scores, layer.negative_slope)
    scores = scores.masked_fill(adj.unsqueeze(-1) == 0, float("-inf"))
    alpha = torch.softmax(scores, dim=1).nan_to_num(0.0)  # rows without edges
    out = torch.einsum("dsh,shf->dhf", alpha, z)
    out = out.flatten(1) if layer.concat else out.mean(1)
    assert layer.bias is not None
    return out + layer.bias


@pytest.mark.parametrize("bipartite", [False, True])
def test_gcn_equals_dense_reference(bipartite: bool) -> None:
    torch.manual_seed(0)
    graph = _graph().add_self_loops()
    mg = MessageGraph.from_graph(graph)
    if bipartite:  # only the first 12 nodes are destinations
        cut = int(graph.indptr[12])
        mg = MessageGraph(graph.indptr[:13], graph.indices[:cut], 30, 12)
    for in_dim, out_dim in ((5, 3), (3, 5)):  # both multiplication orders
        layer = GCNConv(in_dim, out_dim).double()
        h = torch.randn(mg.num_src, in_dim, dtype=torch.float64)
        ref = _gcn_reference(layer, _adjacency(mg), h)
        torch.testing.assert_close(layer(mg, h), ref)


def test_gcn_uses_edge_weight_when_given() -> None:
    torch.manual_seed(0)
    graph = _graph()
    weight = torch.rand(graph.num_edges)
    mg = MessageGraph(graph.indptr, graph.indices, 30, 30, weight)
    layer = GCNConv(5, 4)
    h = torch.randn(30, 5)
    dense = torch.zeros(30, 30)
    dense[mg.dst_of_edges, mg.indices] = weight
    assert layer.bias is not None
    torch.testing.assert_close(layer(mg, h), dense @ h @ layer.weight + layer.bias)


@pytest.mark.parametrize("dims", [(5, 3), (3, 5)])
def test_sage_equals_dense_reference(dims: tuple[int, int]) -> None:
    torch.manual_seed(1)
    mg = MessageGraph.from_graph(_graph(seed=1))
    layer = SAGEConv(*dims).double()
    h = torch.randn(30, dims[0], dtype=torch.float64)
    torch.testing.assert_close(layer(mg, h), _sage_reference(layer, _adjacency(mg), h))


@pytest.mark.parametrize("concat", [True, False])
def test_gat_equals_dense_reference(concat: bool) -> None:
    torch.manual_seed(2)
    mg = MessageGraph.from_graph(_graph(seed=2).add_self_loops())
    layer = GATConv(5, 4, heads=3, concat=concat).double()
    h = torch.randn(30, 5, dtype=torch.float64)
    out = layer(mg, h)
    assert out.shape == (30, 12 if concat else 4)
    torch.testing.assert_close(out, _gat_reference(layer, _adjacency(mg), h))


def test_gat_gradients_match_dense_reference() -> None:
    torch.manual_seed(3)
    mg = MessageGraph.from_graph(_graph(seed=3).add_self_loops())
    layer = GATConv(5, 2, heads=2).double()
    h = torch.randn(30, 5, dtype=torch.float64, requires_grad=True)
    upstream = torch.randn(30, 4, dtype=torch.float64)
    params = [h, *layer.parameters()]
    ours = torch.autograd.grad(layer(mg, h), params, upstream)
    ref = torch.autograd.grad(
        _gat_reference(layer, _adjacency(mg), h), params, upstream
    )
    for a, b in zip(ours, ref, strict=True):
        torch.testing.assert_close(a, b)


@pytest.mark.parametrize("kind", ["gcn", "sage", "gat"])
def test_blocks_with_all_neighbours_equal_full_graph(kind: str) -> None:
    """A 2-layer model on sampled blocks (fan-out >= max degree) gives the
    full-graph logits of the seeds. GCN blocks carry the full graph's weights."""
    torch.manual_seed(4)
    graph = _graph(num_nodes=60, num_edges=300, seed=4)
    if kind in ("gcn", "gat"):
        graph = graph.add_self_loops()
    weight = graph.gcn_norm if kind == "gcn" else None
    full = MessageGraph(graph.indptr, graph.indices, 60, 60, weight)
    model = build_model(kind, 5, 8, 3, num_layers=2, heads=2).eval()
    assert graph.x is not None
    expected = model([full, full], graph.x)
    max_degree = int(graph.in_degrees().max())
    sampler = UniformNeighborSampler(graph, [max_degree, 1000], edge_weight=weight)
    seeds = torch.tensor([5, 17, 3, 42, 0, 59])
    batch = sampler.sample(seeds, 0)
    logits = model(batch.blocks, graph.x[batch.input_nid])
    torch.testing.assert_close(logits, expected[seeds])


def test_gat_training_on_blocks_with_hashed_dropout_equals_full_graph() -> None:
    """In training, with a dropout seed, blocks (fan-out >= max degree) give the
    full graph's logits: feature and attention masks follow global node IDs, not
    rows or edge positions. (With ``F.dropout`` attention they would differ.)"""
    torch.manual_seed(5)
    graph = _graph(num_nodes=60, num_edges=300, seed=5).add_self_loops()
    full = MessageGraph(graph.indptr, graph.indices, 60, 60)
    model = build_model("gat", 5, 8, 3, num_layers=2, heads=2, attn_dropout=0.6)
    model.train()
    assert graph.x is not None
    seed = 99
    expected = model([full, full], graph.x, row_ids=torch.arange(60), dropout_seed=seed)
    assert not torch.allclose(expected, model.eval()([full, full], graph.x))
    max_degree = int(graph.in_degrees().max())
    sampler = UniformNeighborSampler(graph, [max_degree, 1000])
    seeds = torch.tensor([5, 17, 3, 42, 0, 59])
    batch = sampler.sample(seeds, 0)
    logits = model.train()(
        batch.blocks,
        graph.x[batch.input_nid],
        row_ids=batch.input_nid,
        dropout_seed=seed,
    )
    torch.testing.assert_close(logits, expected[seeds])


def test_gat_seed_needs_source_ids() -> None:
    mg = MessageGraph.from_graph(_graph(seed=6).add_self_loops())
    layer = GATConv(5, 4, heads=2, attn_dropout=0.5).train()
    h = torch.randn(30, 5)
    with pytest.raises(ValueError, match="needs src_ids"):
        layer(mg, h, seed=1)
    with pytest.raises(ValueError, match=r"src_ids: expected shape \(30,\)"):
        layer(mg, h, src_ids=torch.arange(29), seed=1)
    ids = torch.arange(100, 130)
    hashed = layer(mg, h, src_ids=ids, seed=1)
    torch.testing.assert_close(layer(mg, h, src_ids=ids, seed=1), hashed)
    assert not torch.allclose(layer(mg, h, src_ids=ids, seed=2), hashed)
    layer.eval()  # no dropout: the seed changes nothing
    torch.testing.assert_close(layer(mg, h, src_ids=ids, seed=1), layer(mg, h))


@pytest.mark.parametrize(
    ("layer", "narrows"),
    [
        (GCNConv(5, 3), True),
        (GCNConv(3, 5), False),
        (SAGEConv(5, 3), True),
        (SAGEConv(5, 5), False),
        (GATConv(5, 2, heads=2), True),
        (GATConv(5, 2, heads=3), False),
    ],
    ids=repr,
)
def test_layers_split_into_a_row_projection_and_the_rest(layer, narrows) -> None:
    """What a distributed engine relies on to exchange projected rows: the
    layer says whether its projection narrows rows, the projection is row-wise
    with ``message_width`` columns, and ``propagate`` on projected rows is the
    layer itself."""
    torch.manual_seed(3)
    mg = MessageGraph.from_graph(_graph(seed=3).add_self_loops())
    h = torch.randn(30, 5 if narrows else layer.in_dim)
    assert projects_first(layer) is narrows
    projected = layer.project(h)
    assert projected.shape == (30, layer.message_width)
    torch.testing.assert_close(layer.project(h[7:9]), projected[7:9])
    # A layer that says it reads no destination rows computes without them.
    h_dst = h if layer.reads_dst_rows else None
    torch.testing.assert_close(layer.propagate(mg, projected, h_dst), layer(mg, h))


@pytest.mark.parametrize(
    ("layer", "transforms"),
    [
        (GCNConv(5, 3), True),
        (GCNConv(3, 5), False),
        (SAGEConv(5, 3), True),
        (SAGEConv(5, 5), False),
        (GATConv(5, 2, heads=3, attn_dropout=0.5), True),
    ],
    ids=repr,
)
def test_a_layer_reads_a_table_of_rows_through_dst_index(layer, transforms) -> None:
    """A MessageGraph may name its destinations' source rows (``dst_index``)
    instead of listing them first: every layer then gives the same output and
    gradients as on the rows gathered in the usual order (G3's input layer
    reads its whole table of rows so, when ``transforms_sources`` is false)."""
    torch.manual_seed(5)
    mg = MessageGraph.from_graph(_graph(seed=5).add_self_loops())
    h = torch.randn(30, layer.in_dim, dtype=torch.float32)
    # The same rows at other places in a bigger table: 30 rows among 41.
    where = torch.randperm(41)[:30]
    table = torch.randn(41, layer.in_dim)
    table[where] = h
    moved = MessageGraph(
        mg.indptr, where[mg.indices], 41, 30, dst_index=where[: mg.num_dst]
    )
    ids, table_ids = torch.arange(30), torch.full((41,), -1, dtype=torch.int64)
    table_ids[where] = ids
    assert layer.transforms_sources is transforms
    layer.train()
    kwargs = {"seed": 9} if isinstance(layer, GATConv) else {}
    expected = layer(mg, h, **({"src_ids": ids} | kwargs if kwargs else {}))
    grads = torch.autograd.grad(expected.sum(), list(layer.parameters()))
    out = layer(moved, table, **({"src_ids": table_ids} | kwargs if kwargs else {}))
    torch.testing.assert_close(out, expected)
    for got, want in zip(
        torch.autograd.grad(out.sum(), list(layer.parameters())), grads, strict=True
    ):
        torch.testing.assert_close(got, want)


def test_gat_attention_vectors_take_pygs_glorot_bounds() -> None:
    """PyG's glorot on [1, heads, out_dim]: uniform within sqrt(6 / (heads +
    out_dim)); a [heads * out_dim, 1] view gave sqrt(6 / (heads * out_dim + 1))."""
    torch.manual_seed(0)
    layer = GATConv(16, 8, heads=4)
    bound, narrow = (6 / (4 + 8)) ** 0.5, (6 / (4 * 8 + 1)) ** 0.5
    for att in (layer.att_src, layer.att_dst):
        assert att.shape == (4, 8)
        assert att.abs().max() <= bound
        # 32 draws all inside the narrow bound: probability 0.6**32 ~ 1e-7.
        assert att.abs().max() > narrow


@pytest.mark.parametrize(
    ("layer", "sums"),
    [
        (GCNConv(5, 3), True),
        (GCNConv(3, 5), False),  # does not project first
        (SAGEConv(5, 3), True),
        (GATConv(5, 2, heads=2), False),  # softmax over all its sources
    ],
    ids=repr,
)
def test_a_layer_that_sums_its_sources_is_finish_of_a_weighted_sum(layer, sums) -> None:
    """What G3's summed last layer relies on (``SumsSources``): propagate is
    ``finish`` of the product with ``edge_weights``, so a sum over any split
    of the source rows, finished once, is the layer."""
    assert (sums_sources(layer) is not None) is sums
    if not sums:
        return
    torch.manual_seed(4)
    mg = MessageGraph.from_graph(_graph(seed=4).add_self_loops())
    h = torch.randn(30, 5)
    m = layer.project(h)
    h_dst = h if layer.reads_dst_rows else None
    weight = layer.edge_weights(mg)
    split = mg.indices < 11  # sources 0-10, then the rest
    agg = spmm_sum(mg, m, weight * split) + spmm_sum(mg, m, weight * ~split)
    torch.testing.assert_close(layer.finish(agg, h_dst), layer(mg, h))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("num_dst", [0, 7, 25])
@pytest.mark.parametrize("dst_index", [False, True])
def test_attention_scores_equal_the_products_summed_with_their_gradients(
    dtype, num_dst, dst_index
) -> None:
    """GAT's attention scores: attention_scores equals (z * att_src).sum(-1)
    and (mg.dst_rows(z) * att_dst).sum(-1), and so do the gradients of z and
    both att vectors, on a strided z (a slice of rows), with the destinations
    the first rows or named by dst_index, and with any one input alone
    needing a gradient."""
    from graphwire.nn.gat import attention_scores

    torch.manual_seed(0)
    tol = {"rtol": 1e-5, "atol": 1e-5} if dtype == torch.float32 else {}
    num_src = 25
    index = torch.randperm(num_src)[:num_dst] if dst_index else None
    mg = MessageGraph(
        indptr=torch.zeros(num_dst + 1, dtype=torch.int64),
        indices=torch.zeros(0, dtype=torch.int64),
        num_src=num_src,
        num_dst=num_dst,
        dst_index=index,
    )
    full = torch.randn(40, 3, 5, dtype=dtype)
    atts = torch.randn(2, 3, 5, dtype=dtype)
    grads = torch.randn(num_src, 3, dtype=dtype), torch.randn(num_dst, 3, dtype=dtype)

    def reference(mg, z, a_src, a_dst):
        return (z * a_src).sum(-1), (mg.dst_rows(z) * a_dst).sum(-1)

    for needs in [(True, True, True), (True, False, False), (False, True, False)]:
        results = []
        for fn in (attention_scores, reference):
            z = full.clone().requires_grad_(needs[0])
            a_src = atts[0].clone().requires_grad_(needs[1])
            a_dst = atts[1].clone().requires_grad_(needs[2] or not any(needs[:2]))
            src, dst = fn(mg, z[5:30], a_src, a_dst)
            kept = [i for i, t in enumerate((src, dst)) if t.requires_grad]
            torch.autograd.backward(
                [(src, dst)[i] for i in kept], [grads[i] for i in kept]
            )
            results.append((src.detach(), dst.detach(), z.grad, a_src.grad, a_dst.grad))
        got, want = results
        assert got[0].shape == (num_src, 3) and got[1].shape == (num_dst, 3)
        for a, b in zip(got, want, strict=True):
            assert (a is None) == (b is None)
            if a is not None:
                torch.testing.assert_close(a, b, **tol)
