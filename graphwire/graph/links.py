"""Held-out links: the edges link prediction trains without and is scored on.

:func:`split_links` views a graph as undirected (each pair ``{u, v}``,
``u != v``, joined by an edge either way, once), shuffles the pairs with a
generator seeded by ``seed``, and holds out ``test`` of them for testing and
``val`` for validation (fractions, rounded down). The training graph keeps
the rest, in both directions, with the graph's node data; the model never
passes messages over a held-out edge. Each held-out pair ``(u, v)`` gets
``negatives`` corrupted pairs ``(u, w)``: ``w`` drawn uniformly from the
nodes that are neither ``u`` nor joined to it in the whole graph, so a
negative is never an edge, held out or not.

Shapes (M held-out pairs of a split, R negatives each):
    src, dst   int64 [M]     the pair (for the metrics, ``u -> v`` is scored)
    neg        int64 [M, R]  the corrupted destinations of each pair
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from graphwire.graph.checks import GraphError
from graphwire.graph.graph import Graph

__all__ = [
    "HeldOut",
    "LinkSplit",
    "LinkSplitError",
    "check_splittable",
    "contains_sorted",
    "load_held_out",
    "save_held_out",
    "split_links",
]

HELD_OUT_FILE = "held_out.npz"
_DRAW_ROUNDS = 64  # rejection rounds before a node's non-neighbours are listed


class LinkSplitError(GraphError):
    """A graph cannot be split for link prediction as asked."""


@dataclass(frozen=True, eq=False)
class HeldOut:
    """One split's held-out pairs and their negatives (module docstring)."""

    src: torch.Tensor
    dst: torch.Tensor
    neg: torch.Tensor

    def __post_init__(self) -> None:
        m = self.src.numel()
        if self.src.shape != (m,) or self.dst.shape != (m,):
            raise GraphError(
                f"held-out pairs: src and dst must be 1-D of one length, found "
                f"{tuple(self.src.shape)} and {tuple(self.dst.shape)}"
            )
        if self.neg.dim() != 2 or self.neg.shape[0] != m:
            raise GraphError(
                f"held-out negatives: expected [{m}, R], found {tuple(self.neg.shape)}"
            )

    @property
    def num_pairs(self) -> int:
        return self.src.numel()

    def nodes(self) -> torch.Tensor:
        """int64: every node the split scores, ascending, once."""
        return torch.cat([self.src, self.dst, self.neg.reshape(-1)]).unique()

    def renumbered(self, new_of: torch.Tensor) -> HeldOut:
        """The pairs with node ``v`` renamed ``new_of[v]``."""
        return HeldOut(new_of[self.src], new_of[self.dst], new_of[self.neg])


@dataclass(frozen=True, eq=False)
class LinkSplit:
    """A graph split for link prediction.

    Attributes:
        graph: the training graph: the pairs not held out, both directions,
            no self-loops, with the input graph's node data.
        val, test: the held-out pairs.
    """

    graph: Graph
    val: HeldOut
    test: HeldOut


