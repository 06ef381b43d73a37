"""G3 (``--exchange g3``): hybrid-parallel peer-to-peer exchange in bins.

The engine and how G3 works: :mod:`graphwire.fullgraph.g3.engine`.
"""
