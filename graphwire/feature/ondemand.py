"""`OnDemand` (``--fetch on-demand``): DistDGL's fetch, batch by batch.

Each batch is sampled when the trainer reaches it (the owner-compute sampler:
remote frontiers are sampled by their owners, ``sample.hop``), and its input
rows are read where they live: local rows from this rank's shard, remote ones
with one pull per owner (``kv.pull``). Nothing is cached or made ahead.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from graphwire.feature.cache import assemble_inputs
from graphwire.feature.fetcher import Fetched, Fetcher
from graphwire.sampler.base import Batch

__all__ = ["OnDemand", "OnDemandConfig"]


@dataclass(frozen=True, kw_only=True, slots=True)
class OnDemandConfig:
    """On-demand fetching has no settings."""


class OnDemand(Fetcher):
    """Sample each batch now and pull its remote input rows from their owners."""

    def get(self, batch: Batch, stats: dict[str, float]) -> Fetched:
        began = time.perf_counter()
        sampled = self.sampler.sample(batch.seeds, batch.seed)
        sampled_at = time.perf_counter()
        local = self.store.is_local(sampled.input_nid)
        x, counts = assemble_inputs(self.store, None, sampled.input_nid, local, "pull")
        y = self.store.labels(sampled.seeds)
        stats["sample_s"] += sampled_at - began
        stats["fetch_s"] += time.perf_counter() - sampled_at
        for name, value in counts.items():
            stats[name] += value
        return sampled, x, y
