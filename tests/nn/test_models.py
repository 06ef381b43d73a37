"""build_model and GNN: registry, widths, the fetch hook, dropout placement and
the keywords that hash GAT's attention dropout."""

from __future__ import annotations

import pytest
import torch

from graphwire.graph.graph import Graph
from graphwire.graph.seeds import derive_seed
from graphwire.nn import (
    LAYER_KINDS,
    GATConv,
    GCNConv,
    MessageGraph,
    SAGEConv,
    build_model,
)
from graphwire.nn.models import ATTENTION_STREAM, feature_dropout, layer_call_kwargs


def _ring(n: int = 10) -> MessageGraph:
    src = torch.arange(n)
    graph = Graph.from_edge_index(
        torch.cat([src, (src + 1) % n]), torch.cat([(src + 1) % n, src]), num_nodes=n
    )
    return MessageGraph.from_graph(graph, add_self_loops=True)


@pytest.mark.parametrize("kind", sorted(LAYER_KINDS))
@pytest.mark.parametrize("num_layers", [1, 2, 3])
def test_output_shape_and_backward(kind: str, num_layers: int) -> None:
    torch.manual_seed(0)
    mg = _ring()
    model = build_model(kind, 6, 4, 3, num_layers=num_layers, heads=2)
    assert model.num_layers == num_layers
    x = torch.randn(10, 6)
    out = model([mg] * num_layers, x)
    assert out.shape == (10, 3)
    out.sum().backward()
    assert all(p.grad is not None for p in model.parameters())


@pytest.mark.parametrize("kind", sorted(LAYER_KINDS))
def test_parameters_are_float32_under_a_float64_default(kind: str) -> None:
    """Graph features are float32: a caller's ``set_default_dtype(float64)``
    must not give float64 weights (a dtype mismatch deep in the forward), nor
    other initial values."""
    torch.manual_seed(0)
    expected = build_model(kind, 6, 4, 3, heads=2).state_dict()
    previous = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    try:
        torch.manual_seed(0)
        model = build_model(kind, 6, 4, 3, heads=2)
    finally:
        torch.set_default_dtype(previous)
    for name, tensor in model.state_dict().items():
        assert torch.equal(tensor, expected[name]), name
    assert model([_ring()] * 2, torch.randn(10, 6)).dtype == torch.float32


def test_gat_hidden_layers_concatenate_heads() -> None:
    model = build_model("gat", 6, 4, 3, num_layers=3, heads=5, out_heads=2)
    first, middle, last = model.layers
    assert isinstance(first, GATConv) and isinstance(last, GATConv)
    assert (first.in_dim, first.output_width) == (6, 20)
    assert isinstance(middle, GATConv) and middle.in_dim == 20
    assert (last.heads, last.concat, last.output_width) == (2, False, 3)


def test_fetch_is_called_per_layer_with_the_current_rows() -> None:
    torch.manual_seed(0)
    mg = _ring()
    model = build_model("sage", 6, 4, 3, num_layers=2).eval()
    x = torch.randn(10, 6)
    calls: list[tuple[int, tuple[int, ...]]] = []

    def fetch(layer: int, h: torch.Tensor) -> torch.Tensor:
        calls.append((layer, tuple(h.shape)))
        return h

    torch.testing.assert_close(model([mg, mg], x, fetch), model([mg, mg], x))
    assert calls == [(0, (10, 6)), (1, (10, 4))]


def test_fetch_can_append_halo_rows() -> None:
    """A MessageGraph over 4 owned + 2 halo rows, the halo supplied by fetch,
    gives the full graph's output on the owned rows."""
    torch.manual_seed(1)
    full = _ring(6)
    model = build_model("gcn", 3, 4, 2, num_layers=1).eval()
    x = torch.randn(6, 3)
    # Rows 0-3 are owned, 4-5 are halo. Block-local degrees would differ from
    # the full graph's, so the owned graph carries the full graph's weights, as
    # a distributed engine's would.
    num_owned_edges = int(full.indptr[4])
    owned = MessageGraph(
        full.indptr[:5],
        full.indices[:num_owned_edges],
        6,
        4,
        full.sym_norm[:num_owned_edges],
    )
    full_w = MessageGraph(full.indptr, full.indices, 6, 6, full.sym_norm)
    out = model([owned], x[:4], lambda layer, h: torch.cat([h, x[4:]]))
    torch.testing.assert_close(out, model([full_w], x)[:4])


