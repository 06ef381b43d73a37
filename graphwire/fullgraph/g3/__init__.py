"""G3 (``--exchange g3``): hybrid-parallel peer-to-peer exchange in bins.

- :mod:`~graphwire.fullgraph.g3.engine`: the engine, :class:`G3Engine`
  (how G3 works: its module docstring).
- :mod:`~graphwire.fullgraph.g3.config`: its settings, :class:`G3Config`.
- :mod:`~graphwire.fullgraph.g3.bins`, :mod:`~graphwire.fullgraph.g3.messages`:
  the node order, the bins and the messages, planned once.
- :mod:`~graphwire.fullgraph.g3.schedule`: the ablation modes, when rows are
  sent and when a bin computes.
- :mod:`~graphwire.fullgraph.g3.forward`, :mod:`~graphwire.fullgraph.g3.backward`,
  :mod:`~graphwire.fullgraph.g3.stack`: one step, as one autograd node.
- :mod:`~graphwire.fullgraph.g3.wire`: the messages in flight.
- :mod:`~graphwire.fullgraph.g3.table`: the input layer over one table.
- :mod:`~graphwire.fullgraph.g3.sums`: a last layer summed message by message.
- :mod:`~graphwire.fullgraph.g3.sync`: parameter synchronisation.
- :mod:`~graphwire.fullgraph.g3.stale`: bounded staleness on the messages.
"""
