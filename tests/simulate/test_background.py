"""Background flows: the Hadoop-shaped sizes, the offered load, the epoch apart."""

from __future__ import annotations

import numpy as np
import pytest

from graphwire.simulate.background import BACKGROUND, add_background, flow_sizes
from graphwire.simulate.flow import simulate_flows
from graphwire.simulate.study import summarise
from graphwire.simulate.topology import Topology
from graphwire.simulate.workload import Workload


def test_sizes_follow_the_cdf() -> None:
    sizes = flow_sizes(20_000, np.random.default_rng(1))
    assert sizes.min() >= 100 and sizes.max() <= 10_000_000
    assert np.mean(sizes <= 1_000) == pytest.approx(0.5, abs=0.02)
    assert np.mean(sizes > 1_000_000) == pytest.approx(0.05, abs=0.01)


def test_background_offers_its_load_and_leaves_the_epoch_alone() -> None:
    topology = Topology("star", 4, 1e9, 1e-6)
    epoch = Workload(4)
    epoch.send(0, 1, 1_000_000, tag="fwd.L1")
    busy = add_background(epoch, topology, load=0.3, until_s=0.5, seed=0)
    extra = [t for t in busy.tasks if t.tag == BACKGROUND and t.is_send]
    offered = sum(t.nbytes for t in extra) * 8 / 0.5 / 4  # per host
    assert offered == pytest.approx(0.3 * 1e9, rel=0.35)  # heavy-tailed sizes
    assert all(t.dst != t.node for t in extra)
    result = simulate_flows(busy, topology)
    outcome = summarise("halo", [], busy, result)
    assert outcome.epoch_s == pytest.approx(result.finish[0])  # the epoch's own send
    assert outcome.bytes == 1_000_000
    with pytest.raises(ValueError, match="load"):
        add_background(epoch, topology, load=1.5, until_s=1.0, seed=0)