def test_dropout_only_in_training() -> None:
    torch.manual_seed(0)
    mg = _ring()
    model = build_model("gcn", 6, 4, 3, dropout=0.9)
    x = torch.randn(10, 6)
    model.eval()
    torch.testing.assert_close(model([mg, mg], x), model([mg, mg], x))
    model.train()
    assert not torch.equal(model([mg, mg], x), model([mg, mg], x))


def test_bad_arguments() -> None:
    with pytest.raises(ValueError, match="unknown layer kind"):
        build_model("gin", 2, 2, 2)
    with pytest.raises(ValueError, match="num_layers"):
        build_model("gcn", 2, 2, 2, num_layers=0)
    model = build_model("gcn", 2, 2, 2, num_layers=2)
    with pytest.raises(ValueError, match="one MessageGraph per layer"):
        model([_ring()], torch.randn(10, 2))


@pytest.mark.parametrize(
    "kind, args, kwargs, message",
    [
        ("gcn", (3, 0, 2), {}, "hidden: expected an integer >= 1, got 0"),
        ("sage", (3, -4, 2), {}, "hidden: expected an integer >= 1, got -4"),
        ("gat", (3, 4, 0), {}, "out_dim: expected an integer >= 1, got 0"),
        ("sage", (0, 4, 2), {}, "in_dim: expected an integer >= 1, got 0"),
        ("gat", (3, 4, 2), {"heads": 0}, "heads: expected an integer >= 1, got 0"),
        ("gat", (3, 4, 2), {"out_heads": 0}, "out_heads: expected .* got 0"),
        ("gcn", (3, 4.0, 2), {}, "hidden: expected an integer >= 1, got 4.0"),
    ],
)
def test_impossible_sizes_are_refused_naming_the_argument(
    kind, args, kwargs, message
) -> None:
    """hidden 0 built a model whose output was its bias; heads 0 a GAT with
    no attention; all were accepted silently."""
    with pytest.raises(ValueError, match=f"^{message}$"):
        build_model(kind, *args, **kwargs)


@pytest.mark.parametrize(
    "make, message",
    [
        (lambda: GCNConv(3, 0), "GCNConv out_dim: expected an integer >= 1, got 0"),
        (lambda: SAGEConv(-1, 2), "SAGEConv in_dim: expected .* got -1"),
        (lambda: GATConv(3, 2, heads=0), "GATConv heads: expected .* got 0"),
        (lambda: GATConv(3, 2, heads=-1), "GATConv heads: expected .* got -1"),
    ],
)
def test_layers_refuse_impossible_sizes(make, message) -> None:
    with pytest.raises(ValueError, match=f"^{message}$"):
        make()


@pytest.mark.parametrize(
    "kind, kwargs, message",
    [
        ("gcn", {"dropout": 5.0}, r"dropout: expected a value in \[0, 1\), got 5.0"),
        ("sage", {"dropout": -0.1}, r"dropout: .* got -0.1"),
        ("gcn", {"input_dropout": 1.0}, r"input_dropout: .* got 1.0"),
        ("gat", {"attn_dropout": 1.5}, r"attn_dropout: .* got 1.5"),
        ("gcn", {"dropout": float("nan")}, r"dropout: .* got nan"),
        ("gcn", {"dropout": "0.5"}, r"dropout: expected a number, got '0.5'"),
    ],
)
def test_dropout_outside_0_1_is_refused_when_built(kind, kwargs, message) -> None:
    # It used to be accepted and to fail (or train on NaNs) only in forward.
    with pytest.raises(ValueError, match=message):
        build_model(kind, 3, 4, 2, 2, **kwargs)


