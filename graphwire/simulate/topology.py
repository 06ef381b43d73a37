"""`Topology`: the simulated fabric, its links and the one route between two nodes.

Node IDs: hosts are ``0..num_hosts-1`` (host *i* runs rank *i*); switches follow.

- ``star``: one switch (node ``num_hosts``) with a link to every host.
- ``leaf-spine:LxS``: ``L`` leaf switches (``num_hosts..num_hosts+L-1``), each
  with ``num_hosts / L`` consecutive hosts, and ``S`` spines after them, every
  leaf linked to every spine. Routes are pinned (ECMP as a hash of the pair,
  the same in every simulator): leaf ``a`` to leaf ``b`` goes through spine
  ``(src + dst) % S``.
- ``shared``: every host on one half-duplex medium of ``rate`` (node
  ``num_hosts`` stands for the medium): the tbf-shaped loopback of the
  network emulation, where every byte of every rank takes turns on one link.

Links are full duplex except on ``shared``: each direction of a link is its own
resource of ``rate_bps``. The aggregator of ``--exchange switch`` sits on the
star's switch, on spine 0 of a leaf-spine (one level of aggregation), and
there is none on ``shared``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

__all__ = ["KINDS", "Topology", "parse_delay", "parse_rate", "parse_topology"]

KINDS = ("star", "leaf-spine", "shared")

_UNITS = {"": 1.0, "k": 1e3, "m": 1e6, "g": 1e9, "t": 1e12}
_TIMES = {"s": 1.0, "ms": 1e-3, "us": 1e-6, "ns": 1e-9}


def parse_rate(text: str) -> float:
    """``"100Gbps"``, ``"1Gbit"``, ``"400Mbps"`` -> bits per second (> 0).

    Raises:
        ValueError: not a rate, or not positive.
    """
    m = re.fullmatch(
        r"\s*([0-9.]+(?:e[0-9]+)?)\s*([kmgt]?)(?:bit/s|bps|bit)?\s*", text, re.I
    )
    if m is None:
        raise ValueError(f"{text!r} is not a link rate (e.g. 100Gbps, 1Gbit)")
    rate = float(m.group(1)) * _UNITS[m.group(2).lower()]
    if rate <= 0:
        raise ValueError(f"link rate {text!r} must be above zero")
    return rate


def parse_delay(text: str) -> float:
    """``"2us"``, ``"0.5ms"``, ``"0"`` -> seconds (>= 0).

    Raises:
        ValueError: not a delay, or negative.
    """
    m = re.fullmatch(r"\s*([0-9.]+(?:e-?[0-9]+)?)\s*(s|ms|us|ns)?\s*", text, re.I)
    if m is None:
        raise ValueError(f"{text!r} is not a delay (e.g. 2us, 0.5ms)")
    return float(m.group(1)) * _TIMES[(m.group(2) or "s").lower()]


@dataclass(frozen=True, slots=True)
class Topology:
    """A fabric of ``num_hosts`` hosts (see the module docstring).

    Attributes:
        kind: ``star``, ``leaf-spine`` or ``shared``.
        num_hosts: hosts, one rank each.
        rate_bps: every link's rate, bits per second.
        delay_s: every link's propagation delay, seconds.
        leaves, spines: leaf-spine only.
    """

    kind: str
    num_hosts: int
    rate_bps: float
    delay_s: float
    leaves: int = 0
    spines: int = 0

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(
                f"unknown topology {self.kind!r}: expected star, "
                "leaf-spine:LxS or shared"
            )
        if self.num_hosts < 1:
            raise ValueError(f"a topology needs hosts, not {self.num_hosts}")
        if not self.rate_bps > 0:
            raise ValueError(f"link rate must be above zero, not {self.rate_bps}")
        if self.delay_s < 0:
            raise ValueError(f"link delay must not be negative, not {self.delay_s}")
        if self.kind == "leaf-spine":
            if self.leaves < 1 or self.spines < 1:
                raise ValueError("leaf-spine needs at least one leaf and one spine")
            if self.num_hosts > 0 and self.num_hosts % self.leaves:
                raise ValueError(
                    f"leaf-spine:{self.leaves}x{self.spines}: {self.num_hosts} "
                    f"hosts do not split evenly over {self.leaves} leaves"
                )

    # ------------------------------------------------------------- nodes
    @property
    def num_nodes(self) -> int:
        """Hosts and switches (the medium counts as one node on ``shared``)."""
        return self.num_hosts + (
            self.leaves + self.spines if self.kind == "leaf-spine" else 1
        )

    @property
    def aggregator(self) -> int | None:
        """The switch that aggregates (``--exchange switch``), or None."""
        if self.kind == "star":
            return self.num_hosts
        if self.kind == "leaf-spine":
            return self.num_hosts + self.leaves  # spine 0
        return None

    def leaf_of(self, host: int) -> int:
        """The leaf switch of ``host`` (leaf-spine only)."""
        return self.num_hosts + host * self.leaves // self.num_hosts

    # ------------------------------------------------------------- links
    def links(self) -> list[tuple[int, int]]:
        """Undirected links ``(a, b)``, ``a < b``; both directions carry ``rate``.

        On ``shared`` each host's link to the medium node; the medium itself is
        the one resource (see :meth:`path_links`)."""
        h = self.num_hosts
        if self.kind in ("star", "shared"):
            return [(i, h) for i in range(h)]
        leaves = range(h, h + self.leaves)
        spines = range(h + self.leaves, h + self.leaves + self.spines)
        return [(i, self.leaf_of(i)) for i in range(h)] + [
            (a, b) for a in leaves for b in spines
        ]

    def path(self, src: int, dst: int) -> list[int]:
        """The nodes a message from ``src`` to ``dst`` crosses, both included."""
        if src == dst:
            raise ValueError(f"no path from node {src} to itself")
        self._check(src)
        self._check(dst)
        if self.kind != "leaf-spine":
            hub = self.num_hosts
            if hub in (src, dst):
                return [src, dst]
            return [src, hub, dst]
        return self._leaf_spine_path(src, dst)

    def path_links(self, src: int, dst: int) -> list[tuple[int, int]]:
        """The directed link resources of ``path(src, dst)``.

        On ``shared`` this is the single resource ``(hub, hub)``: the medium
        every byte crosses once."""
        if self.kind == "shared":
            return [(self.num_hosts, self.num_hosts)]
        nodes = self.path(src, dst)
        return list(zip(nodes[:-1], nodes[1:], strict=True))

    def _leaf_spine_path(self, src: int, dst: int) -> list[int]:
        h, first_spine = self.num_hosts, self.num_hosts + self.leaves
        up = [src] if src >= h else [src, self.leaf_of(src)]
        down = [dst] if dst >= h else [self.leaf_of(dst), dst]
        if up[-1] == down[0]:
            return up + down[1:]
        if up[-1] >= first_spine or down[0] >= first_spine:
            return up + down  # a spine at one end: leaf and spine are linked
        spine = first_spine + (src + dst) % self.spines
        return up + [spine] + down

    def _check(self, node: int) -> None:
        if not 0 <= node < self.num_nodes:
            raise ValueError(f"node {node} is not in this {self.kind} topology")


def parse_topology(
    text: str, num_hosts: int, rate_bps: float, delay_s: float
) -> Topology:
    """``star``, ``shared`` or ``leaf-spine:8x8`` for ``num_hosts`` hosts.

    Raises:
        ValueError: an unknown kind or a malformed ``LxS``.
    """
    kind, _, shape = text.partition(":")
    if kind == "leaf-spine":
        m = re.fullmatch(r"([0-9]+)x([0-9]+)", shape)
        if m is None:
            raise ValueError(
                f"leaf-spine needs LEAVESxSPINES, e.g. leaf-spine:8x8, not {text!r}"
            )
        return Topology(
            kind, num_hosts, rate_bps, delay_s, int(m.group(1)), int(m.group(2))
        )
    if shape:
        raise ValueError(f"topology {kind!r} takes no shape, not {text!r}")
    return Topology(kind, num_hosts, rate_bps, delay_s)
