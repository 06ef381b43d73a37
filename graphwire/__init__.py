"""graphwire: distributed GNN training with small, visible, fast communication."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from graphwire.graph.graph import Graph, GraphError

__all__ = ["Graph", "GraphError"]
__version__ = "0.1.0"


def __getattr__(name: str) -> Any:
    # Imported on first use, so that the CLI (graphwire/cli.py) can set torch's
    # environment under a launcher before anything imports torch.
    if name in __all__:
        from graphwire.graph import graph

        return getattr(graph, name)
    raise AttributeError(f"module 'graphwire' has no attribute {name!r}")
