"""graphwire: distributed GNN training with small, visible, fast communication."""

from graphwire.graph.graph import Graph, GraphError

__all__ = ["Graph", "GraphError"]
__version__ = "0.1.0"
