"""The explainer finds the remote nodes and dimensions a model relies on.

A model is trained on a planted graph where a node's label is the sign of
its in-neighbours' mean of dimension 0 minus dimension 1; the other
dimensions are noise. On an explanation graph whose few *signal* remote
nodes carry dimensions 0 and 1 (the others carry only noise), the node mask
must rank the signal nodes first and the feature mask dimensions 0 and 1.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch
import torch.nn.functional as F

from graphwire.feature.explain import Explainer, ExplainSettings, star_graph
from graphwire.graph.graph import Graph
from graphwire.nn.models import LAYER_KINDS, build_model

DIM, SIGNAL = 8, (0, 1)


def _trained(name: str) -> torch.nn.Module:
    gen = torch.Generator().manual_seed(0)
    n, deg = 800, 6
    x = torch.randn(n, DIM, generator=gen)
    src = torch.randint(0, n, (n * deg,), generator=gen)
    dst = torch.arange(n).repeat_interleave(deg)
    graph = Graph.from_edge_index(src, dst, n)
    kind = LAYER_KINDS[name]
    mg = kind.full_graph(graph)
    mean = torch.zeros(n, DIM).index_add_(0, dst, x[src]) / deg
    y = (mean[:, 0] - mean[:, 1] > 0).long()
    torch.manual_seed(1)
    model = build_model(name, DIM, 16, 2, 2, dropout=0.0)
    opt = torch.optim.Adam(model.parameters(), lr=0.05)
    for _ in range(100):
        opt.zero_grad()
        F.cross_entropy(model([mg, mg], x), y).backward()
        opt.step()
    acc = (model([mg, mg], x).argmax(1) == y).float().mean()
    assert acc > 0.85, acc
    return model


@pytest.fixture
def one_thread() -> Iterator[None]:
    """As a worker runs (many small ops: threads only contend)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def test_the_masks_rank_the_planted_nodes_and_dimensions_first(
    one_thread: None,
) -> None:
    name = "sage"
    model = _trained(name)
    gen = torch.Generator().manual_seed(2)
    m, signal = 60, 6
    remote = torch.randn(m, DIM, generator=gen)
    remote[:, list(SIGNAL)] = 0.0
    remote[:signal, 0] = 3.0  # the signal nodes push towards class 1
    remote[:signal, 1] = -3.0
    local = torch.zeros(DIM)
    explainer = Explainer(
        model, LAYER_KINDS[name], local, remote, ExplainSettings(epochs=100), seed=0
    )
    # Online, rounds of 100 steps, each from the last one's masks.
    losses = [explainer.explain(model.state_dict()) for _ in range(3)]
    out = losses[-1]
    assert explainer.rounds == 3 and out.epochs == 100 and out.cpu_s > 0
    assert losses[0].loss > losses[1].loss > out.loss
    top_nodes = set(out.node_mask.argsort(descending=True)[:signal].tolist())
    assert top_nodes == set(range(signal)), out.node_mask
    top_dims = set(out.feature_mask.argsort(descending=True)[: len(SIGNAL)].tolist())
    assert top_dims == set(SIGNAL), out.feature_mask
    # Far apart, not only in order.
    assert float(out.node_mask[:signal].min()) > 2 * float(out.node_mask[signal:].max())


def test_the_star_has_one_edge_per_remote_node() -> None:
    star = star_graph(3, LAYER_KINDS["sage"])
    assert star.indptr.tolist() == [0, 3, 3, 3, 3]
    assert sorted(star.indices.tolist()) == [1, 2, 3]
    looped = star_graph(3, LAYER_KINDS["gcn"])
    assert looped.num_edges == 3 + 4 and looped.edge_weight is not None
