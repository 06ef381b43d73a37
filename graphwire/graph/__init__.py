"""Graphs (CSR), file formats, dataset loaders and synthetic generators."""

from graphwire.graph.graph import Graph, GraphError

__all__ = ["Graph", "GraphError"]
