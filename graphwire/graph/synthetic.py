"""Synthetic graphs: a labelled products-like community graph, and R-MAT.

``products``: a degree-corrected stochastic block model (DC-SBM). Every node gets a
class (class sizes follow a Zipf-like law, as in ogbn-products) and a degree
propensity drawn from a power law. Each undirected edge picks its first end in
proportion to propensity; with probability ``homophily`` the second end is drawn
(again by propensity) from the same class, otherwise from the whole graph. The
edge list is symmetrised and deduplicated. Features are a class signal plus
Gaussian noise, scaled so that features alone are a weak predictor and a 2-layer
GNN, which averages over mostly same-class neighbours, is a clearly better one.
The split mimics ogbn-products: the most "popular" nodes (highest propensity)
train, the next ones validate, the rest test.

``rmat``: the Graph500 recursive-matrix generator (a=0.57, b=0.19, c=0.19) with a
seeded vertex permutation, for structure-only scale tests; features and labels
are random and only made on request.

Both are vectorised (numpy, no loop over nodes or edges) and deterministic for a
seed. Shapes: see :class:`graphwire.graph.graph.Graph`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np
import psutil
import torch

from graphwire.graph.graph import Graph
from graphwire.graph.seeds import check_seed
from graphwire.units import format_bytes

__all__ = [
    "MAX_NODES",
    "ProductsConfig",
    "RmatConfig",
    "products_graph",
    "rmat_graph",
]

# Features are generated in row chunks so the float64 noise never exists whole.
_FEATURE_CHUNK_ROWS = 1 << 16
# Edge keys are lo * nodes + hi in int64: 2**31 nodes keep them below 2**62.
MAX_NODES = 1 << 31


@dataclass(kw_only=True, slots=True)
class ProductsConfig:
    """Parameters of the products-like DC-SBM graph.

    Attributes:
        nodes: Number of nodes N, in [2, 2**31] (edge keys ``lo * N + hi`` must
            fit in int64).
        degree: Target mean in-degree, in (0, nodes): ``round(N * degree / 2)``
            node pairs are drawn and both directions of each are kept. Self-loops
            and repeated pairs are then dropped, so the realised mean is lower,
            more so on small graphs: degree=20 gives about 15.7 at 5,000 nodes,
            17.3 at 20,000, 18.6 at 100,000 and 18.8 at 200,000.
        features: Feature columns F, 0 for none.
        classes: Number of classes, at least 2.
        homophily: Probability, in [0, 1], that an edge's second end is drawn
            from its first end's class rather than from all nodes.
        exponent: Power-law exponent of the degree propensity, finite and > 1.
        signal: Length of each class's mean feature vector relative to noise of
            std 1 per entry, in [0, 1e6]. 0 makes the features pure noise; a few
            units already separate the classes from features alone. The cap keeps
            the float32 features far from overflow.
        train_fraction: Share of nodes (the most popular ones) that train, in
            (0, 1).
        val_fraction: Share of nodes that validate (the next most popular), in
            [0, 1); ``train_fraction + val_fraction`` must be below 1.
        seed: Random seed, an int in [0, 2**63).
    """

    nodes: int = 200_000
    degree: float = 20.0
    features: int = 100
    classes: int = 47
    homophily: float = 0.8
    exponent: float = 2.5
    signal: float = 0.6
    train_fraction: float = 0.08
    val_fraction: float = 0.02
    seed: int = 0

    def __post_init__(self) -> None:
        self.seed = check_seed(self.seed)
        _check(2 <= self.nodes <= MAX_NODES, "nodes", "in [2, 2**31]", self.nodes)
        _check(
            _finite(self.degree) and 0 < self.degree < self.nodes,
            "degree",
            f"a number in (0, nodes={self.nodes})",
            self.degree,
        )
        _check(self.features >= 0, "features", ">= 0", self.features)
        if self.classes < 2:
            # One class makes every prediction right: a test_acc of 1.0 that
            # measures nothing.
            raise ValueError(f"classes: need at least 2, got {self.classes}")
        _check(
            _finite(self.homophily) and 0 <= self.homophily <= 1,
            "homophily",
            "a number in [0, 1]",
            self.homophily,
        )
        _check(
            _finite(self.exponent) and self.exponent > 1,
            "exponent",
            "a finite number > 1",
            self.exponent,
        )
        _check(
            _finite(self.signal) and 0 <= self.signal <= 1e6,
            "signal",
            "a number in [0, 1e6]",
            self.signal,
        )
        _check(
            _finite(self.train_fraction) and 0 < self.train_fraction < 1,
            "train_fraction",
            "a number in (0, 1)",
            self.train_fraction,
        )
        _check(
            _finite(self.val_fraction) and 0 <= self.val_fraction < 1,
            "val_fraction",
            "a number in [0, 1)",
            self.val_fraction,
        )
        if self.train_fraction + self.val_fraction >= 1.0:
            raise ValueError(
                "train_fraction + val_fraction must be < 1, got "
                f"{self.train_fraction} + {self.val_fraction}"
            )


@dataclass(kw_only=True, slots=True)
class RmatConfig:
    """Parameters of the Graph500 R-MAT generator.

    Attributes:
        scale: ``2**scale`` nodes, scale in [1, 31].
        edge_factor: Edges drawn per node (at least 1), before self-loops and
            repeated pairs are dropped and both directions kept.
        a, b, c: Shares of the top-left, top-right and bottom-left quadrants of
            the adjacency matrix at each level, finite and >= 0 with
            ``a + b + c < 1`` (the bottom-right quadrant takes the rest).
        features: Random float32 feature columns, 0 for none.
        classes: Random labels: 0 for none, else from 2 up to the number of
            nodes.
        seed: Random seed, an int in [0, 2**63).
    """

    scale: int = 16
    edge_factor: int = 16
    a: float = 0.57
    b: float = 0.19
    c: float = 0.19
    features: int = 0
    classes: int = 0
    seed: int = 0

    def __post_init__(self) -> None:
        self.seed = check_seed(self.seed)
        _check(1 <= self.scale <= 31, "scale", "in [1, 31]", self.scale)
        _check(self.edge_factor >= 1, "edge_factor", ">= 1", self.edge_factor)
        for name, share in (("a", self.a), ("b", self.b), ("c", self.c)):
            _check(_finite(share) and share >= 0, name, "a finite number >= 0", share)
        if self.a + self.b + self.c >= 1.0:
            raise ValueError(
                "a, b, c: a + b + c must be < 1, got "
                f"{self.a} + {self.b} + {self.c} = {self.a + self.b + self.c}"
            )
        _check(self.features >= 0, "features", ">= 0", self.features)
        if not (self.classes == 0 or 2 <= self.classes <= 1 << self.scale):
            raise ValueError(
                "classes: must be 0 (no labels) or at least 2 and at most the "
                f"2**scale = {1 << self.scale} nodes, got {self.classes}"
            )


def products_graph(config: ProductsConfig | None = None) -> Graph:
    """Generate the products-like labelled community graph (see module doc)."""
    cfg = config or ProductsConfig()
    n, num_classes = cfg.nodes, cfg.classes
    num_pairs = int(round(n * cfg.degree / 2))
    _check_memory(
        "products",
        f"nodes={n} with degree={cfg.degree}, features={cfg.features} "
        f"and classes={num_classes}",
        {
            "x": 4 * n * cfg.features,
            # Drawing: both ends and two sort buffers, int64 per pair at once.
            "the edge arrays": 32 * num_pairs,
            "the node arrays": 32 * n,  # labels, theta, by_class, cum_theta
            # Class weights, then class means drawn in float64 and kept in float32.
            "the class arrays": num_classes * (16 + 12 * cfg.features),
        },
    )
    rng = np.random.default_rng(cfg.seed)

    # Classes: Zipf-like sizes (ogbn-products' classes are very uneven).
    class_weight = 1.0 / np.arange(1, num_classes + 1) ** 0.8
    labels = rng.choice(num_classes, size=n, p=class_weight / class_weight.sum())
    # Degree propensity: Pareto tail with exponent `exponent`, capped so that no
    # node expects more than a few percent of all edges.
    theta = rng.pareto(cfg.exponent - 1.0, size=n) + 1.0
    np.minimum(theta, np.sqrt(n) * 4.0, out=theta)

    # Nodes sorted by class; cumulative propensity over that order lets one
    # searchsorted draw "a node of class k in proportion to theta".
    by_class = np.argsort(labels, kind="stable")
    cum_theta = np.cumsum(theta[by_class])
    total = cum_theta[-1]
    class_end = np.cumsum(np.bincount(labels, minlength=num_classes))
    class_hi = cum_theta[class_end - 1]
    class_lo = np.concatenate([[0.0], class_hi[:-1]])

    first = by_class[_lookup(cum_theta, rng.random(num_pairs) * total)]
    inside = rng.random(num_pairs) < cfg.homophily
    cls = labels[first]
    draw = rng.random(num_pairs)
    target = np.where(
        inside,
        class_lo[cls] + draw * (class_hi[cls] - class_lo[cls]),
        draw * total,
    )
    del cls, draw, inside
    second = by_class[_lookup(cum_theta, target)]
    del target, cum_theta

    keep = first != second
    first, second = first[keep], second[keep]
    del keep
    # Undirected edge keys (lo * n + hi), deduplicated; then both directions.
    lo = np.minimum(first, second)
    hi = np.maximum(first, second)
    del first, second
    lo *= n
    lo += hi
    del hi
    keys = _sorted_unique(lo)
    del lo
    src_half, dst_half = np.divmod(keys, n)
    del keys
    graph = _symmetric_graph(src_half, dst_half, n)

    x = _class_features(rng, labels, cfg.features, num_classes, cfg.signal)
    # Split by popularity, like ogbn-products' sales-rank split.
    order = np.argsort(-theta, kind="stable")
    num_train = max(1, int(cfg.train_fraction * n))
    num_val = int(cfg.val_fraction * n)
    return graph.replace(
        x=None if x is None else torch.from_numpy(x),
        y=torch.from_numpy(labels.astype(np.int64)),
        train_idx=torch.from_numpy(np.sort(order[:num_train])),
        val_idx=torch.from_numpy(np.sort(order[num_train : num_train + num_val])),
        test_idx=torch.from_numpy(np.sort(order[num_train + num_val :])),
        name=f"products-n{n}-s{cfg.seed}",
    )


def rmat_graph(config: RmatConfig | None = None) -> Graph:
    """Generate an R-MAT graph (Graph500 parameters), symmetric, deduplicated."""
    cfg = config or RmatConfig()
    n = 1 << cfg.scale
    num_edges = n * cfg.edge_factor
    _check_memory(
        "rmat",
        f"scale={cfg.scale} with edge_factor={cfg.edge_factor} "
        f"and features={cfg.features}",
        {
            "x": 4 * n * cfg.features,
            "the edge arrays": 24 * num_edges,  # src, dst and one float64 draw
            "the node arrays": 16 * n,  # permutation and indptr
        },
    )
    rng = np.random.default_rng(cfg.seed)
    src = np.zeros(num_edges, dtype=np.int64)
    dst = np.zeros(num_edges, dtype=np.int64)
    ab, abc = cfg.a + cfg.b, cfg.a + cfg.b + cfg.c
    # One pass per bit level over all edges: pick a quadrant of the adjacency matrix.
    for level in range(cfg.scale):
        r = rng.random(num_edges)
        bit = np.int64(1) << np.int64(cfg.scale - 1 - level)
        src_bit = r >= ab  # quadrants c and d: lower half
        dst_bit = ((r >= cfg.a) & (r < ab)) | (r >= abc)  # quadrants b and d
        src += src_bit * bit
        dst += dst_bit * bit
    perm = rng.permutation(n)  # Graph500 scrambles vertex labels
    src, dst = perm[src], perm[dst]
    keep = src != dst
    lo = np.minimum(src[keep], dst[keep])
    hi = np.maximum(src[keep], dst[keep])
    del src, dst, keep
    keys = _sorted_unique(lo * n + hi)
    del lo, hi
    src_half, dst_half = np.divmod(keys, n)
    graph = _symmetric_graph(src_half, dst_half, n)
    node_data: dict[str, torch.Tensor] = {}
    if cfg.features:
        node_data["x"] = torch.from_numpy(
            rng.standard_normal((n, cfg.features), dtype=np.float32)
        )
    if cfg.classes:
        node_data["y"] = torch.from_numpy(rng.integers(0, cfg.classes, n))
        split = rng.permutation(n)
        a, b = int(0.6 * n), int(0.8 * n)
        node_data["train_idx"] = torch.from_numpy(np.sort(split[:a]))
        node_data["val_idx"] = torch.from_numpy(np.sort(split[a:b]))
        node_data["test_idx"] = torch.from_numpy(np.sort(split[b:]))
    return graph.replace(name=f"rmat-s{cfg.scale}-e{cfg.edge_factor}", **node_data)


def _finite(value: Any) -> bool:
    """Whether ``value`` is a finite real number (NaN fails every range check
    silently, since comparisons with NaN are all false)."""
    try:
        return math.isfinite(value)
    except (TypeError, OverflowError):
        return False


def _check(ok: bool, name: str, expected: str, value: Any) -> None:
    """Raise ``ValueError("NAME: must be EXPECTED, got VALUE")`` unless ``ok``."""
    if not ok:
        raise ValueError(f"{name}: must be {expected}, got {value}")


def _machine_memory() -> int:
    """This machine's physical memory in bytes."""
    return int(psutil.virtual_memory().total)


