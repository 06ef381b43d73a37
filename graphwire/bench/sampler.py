"""Uniform neighbour sampler throughput: sampled edges per second on one thread.

Samples 2-layer blocks (fan-outs [10, 25], input layer first, as DGL writes
them) around batches of 1000 training seeds of the synthetic products graph,
with torch limited to one thread, and reports sampled edges per second beside
the 2 M/s target. Batches are timed one by one; the figure uses the median
batch so a noisy neighbour on a shared machine moves it little.
"""

from __future__ import annotations

import statistics
import time
from typing import Any

import torch

from graphwire.bench.registry import BenchOptions, target_note
from graphwire.graph.synthetic import ProductsConfig, products_graph
from graphwire.sampler.uniform import UniformNeighborSampler

FANOUTS = [10, 25]
BATCH = 1000
TARGET = 2_000_000


def run(options: BenchOptions) -> dict[str, Any]:
    graph = products_graph(
        ProductsConfig(nodes=options.nodes, degree=20, features=100, seed=options.seed)
    )
    assert graph.train_idx is not None
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        sampler = UniformNeighborSampler(graph, FANOUTS, seed=options.seed)
        order = graph.train_idx[
            torch.randperm(
                graph.train_idx.numel(),
                generator=torch.Generator().manual_seed(options.seed),
            )
        ]
        batches = max(10, 10 * options.repeat)
        sampler.sample(order[:BATCH], 0)  # warm-up
        rates, edges, num_seeds = [], 0, 0
        for b in range(batches):
            seeds = order[(b * BATCH) % order.numel() :][:BATCH]
            start = time.perf_counter()
            batch = sampler.sample(seeds, b + 1)
            seconds = time.perf_counter() - start
            rates.append(batch.num_sampled_edges / seconds)
            edges += batch.num_sampled_edges
            num_seeds += seeds.numel()
    finally:
        torch.set_num_threads(threads)
    rate = statistics.median(rates)
    # A small graph has fewer training seeds than a batch (or a short last one).
    sizes = (
        f"batch {BATCH}"
        if num_seeds == BATCH * batches
        else f"{num_seeds / batches:,.0f} seeds per batch on average (batches of "
        f"up to {BATCH} from {order.numel():,} training nodes)"
    )
    print(
        f"sampler: {graph.num_nodes:,} nodes, fan-outs {FANOUTS}, {sizes}, "
        f"{batches} batches, {edges / batches:,.0f} sampled edges per batch, 1 thread"
    )
    print(
        f"sampler: {rate / 1e6:.2f} M sampled edges/s/thread = "
        f"{rate / TARGET:.2f}x the 2 M/s target{target_note(options)}"
    )
    return {
        "edges_per_s": rate,
        "batches": batches,
        "seeds_per_batch": num_seeds / batches,
        "over_target": rate / TARGET,
    }
