"""The synthetic generators: deterministic, well-formed, and shaped as promised."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from graphwire.graph import synthetic
from graphwire.graph.synthetic import (
    ProductsConfig,
    RmatConfig,
    products_graph,
    rmat_graph,
)

NAN, INF = float("nan"), float("inf")


def _assert_simple_symmetric(graph) -> None:
    src, dst = (t.numpy() for t in graph.edge_index())
    assert not np.any(src == dst), "self-loops"
    keys = dst * graph.num_nodes + src
    assert np.unique(keys).size == keys.size, "duplicate edges"
    reverse = np.sort(src * graph.num_nodes + dst)
    assert np.array_equal(np.sort(keys), reverse), "not symmetric"


def test_products_same_seed_same_graph() -> None:
    config = dict(nodes=3000, degree=8, features=16, classes=5)
    a = products_graph(ProductsConfig(**config, seed=3))
    b = products_graph(ProductsConfig(**config, seed=3))
    c = products_graph(ProductsConfig(**config, seed=4))
    for field in ("indptr", "indices", "x", "y", "train_idx", "val_idx", "test_idx"):
        assert torch.equal(getattr(a, field), getattr(b, field)), field
    assert not torch.equal(a.y, c.y)


def test_products_shape_and_structure() -> None:
    cfg = ProductsConfig(nodes=20_000, degree=12, features=32, classes=10, seed=0)
    graph = products_graph(cfg)
    _assert_simple_symmetric(graph)
    assert graph.num_nodes == 20_000
    # Dedup and self-loop removal lose a little; the mean degree stays close.
    assert 0.9 * 12 <= graph.num_edges / graph.num_nodes <= 12
    assert graph.x.shape == (20_000, 32) and graph.x.dtype == torch.float32
    assert graph.num_classes == 10
    src, dst = graph.edge_index()
    homophily = float((graph.y[src] == graph.y[dst]).float().mean())
    assert homophily == pytest.approx(cfg.homophily, abs=0.05)
    degrees = graph.in_degrees().numpy()
    assert degrees.max() > 10 * degrees.mean(), "expected a heavy-tailed degree"
    splits = [graph.train_idx, graph.val_idx, graph.test_idx]
    assert sum(s.numel() for s in splits) == graph.num_nodes
    assert torch.unique(torch.cat(splits)).numel() == graph.num_nodes
    assert graph.train_idx.numel() == int(cfg.train_fraction * cfg.nodes)
    # Popular nodes train (like the sales-rank split of ogbn-products).
    assert degrees[graph.train_idx].mean() > degrees[graph.test_idx].mean()


def test_products_features_carry_class_signal() -> None:
    graph = products_graph(ProductsConfig(nodes=5000, features=64, classes=4))
    centroids = torch.stack([graph.x[graph.y == k].mean(0) for k in range(4)])
    nearest = torch.cdist(graph.x, centroids).argmin(1)
    own = float((nearest == graph.y).float().mean())
    assert own > 0.3  # better than the 0.25 chance of 4 classes


def test_rmat_structure_and_options() -> None:
    graph = rmat_graph(RmatConfig(scale=12, edge_factor=8, features=5, classes=3))
    _assert_simple_symmetric(graph)
    assert graph.num_nodes == 4096
    assert graph.x.shape == (4096, 5)
    assert graph.num_classes == 3
    bare = rmat_graph(RmatConfig(scale=8, edge_factor=4))
    assert bare.x is None and bare.y is None
    again = rmat_graph(RmatConfig(scale=8, edge_factor=4))
    assert torch.equal(bare.indices, again.indices)
    # R-MAT skew: the busiest node has far more than the mean degree.
    degrees = graph.in_degrees().float()
    assert float(degrees.max()) > 8 * float(degrees.mean())


@pytest.mark.parametrize(
    "bad",
    [
        dict(nodes=1),
        dict(degree=0),
        dict(homophily=1.5),
        dict(exponent=1.0),
        dict(train_fraction=0.6, val_fraction=0.5),
        dict(classes=1),
        dict(classes=0),
        dict(features=-1),
        dict(nodes=2**31 + 1),  # edge keys lo * nodes + hi would overflow int64
        # NaN passes every comparison-based range check: these gave all-NaN
        # features, an edgeless graph or a numpy error deep inside.
        dict(degree=NAN),
        dict(homophily=NAN),
        dict(exponent=NAN),
        dict(exponent=INF),
        dict(signal=NAN),
        dict(signal=INF),
        dict(signal=-1.0),  # signal had no range check at all
        dict(train_fraction=NAN),
        dict(val_fraction=NAN),
        dict(seed=-1),  # numpy's "expected non-negative integer" named no option
        dict(seed=2**63),
    ],
)
def test_products_rejects_bad_config(bad) -> None:
    with pytest.raises(ValueError, match=f"^{next(iter(bad))}"):  # names the option
        ProductsConfig(**bad)


def test_products_signal_range_is_inclusive() -> None:
    """0 (pure-noise features) and the cap 1e6 are both allowed."""
    for signal in (0.0, 1e6):
        graph = products_graph(ProductsConfig(nodes=200, degree=4, signal=signal))
        assert graph.x is not None and bool(torch.isfinite(graph.x).all())


def test_products_degree_is_a_target_before_dedup() -> None:
    """``degree`` sets how many pairs are drawn; self-loops and repeats are
    dropped afterwards, so the realised mean is lower on small graphs, as the
    docstring says (15.7 at 5,000 nodes, 17.3 at 20,000 for degree=20)."""
    means = []
    for nodes in (5000, 20_000):
        graph = products_graph(ProductsConfig(nodes=nodes, features=0, seed=0))
        means.append(graph.num_edges / nodes)
    assert means[0] == pytest.approx(15.7, abs=0.1)
    assert means[1] == pytest.approx(17.3, abs=0.1)


def test_a_graph_too_big_for_memory_is_refused_before_allocating(
    monkeypatch,
) -> None:
    """numpy's MemoryError (or "Maximum allowed dimension exceeded") named no
    option; now the size options and the bytes they need are named."""
    monkeypatch.setattr(synthetic, "_machine_memory", lambda: 1 << 20)

    def no_allocation(*args, **kwargs):
        raise AssertionError("the generator started before the size check")

    monkeypatch.setattr(np.random, "default_rng", no_allocation)
    with pytest.raises(
        ValueError,
        match=(
            r"^synthetic:products: nodes=1000 with degree=20.0, features=1000 and "
            r"classes=47 needs [0-9.]+ MiB of memory \(3.81 MiB for x, .* KiB "
            r"for the edge arrays, .*\), more than this machine's 1 MiB$"
        ),
    ):
        products_graph(ProductsConfig(nodes=1000, features=1000))
    with pytest.raises(ValueError, match=r"^synthetic:rmat: scale=16 with edge"):
        rmat_graph(RmatConfig(scale=16))
    with pytest.raises(ValueError, match=r"features=1048576 needs .*\(1 GiB for x"):
        rmat_graph(RmatConfig(scale=8, edge_factor=1, features=1 << 20))
    monkeypatch.undo()
    # The same check lets a small graph through.
    monkeypatch.setattr(synthetic, "_machine_memory", lambda: 1 << 20)
    assert products_graph(ProductsConfig(nodes=1000, features=0)).num_nodes == 1000


def test_rmat_rejects_bad_config() -> None:
    with pytest.raises(ValueError, match="scale"):
        RmatConfig(scale=0)
    with pytest.raises(ValueError):
        RmatConfig(a=0.5, b=0.3, c=0.3)
    # classes=0 means "no labels"; one class would train to a meaningless 1.0.
    for classes in (1, -1):
        with pytest.raises(ValueError, match="classes: must be 0 .* or at least 2"):
            RmatConfig(classes=classes)
    with pytest.raises(ValueError, match="features: must be >= 0"):
        RmatConfig(features=-1)
    # NaN shares passed the range check and gave a graph with no edges.
    for share in ("a", "b", "c"):
        for value in (NAN, INF, -0.1):
            with pytest.raises(ValueError, match=f"^{share}: must be a finite"):
                RmatConfig(**{share: value})
    with pytest.raises(ValueError, match=r"^classes: .* at most the 2\*\*scale = 16"):
        RmatConfig(scale=4, classes=17)
    with pytest.raises(ValueError, match=r"^seed: expected an int in \[0, 2\*\*63\)"):
        RmatConfig(seed=-1)
