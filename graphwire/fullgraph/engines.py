"""Imports every built-in full-graph engine so that it registers itself."""

from graphwire.fullgraph import (
    halo,  # noqa: F401
    p2p,  # noqa: F401
    replicate,  # noqa: F401
)
