"""What a simulated message costs on the wire: packets of a fixed payload plus headers.

Both simulators charge the same bytes: the ns-3 hosts send each message as
``ceil(nbytes / PAYLOAD_BYTES)`` packets, each carrying ``HEADER_BYTES`` of
headers on every link, and the flow model charges :func:`wire_bytes`.
"""

from __future__ import annotations

__all__ = ["CSMA_EXTRA_BYTES", "HEADER_BYTES", "PAYLOAD_BYTES", "packets", "wire_bytes"]

# Jumbo frames (MTU 9000), as on the emulation's loopback.
PAYLOAD_BYTES = 8192
# What each ns-3 packet carries on a point-to-point link (star, leaf-spine):
# PPP 2 + IPv4 20 + UDP 8 + graphwire's message header 16 (task, sequence).
HEADER_BYTES = 46
# On ``shared`` (an ns-3 CSMA medium) each frame carries an Ethernet header 14 and
# FCS 4 instead of PPP's 2: 16 bytes more per packet than `wire_bytes` counts.
CSMA_EXTRA_BYTES = 16


def packets(nbytes: int) -> int:
    """Packets a message of ``nbytes`` payload takes (one for an empty one: none)."""
    return -(-nbytes // PAYLOAD_BYTES)


def wire_bytes(nbytes: int, header: int = HEADER_BYTES) -> int:
    """Bytes a message of ``nbytes`` payload puts on each link it crosses
    (``header``: per packet; ``HEADER_BYTES + CSMA_EXTRA_BYTES`` on
    ``shared``)."""
    return nbytes + packets(nbytes) * header
