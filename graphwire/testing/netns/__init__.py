"""Shaped network namespaces: a throwaway namespace whose loopback is bandwidth-shaped.

Tests and benchmarks run workers inside it so that bytes on the wire cost real
wall-clock time, as on a 1–10 Gbit/s cluster (ARCHITECTURE §4, network emulation).
Only loopback addresses (127.0.0.0/8) exist in the namespace, so nothing it runs
can reach another machine.

Two shaping modes, both on ``lo`` (every packet in the namespace leaves through
it, so each byte is shaped once):

- **One shared link** (default): a ``tbf`` root qdisc at ``rate_mbit``. All
  workers share it in both directions: 4 workers at 1000 Mbit/s are roughly 4
  machines with 250 Mbit/s NICs.
- **Per-address links** (``per_address={"127.0.0.2": 250, ...}``): an ``htb``
  root with one class per address, matched on the packet's *destination*. A
  class caps what is sent *to* that address (its downlink); a process's uplink
  is not capped separately. Traffic to other addresses uses a default class at
  ``rate_mbit``, or is unshaped when ``rate_mbit`` is None; so does IPv6
  (``::1``, and IPv4-mapped sockets such as c10d's TCPStore). For the cap to
  apply to both directions of a TCP connection, both ends must use their own
  address (listen on it, and bind before connecting). gloo does not: a device
  made with ``create_device(hostname="127.0.0.2")`` listens there, but the
  peer connects from 127.0.0.1, so only half of each pair's traffic is
  classed. Use the shared link for gloo benchmarks.

torch.distributed gloo workers started with `ShapedNetwork.popen` work with
``MASTER_ADDR=127.0.0.1``; set ``GLOO_SOCKET_IFNAME=lo`` so gloo does not
depend on what the machine's hostname resolves to (the namespace has only
``lo``).

``rate_mbit=None`` without ``per_address`` gives an unshaped namespace (same
MTU), the baseline for :func:`measure_tcp_throughput`.

Needs root (CAP_SYS_ADMIN and CAP_NET_ADMIN), ``ip`` and ``tc``;
:func:`netns_available` says whether they are there and, if not, why.

Example::

    ok, reason = netns_available()
    with ShapedNetwork(rate_mbit=1000) as net:
        mbit = measure_tcp_throughput(net)  # check the shaper first
        procs = [net.popen([sys.executable, "worker.py"]) for _ in range(4)]
        ...
        print(net.qdisc_bytes())  # report beside the ledger
"""

from graphwire.testing.netns.network import (
    MIN_BURST_KB,
    MIN_RATE_MBIT,
    NAME_PREFIX,
    ShapeConfig,
    ShapedNetwork,
    netns_available,
)
from graphwire.testing.netns.stream import (
    TcpStreamResult,
    measure_tcp_throughput,
    tcp_stream,
)

__all__ = [
    "MIN_BURST_KB",
    "MIN_RATE_MBIT",
    "NAME_PREFIX",
    "ShapeConfig",
    "ShapedNetwork",
    "TcpStreamResult",
    "measure_tcp_throughput",
    "netns_available",
    "tcp_stream",
]
