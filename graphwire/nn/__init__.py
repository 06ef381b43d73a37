"""GNN layers (GCN, GraphSAGE, GAT) written against one aggregation interface."""

from graphwire.nn.aggregate import spmm_mean, spmm_sum
from graphwire.nn.base import MessageGraph
from graphwire.nn.edges import edge_softmax
from graphwire.nn.gat import GATConv
from graphwire.nn.gcn import GCNConv
from graphwire.nn.models import GNN, LAYER_KINDS, build_model
from graphwire.nn.sage import SAGEConv

__all__ = [
    "GATConv",
    "GCNConv",
    "GNN",
    "LAYER_KINDS",
    "MessageGraph",
    "SAGEConv",
    "build_model",
    "edge_softmax",
    "spmm_mean",
    "spmm_sum",
]