def _check_memory(generator: str, settings: str, parts: dict[str, int]) -> None:
    """Refuse a graph whose arrays cannot fit in this machine's memory.

    Called before anything is allocated, so that the user reads which options
    are too large instead of a numpy MemoryError from deep inside. ``parts`` are
    the generator's largest arrays in bytes; their sum estimates its peak. The
    peak can be higher than the sum, as temporaries made while drawing edges
    add up to twice the edge arrays; where x dominates, it can be lower by up
    to half of the edge arrays.

    Raises:
        ValueError: naming the generator, its size options, the bytes needed
            and the machine's memory.
    """
    need = sum(parts.values())
    have = _machine_memory()
    if need <= have:
        return
    detail = ", ".join(
        f"{format_bytes(size)} for {what}"
        for what, size in sorted(parts.items(), key=lambda item: -item[1])
        if size
    )
    raise ValueError(
        f"synthetic:{generator}: {settings} needs {format_bytes(need)} of memory "
        f"({detail}), more than this machine's {format_bytes(have)}"
    )


def _lookup(cumulative: np.ndarray, queries: np.ndarray) -> np.ndarray:
    """``searchsorted(cumulative, queries)`` clipped to valid rows, done on sorted
    queries: binary searches in increasing order stay in cache."""
    order = np.argsort(queries)
    found = np.empty(queries.size, dtype=np.int64)
    found[order] = np.searchsorted(cumulative, queries[order])
    np.minimum(found, cumulative.size - 1, out=found)
    return found


