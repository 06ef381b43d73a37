"""ByteGNN's GNN-tailored partitioning (``--partition blocks``).

A GNN with ``K`` layers reads, for a seed, only its ``K``-hop in-neighbourhood;
a partition that keeps those neighbourhoods whole moves few rows, whatever its
edge cut (ByteGNN, seed ``002`` §4.3; digest §3.2 (e)). Two steps:

1. **blocks** (:func:`neighbourhood_blocks`): a ``K``-hop breadth-first
   search from every train, validation and test node at once (its *centre*),
   level by level along in-edges. A node keeps the first block that reaches
   it; centres keep their own. Where several blocks reach a node in the same
   level, the smallest block ID wins (block IDs are the centres in ascending
   node order), so the blocks do not depend on any visiting order. Every
   block is connected: each of its nodes took the block from a node of the
   level before it.
2. **assignment** (:func:`assign_blocks`, the digest's corrected Algorithm 2):
   blocks in descending order of their largest split count
   ``max(|train|, |val|, |test|)`` (ties: block ID), each to the part ``j``
   with the largest ``CE_j * BS_j``, where

   - ``CE_j = cross_edges(P_j, B) / |P_j|``: the undirected edges between
     the block and the part, per node of the part;
   - ``BS_j = 1 - α train_j / C_train - β val_j / C_val - γ test_j / C_test``,
     ``C_s = |V_s| / P`` a part's fair share of split ``s``, and ``α``,
     ``β``, ``γ`` a third each by default (summing to 1, so ``BS_j`` is 1
     for an empty part and 0 for one holding its fair share of every
     split).

   The cases the paper leaves open: an empty part has ``CE = 0`` (no edges
   to it); ``BS`` is clamped at 0, so a part past its share takes a block
   only when every part is; where every ``CE_j * BS_j`` is 0 (the block
   touches no assigned node, or only full parts) the block goes to the part
   of largest ``BS`` (ties: fewer nodes, then the lower part ID).
   Nodes no search reaches (farther than ``K`` hops from every labelled
   node, which no epoch reads) go last, one at a time, to the part with
   the fewest nodes.

Where every node is labelled (ogbn-products, the synthetic products graph),
every block is one node and step 2 is a streaming greedy assignment in node
order. :func:`remote_khop_accesses` counts what ByteGNN minimises: the
``K``-hop neighbours of the seeds that live in another part than the seed.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import scipy.sparse as sp

from graphwire.graph.graph import Graph
from graphwire.partition.base import Partitioner, register
from graphwire.partition.metis import MetisPartitioner

__all__ = [
    "SPLITS",
    "BlocksPartitioner",
    "BlocksReport",
    "assign_blocks",
    "neighbourhood_blocks",
    "remote_khop_accesses",
]

SPLITS = ("train", "val", "test")
_FULL = 1e-9  # a balance score at most this is 0: the part holds its share


def neighbourhood_blocks(graph: Graph, centres: np.ndarray, hops: int) -> np.ndarray:
    """int64 [N]: each node's block, the index in ``centres`` of the centre
    whose ``hops``-hop search reached it first (module docstring, step 1);
    -1 for nodes none reached.

    Args:
        graph: in-edge CSR; a search walks from a node to its in-neighbours.
        centres: int64 [C], distinct node IDs, ascending.
        hops: K >= 0.
    """
    indptr, indices = graph.indptr.numpy(), graph.indices.numpy()
    block = np.full(graph.num_nodes, -1, dtype=np.int64)
    block[centres] = np.arange(centres.size, dtype=np.int64)
    frontier = centres
    for _ in range(hops):
        if not frontier.size:
            break
        start, stop = indptr[frontier], indptr[frontier + 1]
        deg = stop - start
        origin = np.repeat(frontier, deg)
        offset = np.arange(deg.sum()) - np.repeat(np.cumsum(deg) - deg, deg)
        reached = indices[np.repeat(start, deg) + offset]
        fresh = block[reached] < 0
        reached, origin = reached[fresh], origin[fresh]
        claim = np.full(graph.num_nodes, np.iinfo(np.int64).max, dtype=np.int64)
        np.minimum.at(claim, reached, block[origin])
        frontier = np.unique(reached)
        block[frontier] = claim[frontier]
    return block


def split_masks(graph: Graph) -> np.ndarray:
    """bool [3, N]: whether each node is in train, val, test."""
    masks = np.zeros((len(SPLITS), graph.num_nodes), dtype=bool)
    for row, split in enumerate(SPLITS):
        idx = getattr(graph, f"{split}_idx")
        if idx is not None:
            masks[row, idx.numpy()] = True
    return masks


def assign_blocks(
    graph: Graph,
    block: np.ndarray,
    num_parts: int,
    weights: tuple[float, float, float] = (1 / 3, 1 / 3, 1 / 3),
) -> np.ndarray:
    """int64 [N]: the part of every node (module docstring, step 2).

    Args:
        graph: its undirected edges count as cross edges; its splits weigh.
        block: int64 [N] from :func:`neighbourhood_blocks` (-1: unreached).
        num_parts: P.
        weights: ``(α, β, γ)``.
    """
    masks = split_masks(graph)
    totals = masks.sum(1)
    w = np.array(weights, dtype=np.float64)
    # BS_j = 1 - sum_s w_s n_js / C_s: a node of split s costs w_s P / |V_s|.
    cost = np.where(totals > 0, w * num_parts / np.maximum(totals, 1), 0.0)
    num_blocks = int(block.max()) + 1 if block.size else 0
    reached = block >= 0
    counts = np.stack(
        [np.bincount(block[reached & m], minlength=num_blocks) for m in masks]
    )  # [3, B]
    order = np.lexsort((np.arange(num_blocks), -counts.max(0)))
    members = np.argsort(block, kind="stable")[np.count_nonzero(~reached) :]
    first = np.searchsorted(block[members], np.arange(num_blocks + 1))
    adjacency = graph.symmetric.remove_self_loops()
    adj_ptr, adj_idx = adjacency.indptr.numpy(), adjacency.indices.numpy()

    part = np.full(graph.num_nodes, -1, dtype=np.int64)
    size = np.zeros(num_parts, dtype=np.int64)
    balance = np.ones(num_parts)
    block_cost = cost @ counts  # [B]: what a block takes from BS
    for b in order:
        nodes = members[first[b] : first[b + 1]]
        if nodes.size == 1:
            v = nodes[0]
            near = adj_idx[adj_ptr[v] : adj_ptr[v + 1]]
        else:
            near = np.concatenate([adj_idx[adj_ptr[v] : adj_ptr[v + 1]] for v in nodes])
        owners = part[near]
        cross = np.bincount(owners[owners >= 0], minlength=num_parts)
        room = np.where(balance > _FULL, balance, 0.0)  # clamped at 0
        score = cross / np.maximum(size, 1) * room
        if score.max() > 0:
            j = int(np.argmax(score))
        else:  # largest BS; ties: fewer nodes, then the lower ID
            j = int(np.lexsort((np.arange(num_parts), size, -balance))[0])
        part[nodes] = j
        size[j] += nodes.size
        balance[j] -= block_cost[b]
    for v in np.flatnonzero(~reached):  # unreached: the smallest part
        j = int(np.argmin(size))
        part[v] = j
        size[j] += 1
    return part


def remote_khop_accesses(
    graph: Graph, assignment: np.ndarray, seeds: np.ndarray, hops: int
) -> int:
    """Over ``seeds``, the nodes within ``hops`` in-hops of a seed (itself
    excluded) that another part than the seed's owns: the rows an epoch of
    full-neighbourhood mini-batches over ``seeds`` reads remotely."""
    if not seeds.size or hops < 1:
        return 0
    adjacency = graph.to_scipy().astype(bool)
    frontier = adjacency[seeds]
    reach = frontier
    for _ in range(hops - 1):
        frontier = frontier @ adjacency
        reach = reach + frontier
    reach = sp.coo_matrix(reach)
    seed = seeds[reach.row]
    other = (assignment[reach.col] != assignment[seed]) & (reach.col != seed)
    return int(np.count_nonzero(other))


@dataclass(frozen=True)
class BlocksReport:
    """What one blocks partitioning did, beside METIS on the same graph.

    Attributes:
        blocks: the number of blocks (labelled nodes).
        largest: nodes in the largest block.
        unreached: nodes no search reached.
        remote_accesses: :func:`remote_khop_accesses` of the training nodes.
        metis_accesses: the same for METIS's parts (None: not compared).
        edge_cut / metis_cut: undirected edges between parts, each.
    """

    blocks: int
    largest: int
    unreached: int
    hops: int
    remote_accesses: int
    edge_cut: int
    metis_accesses: int | None = None
    metis_cut: int | None = None

    def line(self) -> str:
        """One line for ``graphwire partition``."""
        text = (
            f"blocks: {self.blocks:,} blocks (the largest {self.largest:,} nodes), "
            f"{self.unreached:,} nodes unreached; remote {self.hops}-hop "
            f"accesses of an epoch's training nodes {self.remote_accesses:,}"
        )
        if self.metis_accesses is None or self.metis_cut is None:
            return text
        return (
            f"{text} (METIS: {self.metis_accesses:,}, "
            f"{_ratio(self.remote_accesses, self.metis_accesses)}); "
            f"undirected edge cut {self.edge_cut:,} (METIS: {self.metis_cut:,})"
        )


def _ratio(ours: int, theirs: int) -> str:
    return f"{ours / theirs:.2f}x" if theirs else "n/a"


def undirected_cut(graph: Graph, assignment: np.ndarray) -> int:
    """Undirected edges (no self-loops) whose ends lie in different parts."""
    adjacency = graph.symmetric.remove_self_loops()
    dst = adjacency.dst_of_edges.numpy()
    cut = assignment[adjacency.indices.numpy()] != assignment[dst]
    return int(np.count_nonzero(cut)) // 2


@register("blocks")
@dataclass(kw_only=True)
class BlocksPartitioner(Partitioner):
    """ByteGNN's K-hop blocks and balanced assignment (module docstring).

    Attributes:
        hops: K, the GNN's layers: how far a block reaches.
        alpha / beta / gamma: the weights of the train, val and test balance,
            all three or none (None: a third each; the paper suggests
            weighting the dominant split, but on products-like splits, 90%
            test, that leaves the training nodes 1.24x imbalanced).
        compare: also partition with METIS and report both
            (:attr:`last_report`).
    """

    hops: int = 2
    alpha: float | None = None
    beta: float | None = None
    gamma: float | None = None
    compare: bool = True
    last_report: BlocksReport | None = field(default=None, init=False, repr=False)

    def __post_init__(self) -> None:
        if not isinstance(self.hops, int) or isinstance(self.hops, bool):
            raise ValueError(f"hops: expected an int, found {self.hops!r}")
        if self.hops < 0:
            raise ValueError(f"hops: must be >= 0, found {self.hops}")
        given = [w for w in self.weights_given if w is not None]
        if given and len(given) != 3:
            raise ValueError(
                "alpha, beta, gamma: give all three or none, found "
                f"{self.weights_given}"
            )
        for name, w in zip(("alpha", "beta", "gamma"), self.weights_given, strict=True):
            if w is not None and not (math.isfinite(w) and w >= 0):
                raise ValueError(f"{name}: expected a finite weight >= 0, found {w}")

    @property
    def weights_given(self) -> tuple[float | None, float | None, float | None]:
        return (self.alpha, self.beta, self.gamma)

    def assign(self, graph: Graph, num_parts: int, seed: int) -> np.ndarray:
        """The parts (deterministic: ties go by IDs; ``seed`` seeds only the
        METIS partition the report compares with)."""
        masks = split_masks(graph)
        centres = np.flatnonzero(masks.any(0))
        block = neighbourhood_blocks(graph, centres, self.hops)
        given = self.weights_given
        weights = (1 / 3, 1 / 3, 1 / 3)
        if given[0] is not None and given[1] is not None and given[2] is not None:
            weights = (float(given[0]), float(given[1]), float(given[2]))
        part = assign_blocks(graph, block, num_parts, weights)
        train = np.flatnonzero(masks[0])
        self.last_report = self._report(graph, block, part, num_parts, train, seed)
        return part

    def _report(
        self,
        graph: Graph,
        block: np.ndarray,
        part: np.ndarray,
        num_parts: int,
        train: np.ndarray,
        seed: int,
    ) -> BlocksReport:
        reached = block[block >= 0]
        report = BlocksReport(
            blocks=int(reached.max()) + 1 if reached.size else 0,
            largest=int(np.bincount(reached).max()) if reached.size else 0,
            unreached=int(block.size - reached.size),
            hops=self.hops,
            remote_accesses=remote_khop_accesses(graph, part, train, self.hops),
            edge_cut=undirected_cut(graph, part),
        )
        if not self.compare:
            return report
        metis = MetisPartitioner().partition(graph, num_parts, seed=seed)
        theirs = metis.assignment.numpy()
        return dataclasses.replace(
            report,
            metis_accesses=remote_khop_accesses(graph, theirs, train, self.hops),
            metis_cut=undirected_cut(graph, theirs),
        )

    def params(self) -> dict[str, Any]:
        return {
            "hops": self.hops,
            "alpha": self.alpha,
            "beta": self.beta,
            "gamma": self.gamma,
        }
