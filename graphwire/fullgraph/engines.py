"""The full-graph exchange engines, by name (``--exchange NAME``): one line each."""

from __future__ import annotations

from graphwire.fullgraph.base import Engine
from graphwire.fullgraph.broadcast import BroadcastConfig, BroadcastEngine
from graphwire.fullgraph.g3.config import G3Config
from graphwire.fullgraph.g3.engine import G3Engine
from graphwire.fullgraph.halo import HaloConfig, HaloEngine
from graphwire.fullgraph.replicate import ReplicateConfig, ReplicateEngine
from graphwire.fullgraph.switch import SwitchConfig, SwitchEngine
from graphwire.run.registry import Registry

__all__ = ["EXCHANGES"]

EXCHANGES = Registry("exchange", mode="fullgraph", default="g3", base=Engine)
EXCHANGES.register(
    "halo",
    HaloEngine,
    HaloConfig,
    about="DistDGL/BNS-GCN baseline: all boundary rows in one all-to-all per "
    "layer, then compute",
)
EXCHANGES.register(
    "replicate",
    ReplicateEngine,
    ReplicateConfig,
    about="DGL/ROC-style: the L-hop halo replicated and recomputed, nothing "
    "exchanged per layer",
)
EXCHANGES.register(
    "g3",
    G3Engine,
    G3Config,
    about="G3: each boundary row once to each peer that needs it, in bins "
    "overlapped with compute",
)
EXCHANGES.register(
    "broadcast",
    BroadcastEngine,
    BroadcastConfig,
    about="SANCUS/CAGNET: every block of rows broadcast per layer, skipped "
    "while its cached copies are within --staleness",
)
EXCHANGES.register(
    "switch",
    SwitchEngine,
    SwitchConfig,
    about="SwitchGNN: each boundary row once to an emulated switch that sums it "
    "into the aggregators of the rows that read it",
)
