"""`FastGCNFetcher` and `LadiesFetcher` (``--fetch fastgcn``, ``--fetch ladies``).

DGS's layer-wise baselines (seed ``004``, §3.4): on-demand fetching (a loader
thread ahead of the trainer, remote input rows pulled from their owners,
``kv.pull``) of batches that
:class:`~graphwire.sampler.layerwise.DistLayerSampler` samples layer by
layer: FastGCN from one distribution over all nodes, synced once before
training (``setup.fastgcn``); LADIES from each layer's candidates, with the
probabilities gathered from the destinations' owners every layer of every
batch (``layer.norms``). ``--layer-nodes`` is each layer's ``t``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from graphwire.feature.ondemand import DEFAULT_PREFETCH, PREFETCH_HELP, OnDemand
from graphwire.options import check_options, option
from graphwire.sampler.base import Batch, SampledBatch
from graphwire.sampler.layerwise import DistLayerSampler

__all__ = ["FastGCNConfig", "FastGCNFetcher", "LadiesConfig", "LadiesFetcher"]


@dataclass(frozen=True, kw_only=True, slots=True)
class FastGCNConfig:
    """Layer-wise sampling's settings (FastGCN's; LADIES' are the same)."""

    prefetch: int = option(DEFAULT_PREFETCH, least=1, help=PREFETCH_HELP)
    layer_nodes: int = option(
        512, least=1, help="t: the nodes each layer samples (FastGCN, LADIES)"
    )

    def __post_init__(self) -> None:
        check_options(self)


@dataclass(frozen=True, kw_only=True, slots=True)
class LadiesConfig(FastGCNConfig):
    """LADIES' settings (FastGCN's)."""


class _LayerFetcher(OnDemand):
    """On-demand fetching of layer-wise sampled batches."""

    config: FastGCNConfig  # type: ignore[assignment]
    KIND = ""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        base = self.sampler
        layers = [self.config.layer_nodes] * len(base.fanouts)
        self.layers = DistLayerSampler(
            base.csr, base.book, self.store.transport, layers, self.KIND
        )

    def _sample(self, batch: Batch) -> SampledBatch:
        return self.layers.sample(batch.seeds, batch.seed)

    def finish(self) -> None:
        """Stop the loader, then both samplers' services (collective)."""
        self._stop_loader()
        if self._sampler_open:
            self.layers.close()
        super().finish()

    def counters(self) -> dict[str, Any]:
        return super().counters() | {"layer_sampler": dict(self.layers.counters)}


class FastGCNFetcher(_LayerFetcher):
    """FastGCN's layer-wise sampling, fetched on demand."""

    KIND = "fastgcn"


class LadiesFetcher(_LayerFetcher):
    """LADIES' layer-wise sampling, fetched on demand."""

    KIND = "ladies"
