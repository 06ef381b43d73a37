"""G3's modes: when each sends a layer's rows and when its bins compute."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest
import torch

from graphwire.fullgraph.g3.config import MODES
from graphwire.fullgraph.g3.schedule import SCHEDULES


class _Wire:
    """Records what a schedule asks of the wire."""

    def __init__(self) -> None:
        self.calls: list[tuple[Any, ...]] = []

    def post(self, layer: int, width: int, like: Any, halo: Any = None) -> None:
        self.calls.append(("post", layer))

    def wait(self, layer: int, keys: Any) -> None:
        self.calls.append(("wait", layer, None if keys is None else sorted(keys)))

    def send_all(self, layer: int, rows: Any) -> None:
        self.calls.append(("send_all", layer))

    def send_bin(self, layer: int, b: int, rows: Any) -> None:
        self.calls.append(("send_bin", layer, b))

    def drain(self) -> None:
        self.calls.append(("drain",))


def _layer(mode: str, index: int, last: bool) -> list[tuple[Any, ...]]:
    """What layer ``index`` of two bins (the second reads message (1, 0))
    asks of the wire, in the order the engine's forward calls the hooks."""
    schedule, wire = SCHEDULES[mode], _Wire()
    rows = torch.zeros(3, 2)
    schedule.sends.start(wire, index, rows)
    schedule.bins.start(wire, index)
    for b, needs in enumerate([frozenset(), frozenset({(1, 0)})]):
        schedule.bins.before(wire, index, SimpleNamespace(needs=needs))
        if not last:
            schedule.sends.after(wire, index, b, rows)
    schedule.sends.end(wire, last)
    return wire.calls


def test_every_mode_has_a_schedule() -> None:
    assert tuple(SCHEDULES) == MODES
    eager = {mode: SCHEDULES[mode].bins.eager for mode in MODES}
    assert eager == {"full": True, "inter": False, "intra": True, "sequential": False}


PIPELINED = [("post", 2), ("send_bin", 2, 0), ("post", 2), ("send_bin", 2, 1)]


@pytest.mark.parametrize(
    ("mode", "calls"),
    [
        # Bins compute as their messages come; each bin's rows leave at once.
        ("full", [*PIPELINED[:2], ("wait", 1, [(1, 0)]), *PIPELINED[2:]]),
        # All messages first; each bin's rows leave at once.
        ("inter", [("wait", 1, None), *PIPELINED]),
        # The layer's rows all leave when it starts, complete when it ends.
        ("intra", [("send_all", 1), ("wait", 1, [(1, 0)]), ("drain",)]),
        ("sequential", [("send_all", 1), ("wait", 1, None), ("drain",)]),
    ],
)
def test_a_middle_layer(mode: str, calls: list[tuple[Any, ...]]) -> None:
    assert _layer(mode, 1, last=False) == calls


@pytest.mark.parametrize("mode", MODES)
def test_the_input_layer_sends_its_rows_and_the_last_layer_drains(mode: str) -> None:
    # No layer below computed the input layer's rows: every mode sends them
    # when it starts (unless they are cached, when the engine exchanges none).
    assert _layer(mode, 0, last=False)[0] == ("send_all", 0)
    # Every send is complete before the forward returns.
    assert _layer(mode, 1, last=True)[-1] == ("drain",)
