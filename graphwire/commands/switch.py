"""``graphwire switch --listen HOST:PORT``: the switch of ``--exchange switch``.

``graphwire train --workers N --exchange switch`` starts one itself (on
rank 0, on loopback). Under ``torchrun`` across machines, start one where
every worker can reach it and give its address to the workers::

    graphwire switch --listen 127.0.0.1:29600         # bound to loopback
    torchrun ... -m graphwire train --exchange switch --switch-addr 127.0.0.1:29600

The switch serves one run: it takes its settings (aggregator memory, loss,
ownership ranges) from the run's rank 0, and exits once every worker has
left (status 0), or when a worker disconnects without leaving (status 1,
after telling the others).
"""

from __future__ import annotations

import argparse

from graphwire.comm.switch.server import die_with, parse_address, serve

__all__ = ["run"]


def run(args: argparse.Namespace) -> int:
    host, port = parse_address(args.listen)
    if args.parent_pid is not None:
        die_with(args.parent_pid)
    return serve(host, port)
