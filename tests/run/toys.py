"""A toy exchange engine and a toy fetcher, each added with one registry call.

They are real strategies, small ones, whose setting shows in the ledger: the
toy exchange is the halo exchange that also sums ``toy_rows`` floats over the
ranks at every layer (tag ``toy.rows``); the toy fetcher is on-demand
fetching that sums ``toy_every`` floats at every epoch's start (tag
``toy.fetch``). Workers import this module when they unpickle a toy's config,
which registers both there.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from graphwire.feature.ondemand import OnDemand, OnDemandConfig
from graphwire.fullgraph.engines import EXCHANGES
from graphwire.fullgraph.halo import HaloEngine
from graphwire.minibatch.fetchers import FETCHERS
from graphwire.options import check_options, option


@dataclass(frozen=True, kw_only=True, slots=True)
class ToyExchangeConfig:
    """The toy exchange's one setting."""

    toy_rows: int = option(1, least=1, help="toy: rows per counted layer")

    def __post_init__(self) -> None:
        check_options(self)


class ToyExchange(HaloEngine):
    """The halo exchange, summing ``toy_rows`` floats at every layer."""

    config_type = ToyExchangeConfig
    config: ToyExchangeConfig

    def run_layer(self, index: int, *rest: Any) -> torch.Tensor:
        ones = torch.ones(self.config.toy_rows)
        self.transport.all_reduce_sum(ones, f"{self.phase}toy.rows")
        return super().run_layer(index, *rest)


@dataclass(frozen=True, kw_only=True, slots=True)
class ToyFetchConfig(OnDemandConfig):
    """The toy fetcher's setting, beside on-demand's."""

    toy_every: int = option(2, least=1, help="toy fetch: floats summed per epoch")

    def __post_init__(self) -> None:
        check_options(self)


class ToyFetch(OnDemand):
    """On-demand fetching that sums ``toy_every`` floats at each epoch's start."""

    config: ToyFetchConfig

    def begin_epoch(self, epoch: int) -> None:
        super().begin_epoch(epoch)
        ones = torch.ones(self.config.toy_every)
        self.store.transport.all_reduce_sum(ones, "toy.fetch")


def register() -> None:
    """Add both toys (again: a no-op)."""
    EXCHANGES.register("toy", ToyExchange, ToyExchangeConfig, about="a toy exchange")
    FETCHERS.register("toy", ToyFetch, ToyFetchConfig, about="a toy fetcher")


def unregister() -> None:
    EXCHANGES.unregister("toy")
    FETCHERS.unregister("toy")


register()
