"""Topologies: routes, links, and the flags' values refused with their reason."""

from __future__ import annotations

import pytest

from graphwire.simulate.topology import (
    Topology,
    parse_delay,
    parse_rate,
    parse_topology,
)


def test_rates_and_delays_parse() -> None:
    assert parse_rate("100Gbps") == 100e9
    assert parse_rate("1Gbit") == 1e9
    assert parse_rate("400mbit/s") == 400e6
    assert parse_delay("2us") == pytest.approx(2e-6)
    assert parse_delay("0.5ms") == pytest.approx(5e-4)
    assert parse_delay("0") == 0.0


@pytest.mark.parametrize(
    ("text", "why"),
    [
        ("0Gbps", "above zero"),
        ("fast", "not a link rate"),
        ("-1Gbps", "not a link rate"),
    ],
)
def test_bad_rates_are_refused(text: str, why: str) -> None:
    with pytest.raises(ValueError, match=why):
        parse_rate(text)


@pytest.mark.parametrize(
    ("text", "hosts", "why"),
    [
        ("ring", 4, "unknown topology 'ring'"),
        ("leaf-spine", 4, "LEAVESxSPINES"),
        ("leaf-spine:3x2", 8, "do not split evenly"),
        ("star:4", 4, "takes no shape"),
    ],
)
def test_bad_topologies_are_refused(text: str, hosts: int, why: str) -> None:
    with pytest.raises(ValueError, match=why):
        parse_topology(text, hosts, 1e9, 0.0)


def test_routes() -> None:
    star = parse_topology("star", 4, 1e9, 0.0)
    assert star.path(0, 3) == [0, 4, 3]
    assert star.aggregator == 4 and star.path(2, 4) == [2, 4]
    fabric = parse_topology("leaf-spine:2x3", 8, 1e9, 0.0)
    assert fabric.num_nodes == 13
    assert fabric.path(0, 1) == [0, 8, 1]  # same leaf
    spine = 10 + (0 + 7) % 3
    assert fabric.path(0, 7) == [0, 8, spine, 9, 7]
    assert fabric.path(7, 0) == [7, 9, spine, 8, 0]  # the pair's one spine
    assert fabric.aggregator == 10 and fabric.path(5, 10) == [5, 9, 10]
    shared = Topology("shared", 3, 1e9, 0.0)
    assert shared.aggregator is None
    assert shared.path_links(0, 2) == shared.path_links(2, 1) == [(3, 3)]