@pytest.mark.parametrize("density", [0.02, 0.9])
def test_feature_dropout_matches_dropout_statistics(density: float) -> None:
    """Zeros stay zero; each non-zero is kept with probability 1 - p and scaled
    by 1 / (1 - p) (sparse inputs take the non-zero path, dense ones F.dropout)."""
    gen = torch.Generator().manual_seed(0)
    x = torch.rand(400, 250, generator=gen)
    x = x * (torch.rand(400, 250, generator=gen) < density)
    torch.manual_seed(0)
    out = feature_dropout(x, 0.6, training=True)
    assert bool((out[x == 0] == 0).all())
    kept = (out != 0) & (x != 0)
    torch.testing.assert_close(out[kept], x[kept] / 0.4)
    rate = float(kept.sum()) / float((x != 0).sum())
    assert abs(rate - 0.4) < 0.03
    assert feature_dropout(x, 0.6, training=False) is x
    assert feature_dropout(x, 0.0, training=True) is x


def test_feature_dropout_of_zeros_that_need_a_gradient_drops_their_gradient() -> None:
    """Zero entries are kept as zeros either way, but where ``x`` needs a
    gradient the mask must cover them too: about ``p`` of the gradient is 0."""
    torch.manual_seed(0)
    x = torch.zeros(100, 64, requires_grad=True)
    feature_dropout(x, 0.6, training=True).sum().backward()
    assert x.grad is not None
    dropped = float((x.grad == 0).float().mean())
    assert 0.5 < dropped < 0.7
    assert torch.equal(x.grad.unique(), torch.tensor([0.0, 2.5]))


def test_layer_call_kwargs_only_for_attention_dropout_in_training() -> None:
    gat = build_model("gat", 6, 4, 3, num_layers=2, heads=2, attn_dropout=0.5)
    no_attn = build_model("gat", 6, 4, 3, num_layers=2, heads=2)
    gcn = build_model("gcn", 6, 4, 3, num_layers=2)
    ids = torch.arange(10)
    kwargs = [layer_call_kwargs(gat.layers[i], i, 7, True, ids) for i in (0, 1)]
    assert all(k["src_ids"] is ids for k in kwargs)
    seeds = {k["seed"] for k in kwargs}
    # One seed per layer, none shared with feature dropout's derive_seed(7, l).
    assert seeds == {derive_seed(7, ATTENTION_STREAM, i) for i in (0, 1)}
    assert len(seeds | {derive_seed(7, i) for i in range(4)}) == 6
    assert layer_call_kwargs(gat.layers[0], 0, 7, False, ids) == {}
    assert layer_call_kwargs(gat.layers[0], 0, None, True, ids) == {}
    assert layer_call_kwargs(no_attn.layers[0], 0, 7, True, ids) == {}
    assert layer_call_kwargs(gcn.layers[0], 0, 7, True, ids) == {}


def test_hashed_gat_dropout_is_independent_of_node_numbering() -> None:
    """Renumbering the nodes (rows, edges and row_ids alike) permutes the
    training logits: every mask follows the global IDs."""
    torch.manual_seed(2)
    n = 40
    gen = torch.Generator().manual_seed(3)
    src, dst = torch.randint(0, n, (2, 160), generator=gen)
    graph = Graph.from_edge_index(src, dst, num_nodes=n).deduplicate()
    model = build_model("gat", 6, 4, 3, num_layers=2, heads=2, attn_dropout=0.6)
    model.train()
    x = torch.randn(n, 6)
    mg = MessageGraph.from_graph(graph, add_self_loops=True)
    out = model([mg, mg], x, row_ids=torch.arange(n), dropout_seed=5)
    perm = torch.randperm(n, generator=gen)  # new row i is old node perm[i]
    new_of_old = torch.argsort(perm)
    edges = graph.edge_index()
    renumbered = Graph.from_edge_index(
        new_of_old[edges[0]], new_of_old[edges[1]], num_nodes=n
    )
    mg2 = MessageGraph.from_graph(renumbered, add_self_loops=True)
    out2 = model([mg2, mg2], x[perm], row_ids=perm, dropout_seed=5)
    torch.testing.assert_close(out2, out[perm])
