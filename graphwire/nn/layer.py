"""What the GNN layers share: a size check, and a mixin for projecting first.

The mixin tells whether a layer projects its rows before aggregating them."""

from __future__ import annotations

from typing import Any

from graphwire.graph.seeds import is_int

__all__ = ["ProjectsToOutput", "check_size"]


def check_size(value: Any, name: str) -> int:
    """``value`` as a plain int if it is a valid width or count (an integer >= 1).

    Otherwise ``ValueError`` naming ``name``. A width of 0 builds a model whose
    output is a constant (its bias), and a negative one fails deep in torch, so
    layers and ``build_model`` check their sizes first."""
    if not is_int(value) or value < 1:
        raise ValueError(f"{name}: expected an integer >= 1, got {value!r}")
    return int(value)


class ProjectsToOutput:
    """Mixin of a layer that may project its rows before aggregating them.

    The layer's row-wise ``project`` maps rows to ``message_width`` columns
    (``out_dim`` unless overridden: GCN's ``W``, GraphSAGE's ``W_neigh``;
    GAT's ``lin`` gives every head). Projecting first narrows the rows the
    sparse product, and a distributed exchange, move when
    ``message_width < in_dim``."""

    in_dim: int
    out_dim: int

    @property
    def projects_first(self) -> bool:
        return self.message_width < self.in_dim

    @property
    def message_width(self) -> int:
        """Width of ``project``'s rows."""
        return self.out_dim

    @property
    def transforms_sources(self) -> bool:
        """Whether ``forward`` transforms every source row, not only aggregates them.

        That is work per source row rather than per edge. A caller may hand a
        layer that does not a whole table of rows as its sources, with
        ``MessageGraph.dst_index``, instead of gathering the rows it reads."""
        return self.projects_first
