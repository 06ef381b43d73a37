"""The mini-batch fetchers, by name (``--fetch NAME``): one line each."""

from __future__ import annotations

from graphwire.feature.dgs import DGSConfig, DGSFetcher
from graphwire.feature.fetcher import Fetcher
from graphwire.feature.layerwise import (
    FastGCNConfig,
    FastGCNFetcher,
    LadiesConfig,
    LadiesFetcher,
)
from graphwire.feature.ondemand import OnDemandConfig
from graphwire.feature.rapid import RapidConfig, RapidStore
from graphwire.minibatch.bytegnn import ScheduledOnDemand
from graphwire.run.registry import Registry

__all__ = ["FETCHERS"]

FETCHERS = Registry("fetch", mode="minibatch", default="on-demand", base=Fetcher)
FETCHERS.register(
    "on-demand",
    ScheduledOnDemand,
    OnDemandConfig,
    about="DistDGL: sample each batch now, pull its remote input rows "
    "(--schedule bytegnn: ByteGNN's task graphs)",
)
FETCHERS.register(
    "rapid",
    RapidStore,
    RapidConfig,
    about="RapidGNN: presampled schedule, hot-row cache and prefetcher",
)
FETCHERS.register(
    "dgs",
    DGSFetcher,
    DGSConfig,
    about="DGS: explanation-guided local and important picks, top-N_f dimensions",
)
FETCHERS.register(
    "fastgcn",
    FastGCNFetcher,
    FastGCNConfig,
    about="FastGCN: layer-wise importance sampling from one synced distribution",
)
FETCHERS.register(
    "ladies",
    LadiesFetcher,
    LadiesConfig,
    about="LADIES: layer-wise sampling, probabilities synced every layer",
)
