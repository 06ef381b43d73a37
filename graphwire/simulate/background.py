"""`add_background`: random flows between hosts, beside an epoch's own traffic.

SwitchGNN's congestion-control experiment (§6) adds flows whose sizes follow
the Hadoop datacenter workload and whose arrivals are Poisson. Sizes here
come from a coarse empirical CDF of that workload's shape (half the flows
under 1 KB, 5% over 1 MB, none over 10 MB; log-uniform between the points);
each host starts flows to uniformly chosen other hosts at a rate that makes
its offered load ``load`` of its link. A flow is a wait (a compute task of
no host's time: it holds up nothing but the flow) and a send, both tagged
``background``, which epoch times leave out.
"""

from __future__ import annotations

import numpy as np

from graphwire.simulate.topology import Topology
from graphwire.simulate.workload import Task, Workload

__all__ = ["BACKGROUND", "add_background", "flow_sizes"]

BACKGROUND = "background"
# (bytes, share of flows at or below)
_CDF: tuple[tuple[int, float], ...] = (
    (100, 0.0),
    (1_000, 0.5),
    (10_000, 0.7),
    (100_000, 0.85),
    (1_000_000, 0.95),
    (10_000_000, 1.0),
)


def flow_sizes(count: int, rng: np.random.Generator) -> np.ndarray:
    """``count`` flow sizes in bytes (int64) from the CDF above."""
    sizes = np.log10([s for s, _ in _CDF])
    shares = [p for _, p in _CDF]
    return np.round(10 ** np.interp(rng.random(count), shares, sizes)).astype(np.int64)


def add_background(
    workload: Workload, topology: Topology, *, load: float, until_s: float, seed: int
) -> Workload:
    """A copy of ``workload`` with background flows starting before ``until_s``.

    Raises:
        ValueError: ``load`` outside (0, 1), or fewer than two hosts.
    """
    if not 0 < load < 1:
        raise ValueError(f"background load: expected in (0, 1), got {load}")
    if topology.num_hosts < 2:
        raise ValueError("background flows need two hosts")
    rng = np.random.default_rng(seed)
    mean = float(flow_sizes(100_000, np.random.default_rng(0)).mean())
    per_second = load * topology.rate_bps / 8 / mean
    out = Workload(workload.num_hosts, list(workload.tasks))
    for src in range(topology.num_hosts):
        t = rng.exponential(1 / per_second)
        while t < until_s:
            dst = int(rng.integers(topology.num_hosts - 1))
            dst += dst >= src
            (size,) = flow_sizes(1, rng)
            wait = out.add(Task(src, seconds=t, tag=BACKGROUND))
            out.add(Task(src, dst=dst, nbytes=int(size), deps=(wait,), tag=BACKGROUND))
            t += rng.exponential(1 / per_second)
    return out
