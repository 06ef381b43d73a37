"""`owned_csr`: a rank's stored in-edges as the model kind samples them.

The distributed sampler (:mod:`graphwire.sampler.dist`) samples the in-edges
of owned nodes from the graph the model expects (``A`` for GraphSAGE, ``A + I``
for GAT, ``A + I`` with ``gcn_norm`` weights for GCN), in global IDs. This is
the same local graph the full-graph engines aggregate over
(:func:`~graphwire.run.local_graph.local_message_graph`, whose GCN weights use
the global degrees), with sources mapped to global IDs and the rank's first
global edge ID from the ranks' edge counts (``setup.edges``).
"""

from __future__ import annotations

from graphwire.comm.base import Transport
from graphwire.comm.plan import ExchangePlan
from graphwire.nn.models import LayerKind
from graphwire.partition.local import LocalPart
from graphwire.run.local_graph import local_message_graph
from graphwire.sampler.dist import OwnedCSR

__all__ = ["owned_csr"]


def owned_csr(part: LocalPart, transport: Transport, kind: LayerKind) -> OwnedCSR:
    """Collective: this rank's :class:`OwnedCSR` for layers of ``kind``."""
    plan = ExchangePlan.build(part, transport)
    graph = local_message_graph(part, plan, transport, kind)
    counts = transport.all_gather_object(graph.num_edges, "setup.edges")
    return OwnedCSR(
        start=part.global_range[0],
        indptr=graph.indptr,
        indices=part.local_to_global_table.index_select(0, graph.indices),
        weight=graph.edge_weight,
        edge_offset=sum(counts[: transport.rank]),
    )
