"""Full-graph GCN epoch: graphwire's layers vs a plain ``torch.sparse.mm`` model.

Both models are the same 2-layer GCN (hidden 256, ReLU, dropout 0.5) over the
same normalised ``A + I`` with the same initial weights, and both run the same
epoch: forward on every node, cross-entropy on the training nodes, backward,
one Adam step. The reference is what a PyTorch user would write: the adjacency
as a ``torch.sparse_csr_tensor`` and ``torch.sparse.mm`` with autograd doing the
backward. It multiplies by the weight before or after aggregating in the same
order as graphwire (the narrower side goes through the sparse product), so the
ratio compares the sparse kernels and their backward, not the algebra.

Epochs alternate between the two models (after a warm-up of each) so that
machine noise hits both alike; the result is the ratio of the median epochs.
"""

from __future__ import annotations

import statistics
import time
import warnings
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from graphwire.bench.registry import BenchOptions, target_note
from graphwire.graph.graph import Graph
from graphwire.graph.synthetic import ProductsConfig, products_graph
from graphwire.nn.models import LAYER_KINDS, build_model

HIDDEN = 256
DROPOUT = 0.5


class ReferenceGCN(nn.Module):
    """Plain-PyTorch GCN: ``Â (h W) + b`` with ``torch.sparse.mm``."""

    def __init__(self, adjacency: torch.Tensor, dims: list[int]) -> None:
        super().__init__()
        self.adjacency = adjacency
        self.weights = nn.ParameterList(
            nn.Parameter(torch.empty(a, b))
            for a, b in zip(dims, dims[1:], strict=False)
        )
        self.biases = nn.ParameterList(nn.Parameter(torch.zeros(b)) for b in dims[1:])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = x
        last = len(self.weights) - 1
        for index, (weight, bias) in enumerate(
            zip(self.weights, self.biases, strict=True)
        ):
            h = F.dropout(h, DROPOUT, self.training)
            if weight.shape[0] > weight.shape[1]:
                h = torch.sparse.mm(self.adjacency, h @ weight)
            else:
                h = torch.sparse.mm(self.adjacency, h) @ weight
            h = h + bias
            if index < last:
                h = F.relu(h)
        return h


def _epoch(
    step: Any, optimizer: torch.optim.Optimizer, graph: Graph, x: torch.Tensor
) -> float:
    assert graph.y is not None and graph.train_idx is not None
    start = time.perf_counter()
    logits = step(x)
    loss = F.cross_entropy(logits[graph.train_idx], graph.y[graph.train_idx])
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    optimizer.step()
    return time.perf_counter() - start


def run(options: BenchOptions) -> dict[str, Any]:
    graph = products_graph(
        ProductsConfig(nodes=options.nodes, degree=20, features=100, seed=options.seed)
    )
    assert graph.x is not None and graph.y is not None
    x = graph.x
    classes = int(graph.y.max()) + 1
    kind = LAYER_KINDS["gcn"]
    mg = kind.full_graph(graph)
    prepared, weight = kind.prepare(graph)
    assert weight is not None
    with warnings.catch_warnings():  # "CSR support is in beta"
        warnings.simplefilter("ignore", UserWarning)
        adjacency = torch.sparse_csr_tensor(
            prepared.indptr,
            prepared.indices,
            weight,
            (graph.num_nodes, graph.num_nodes),
            check_invariants=False,
        )

    torch.manual_seed(options.seed)
    ours = build_model("gcn", x.shape[1], HIDDEN, classes, 2, DROPOUT)
    reference = ReferenceGCN(adjacency, [x.shape[1], HIDDEN, classes])
    with torch.no_grad():  # identical starting weights
        for layer, w, b in zip(
            ours.layers, reference.weights, reference.biases, strict=True
        ):
            w.copy_(layer.weight)
            b.copy_(layer.bias)
    ours.train()
    reference.train()
    mgs = [mg, mg]
    runs = {
        "graphwire": (
            lambda h: ours(mgs, h),
            torch.optim.Adam(ours.parameters(), lr=0.01),
        ),
        "torch.sparse.mm": (
            reference,
            torch.optim.Adam(reference.parameters(), lr=0.01),
        ),
    }
    times: dict[str, list[float]] = {name: [] for name in runs}
    for step, optimizer in runs.values():  # warm-up, not counted
        _epoch(step, optimizer, graph, x)
    for _ in range(options.repeat):
        for name, (step, optimizer) in runs.items():
            times[name].append(_epoch(step, optimizer, graph, x))
    medians = {name: statistics.median(values) for name, values in times.items()}
    ratio = medians["graphwire"] / medians["torch.sparse.mm"]
    print(
        f"gcn-epoch: {graph.num_nodes:,} nodes, {prepared.num_edges:,} edges with "
        f"self-loops, F={x.shape[1]}, hidden {HIDDEN}, {classes} classes, "
        f"{torch.get_num_threads()} threads, {options.repeat} alternating epochs each"
    )
    print(
        f"gcn-epoch: graphwire / torch.sparse.mm median epoch time = {ratio:.2f}x "
        f"(below 1: graphwire faster; target <= 1.0x{target_note(options)})"
    )
    return {
        "nodes": graph.num_nodes,
        "edges": prepared.num_edges,
        "threads": torch.get_num_threads(),
        "repeat": options.repeat,
        "ratio": ratio,
        "median_s": medians,
    }
