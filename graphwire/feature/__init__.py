"""Feature stores: node features and labels by global ID, local or pulled.

:class:`~graphwire.feature.base.FeatureStore` is the interface (and
:class:`~graphwire.feature.base.TensorStore` the single-process store);
:class:`~graphwire.feature.dist.DistFeatureStore` shards rows by owner and
pulls remote ones over a request/response service (DistDGL's KV store),
with sparse embeddings updated by their owner.
"""
