"""Imports every built-in full-graph engine so that it registers itself."""

from graphwire.fullgraph import (
    halo,  # noqa: F401
    replicate,  # noqa: F401
)
from graphwire.fullgraph.g3 import engine as g3  # noqa: F401