def _sorted_unique(keys: np.ndarray) -> np.ndarray:
    """Sorted distinct values of ``keys`` (sorts ``keys`` in place)."""
    keys.sort()
    if keys.size == 0:
        return keys
    keep = np.empty(keys.size, dtype=bool)
    keep[0] = True
    np.not_equal(keys[1:], keys[:-1], out=keep[1:])
    return keys[keep]


def _symmetric_graph(src_half: np.ndarray, dst_half: np.ndarray, n: int) -> Graph:
    """CSR (row = dst) of both directions of the unique pairs ``src_half < dst_half``.

    ``src_half`` is sorted (the pairs come from sorted keys), so the reverse
    direction is already grouped by destination; the forward one needs a sort.
    Both halves are merged row by row without materialising a 2E key array.
    """
    num_half = src_half.size
    # Row r holds: sources s < r (pairs (s, r): forward edges s -> r) and
    # sources t > r (pairs (r, t): reverse edges t -> r).
    in_low = np.bincount(dst_half, minlength=n)  # sources below the row
    in_high = np.bincount(src_half, minlength=n)  # sources above the row
    indptr = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(in_low + in_high, out=indptr[1:])
    indices = np.empty(2 * num_half, dtype=np.int64)
    # Forward part: sort pairs by destination; stable keeps sources ascending.
    order = np.argsort(dst_half, kind="stable")
    low_pos = np.repeat(indptr[:-1], in_low)
    low_pos += np.arange(num_half) - np.repeat(np.cumsum(in_low) - in_low, in_low)
    indices[low_pos] = src_half[order]
    del order, low_pos
    # Reverse part: pairs are sorted by src_half (the row), then dst ascending.
    high_pos = np.repeat(indptr[:-1] + in_low, in_high)
    high_pos += np.arange(num_half) - np.repeat(np.cumsum(in_high) - in_high, in_high)
    indices[high_pos] = dst_half
    del high_pos
    return Graph(indptr=torch.from_numpy(indptr), indices=torch.from_numpy(indices))


def _class_features(
    rng: np.random.Generator,
    labels: np.ndarray,
    num_features: int,
    num_classes: int,
    signal: float,
) -> np.ndarray | None:
    """float32 [N, F]: ``signal * mu[y] + noise``, with ``mu`` unit-norm per class.

    ``signal`` is the length of the class signal relative to per-entry noise
    std 1, measured over all F dimensions: each entry of ``mu`` is about
    ``signal / sqrt(F)``, far below the noise, so one node is hard to classify
    from its own features but an average over a few same-class neighbours is not.
    """
    if num_features == 0:
        return None
    mu = rng.standard_normal((num_classes, num_features)).astype(np.float32)
    mu *= np.float32(signal) / np.linalg.norm(mu, axis=1, keepdims=True)
    n = labels.size
    x = np.empty((n, num_features), dtype=np.float32)
    for start in range(0, n, _FEATURE_CHUNK_ROWS):  # loop over chunks, not nodes
        stop = min(start + _FEATURE_CHUNK_ROWS, n)
        block = x[start:stop]
        rng.standard_normal(out=block, dtype=np.float32)
        block += mu[labels[start:stop]]
    return x
