"""The package's layers: what may import what, and how large a module may grow.

Each folder is a room with one job (ARCHITECTURE.md §2). A layer imports only
the layers below it; the two training loops, ``fullgraph`` and ``minibatch``,
are siblings on ``run`` and never import each other; the command line sits
on top. Test code lives in tests/, not in the package.
"""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "graphwire"

# Bottom to top. A module may import its own layer and the layers before it.
LAYERS: list[set[str]] = [
    {"fsutil", "allocator", "sigterm", "options", "units"},
    {"graph"},
    {"partition"},
    {"comm"},
    {"nn"},
    {"sampler"},
    {"feature"},
    {"run"},
    {"fullgraph", "minibatch"},
    {"bench", "testing", "simulate"},
    {"commands", "cli", "__main__", "__init__"},
]
RANK = {name: rank for rank, layer in enumerate(LAYERS) for name in layer}
SIBLINGS = ({"fullgraph", "minibatch"},)
MAX_LINES = 500


def _room(path: Path) -> str:
    """The top-level package or module of ``graphwire`` that ``path`` is in."""
    rel = path.relative_to(PACKAGE)
    return rel.parts[0].removesuffix(".py")


def _imported_rooms(path: Path) -> set[str]:
    rooms = set()
    for node in ast.walk(ast.parse(path.read_text())):
        names: list[str] = []
        if isinstance(node, ast.ImportFrom) and node.module:
            names = [node.module]
            if node.module == "graphwire":  # from graphwire import fsutil
                names = [f"graphwire.{alias.name}" for alias in node.names]
        elif isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        for name in names:
            parts = name.split(".")
            if parts[0] == "graphwire" and len(parts) > 1:
                rooms.add(parts[1])
    return rooms


MODULES = sorted(PACKAGE.rglob("*.py"))


def test_every_room_has_a_layer() -> None:
    rooms = {_room(path) for path in MODULES}
    assert rooms <= set(RANK), sorted(rooms - set(RANK))


def test_a_module_imports_no_layer_above_its_own() -> None:
    wrong = []
    for path in MODULES:
        room = _room(path)
        for other in sorted(_imported_rooms(path) - {room}):
            if RANK[other] > RANK[room]:
                wrong.append(f"{path.relative_to(PACKAGE)}: {room} imports {other}")
            elif any({room, other} == siblings for siblings in SIBLINGS):
                wrong.append(
                    f"{path.relative_to(PACKAGE)}: imports its sibling {other}"
                )
    assert wrong == []


def test_no_module_is_over_the_ceiling() -> None:
    """STYLE.md §8: at 400 lines look for a split, 500 is the ceiling."""
    sizes = {
        str(p.relative_to(PACKAGE)): len(p.read_text().splitlines()) for p in MODULES
    }
    assert {name: n for name, n in sizes.items() if n > MAX_LINES} == {}


def test_the_commands_read_no_signatures_and_the_package_ships_no_probes() -> None:
    for path in (PACKAGE / "commands").rglob("*.py"):
        assert "inspect.signature" not in path.read_text(), path
    shipped = {p.name for p in (PACKAGE / "testing").rglob("*.py")}
    assert not any("probe" in name for name in shipped), shipped