def split_links(
    graph: Graph,
    val: float = 0.05,
    test: float = 0.10,
    negatives: int = 50,
    seed: int = 0,
) -> LinkSplit:
    """Hold out ``val`` and ``test`` of ``graph``'s undirected pairs.

    Raises:
        LinkSplitError: fractions out of range, too few pairs to hold out one
            in each split and train on one, or a node joined to every other
            (no negative for it).
    """
    for name, value in (("val", val), ("test", test)):
        if not 0 < value < 1:
            raise LinkSplitError(
                f"--task link: {name} fraction {value!r} not in (0, 1)"
            )
    if val + test >= 1:
        raise LinkSplitError(
            f"--task link: val + test = {val + test:g} leaves no edges to train on"
        )
    if negatives < 1:
        raise LinkSplitError(f"--task link: negatives {negatives} < 1")
    n = graph.num_nodes
    key = _pair_keys(graph)
    num_val, num_test = _held_out_sizes(graph.name, key.numel(), val, test)
    generator = torch.Generator().manual_seed(seed)
    key = key[torch.randperm(key.numel(), generator=generator)]
    test_key, val_key = key[:num_test], key[num_test : num_test + num_val]
    train_key = key[num_test + num_val :]
    u, v = train_key // n, train_key % n
    train = Graph.from_edge_index(
        torch.cat([u, v]), torch.cat([v, u]), n, **graph.node_data()
    )
    every = torch.cat([key, (key % n) * n + key // n]).sort().values
    return LinkSplit(
        graph=train.deduplicate(),
        val=_held_out(val_key, n, every, negatives, generator),
        test=_held_out(test_key, n, every, negatives, generator),
    )


def check_splittable(
    graph: Graph, val: float = 0.05, test: float = 0.10
) -> tuple[int, int]:
    """The pairs :func:`split_links` would hold out, ``(val, test)``; raise
    :class:`LinkSplitError` where it would for too few edges (before a run
    writes anything)."""
    return _held_out_sizes(graph.name, _pair_keys(graph).numel(), val, test)


def _pair_keys(graph: Graph) -> torch.Tensor:
    """int64, ascending: ``u n + v`` of each undirected pair, ``u < v``."""
    n = graph.num_nodes
    src, dst = graph.edge_index()
    lo, hi = torch.minimum(src, dst), torch.maximum(src, dst)
    return (lo * n + hi)[lo != hi].unique()


def _held_out_sizes(name: str, pairs: int, val: float, test: float) -> tuple[int, int]:
    num_val, num_test = int(val * pairs), int(test * pairs)
    if num_val < 1 or num_test < 1 or pairs - num_val - num_test < 1:
        raise LinkSplitError(
            f"--task link: graph {name!r} has {pairs} undirected edges; holding "
            f"out {val:.0%} for validation and {test:.0%} for testing needs one "
            "in each and one left to train on"
        )
    return num_val, num_test


def _held_out(
    key: torch.Tensor, n: int, edges: torch.Tensor, r: int, generator: torch.Generator
) -> HeldOut:
    src, dst = key // n, key % n
    return HeldOut(src, dst, _non_neighbours(src, n, edges, r, generator))


def _non_neighbours(
    src: torch.Tensor, n: int, edges: torch.Tensor, r: int, generator: torch.Generator
) -> torch.Tensor:
    """int64 [M, r]: per ``src``, uniform nodes neither it nor joined to it
    (``edges``: sorted keys ``u n + v`` of both directions)."""
    out = torch.randint(n, (src.numel(), r), generator=generator)
    rows = src.unsqueeze(1).expand(-1, r)
    for _ in range(_DRAW_ROUNDS):
        bad = (out == rows) | contains_sorted(edges, rows * n + out)
        if not bool(bad.any()):
            return out
        out[bad] = torch.randint(n, (int(bad.sum()),), generator=generator)
    for i in (bad.any(1)).nonzero().view(-1).tolist():  # nearly complete rows
        u = int(src[i])
        free = torch.ones(n, dtype=torch.bool)
        free[u] = False
        lo, hi = torch.searchsorted(edges, torch.tensor([u * n, u * n + n]))
        free[edges[lo:hi] - u * n] = False
        if not bool(free.any()):
            raise LinkSplitError(
                f"--task link: node {u} is joined to every other node: it has "
                "no negative to score against"
            )
        options = free.nonzero().view(-1)
        pick = torch.randint(options.numel(), (r,), generator=generator)
        out[i] = torch.where(bad[i], options[pick], out[i])
    return out


def contains_sorted(sorted_keys: torch.Tensor, key: torch.Tensor) -> torch.Tensor:
    """bool, ``key``'s shape: whether each key is among ``sorted_keys``
    (int64, ascending)."""
    if not sorted_keys.numel():
        return torch.zeros_like(key, dtype=torch.bool)
    at = torch.searchsorted(sorted_keys, key).clamp(max=sorted_keys.numel() - 1)
    return sorted_keys[at] == key


def save_held_out(folder: str | os.PathLike[str], val: HeldOut, test: HeldOut) -> Path:
    """Write the held-out pairs beside a partitioned graph (atomically)."""
    path = Path(folder) / HELD_OUT_FILE
    arrays = {
        f"{name}_{field}": getattr(split, field).numpy()
        for name, split in (("val", val), ("test", test))
        for field in ("src", "dst", "neg")
    }
    tmp = path.with_suffix(".tmp.npz")
    np.savez(tmp, **arrays)  # type: ignore[arg-type]
    os.replace(tmp, path)
    return path


def load_held_out(
    folder: str | os.PathLike[str], num_nodes: int
) -> tuple[HeldOut, HeldOut]:
    """The ``(val, test)`` pairs :func:`save_held_out` wrote in ``folder``.

    Raises:
        LinkSplitError: the file is missing, unreadable, or names nodes
            outside ``[0, num_nodes)``.
    """
    path = Path(folder) / HELD_OUT_FILE
    if not path.exists():
        raise LinkSplitError(
            f"--task link: {folder} holds no held-out edges ({HELD_OUT_FILE}): "
            "give the graph, not parts split for another task"
        )
    try:
        with np.load(path) as data:
            loaded = {k: torch.from_numpy(np.array(data[k])) for k in data.files}
        splits = tuple(
            HeldOut(*(loaded[f"{name}_{f}"] for f in ("src", "dst", "neg")))
            for name in ("val", "test")
        )
    except (OSError, ValueError, KeyError) as error:
        raise LinkSplitError(f"{path}: unreadable held-out edges ({error})") from None
    for name, split in zip(("val", "test"), splits, strict=True):
        ids = torch.cat([split.src, split.dst, split.neg.reshape(-1)])
        if ids.dtype != torch.int64 or (
            ids.numel() and (int(ids.min()) < 0 or int(ids.max()) >= num_nodes)
        ):
            raise LinkSplitError(
                f"{path}: {name} pairs name nodes outside [0, {num_nodes})"
            )
    return splits[0], splits[1]
