"""A link-prediction mini-batch: three branches, one stack of blocks.

A batch of ``B`` seed nodes becomes (ByteGNN's unsupervised DAG, seed
``002`` Fig. 9):

1. **positives** ``P [B]`` (one per seed, -1: none) and **negatives**
   ``N [B, k]``, drawn by the seeds' owners
   (:class:`~graphwire.sampler.dist_pairs.DistPairSampler`);
2. three **branches** of seeds: the seeds, the distinct positives, the
   distinct negatives, each sampled ``L`` hops deep and its input rows
   fetched;
3. the branches merged into one stack of blocks
   (:func:`~graphwire.sampler.links.merge_branches`), whose output rows are
   ``[seeds | positives | negatives]``, and the **pairs** to score.

What the fetchers hand over is the supervised batch's triple with the pairs
where the labels were: ``y`` int64 [3, Q], per pair its source row, its
destination row (rows of the model's output) and its label (1: positive,
first; 0: negative), ``Q = B' (1 + k)`` for the ``B'`` seeds with a
positive. :class:`LinkMaker` makes a batch on one thread, the serial
loader's way; the task graphs (:mod:`~graphwire.minibatch.taskgraph`) make
the same batch from the same steps.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import torch

from graphwire.feature.fetcher import Made
from graphwire.sampler.base import Batch, SampledBatch
from graphwire.sampler.links import merge_branches, pair_seeds

__all__ = ["LinkMaker", "assemble_link", "link_branches"]


def link_branches(
    seeds: torch.Tensor, positives: torch.Tensor, negatives: torch.Tensor
) -> tuple[list[torch.Tensor], torch.Tensor]:
    """The three branches' seeds and the pairs (module docstring).

    Args:
        seeds: int64 [B], distinct.
        positives: int64 [B], -1 where a seed has none (its pairs dropped).
        negatives: int64 [B, k].

    Returns:
        ``([seeds, distinct positives, distinct negatives], y [3, Q])``.
    """
    num_seeds, k = negatives.shape
    valid = (positives >= 0).nonzero().view(-1)
    pos, pos_row = torch.unique(positives[valid], return_inverse=True)
    neg, neg_row = torch.unique(negatives.reshape(-1), return_inverse=True)
    neg_row = neg_row.view(num_seeds, k).index_select(0, valid).reshape(-1)
    src = torch.cat([valid, valid.repeat_interleave(k)])
    dst = torch.cat([num_seeds + pos_row, num_seeds + pos.numel() + neg_row])
    label = torch.zeros(src.numel(), dtype=torch.int64)
    label[: valid.numel()] = 1
    return [seeds, pos, neg], torch.stack([src, dst, label])


def assemble_link(
    branches: list[SampledBatch], rows: list[torch.Tensor], pairs: torch.Tensor
) -> tuple[SampledBatch, torch.Tensor, torch.Tensor]:
    """The merged batch, its input rows (``rows[b]``: branch ``b``'s, in its
    input order) and the pairs: the fetched triple."""
    merged, at = merge_branches(branches)
    x = torch.empty(merged.input_nid.numel(), rows[0].shape[1])
    for where, branch_rows in zip(at, rows, strict=True):
        x[where] = branch_rows
    return merged, x, pairs


Sample = Callable[[torch.Tensor, int], SampledBatch]
Draw = Callable[[torch.Tensor, int], torch.Tensor]
Rows = Callable[[torch.Tensor], tuple[torch.Tensor, dict[str, float]]]


class LinkMaker:
    """Makes link batches step by step on the calling thread.

    Args:
        seeds: ``(batch) -> int64 [B]``: the seed operator.
        positives: ``(seeds, seed) -> int64 [B]``.
        negatives: ``(seeds, seed) -> int64 [B, k]``.
        sample: ``(branch seeds, batch seed) -> SampledBatch``.
        rows: ``(input nid) -> (rows, counts)``: a branch's input rows and
            what reading them counted (``local_rows``, ``missed_rows``, ...).
    """

    def __init__(
        self,
        seeds: Callable[[Batch], torch.Tensor],
        positives: Draw,
        negatives: Draw,
        sample: Sample,
        rows: Rows,
    ) -> None:
        self.seeds, self.positives, self.negatives = seeds, positives, negatives
        self.sample, self.rows = sample, rows

    def make(self, batch: Batch) -> Made:
        """``batch`` as the fetchers make it (a
        :data:`~graphwire.feature.fetcher.Made`)."""
        began = time.perf_counter()
        pos_seed, neg_seed = pair_seeds(batch.seed)
        seeds = self.seeds(batch).contiguous()
        positives = self.positives(seeds, pos_seed)
        negatives = self.negatives(seeds, neg_seed)
        roots, pairs = link_branches(seeds, positives, negatives)
        branches = [self.sample(nid, batch.seed) for nid in roots]
        sampled_at = time.perf_counter()
        counts: dict[str, float] = {}
        rows = []
        for branch in branches:
            branch_rows, branch_counts = self.rows(branch.input_nid)
            rows.append(branch_rows)
            for name, value in branch_counts.items():
                counts[name] = counts.get(name, 0.0) + value
        sampled, x, y = assemble_link(branches, rows, pairs)
        counts["sample_busy_s"] = sampled_at - began
        counts["fetch_busy_s"] = time.perf_counter() - sampled_at
        return sampled, x, y, counts
