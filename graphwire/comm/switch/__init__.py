"""SwitchGNN's emulated programmable switch and the workers' side of it.

- :mod:`.frames`: the wire format;
- :mod:`.core`: the data plane (match tables, aggregator pool, overflow,
  bypass, block-complete multicast, loss);
- :mod:`.server`: the switch process (a TCP listener, ECN marking);
- :mod:`.link`: a worker's connection;
- :mod:`.exchange`: one pass of rows through the switch, block by block,
  with SwitchGNN's reliability;
- :mod:`.plan`: blocks and send orders of one row width.

The engine that trains through it is :mod:`graphwire.fullgraph.switch`.
"""
