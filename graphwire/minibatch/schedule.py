"""The distributed mini-batch schedule: who trains on which seeds, when.

Two parts, both functions of the run's seed and nothing else, so every rank
(and a resumed run, and RapidGNN's presampler) computes the same schedule:

- :func:`split_train` — DistDGL's two-level split: each trainer gets an equal
  share of the training nodes (``T // W``, the first ``T % W`` trainers one
  more), taken from its own partition first; the surplus of partitions with
  more training nodes than their trainer's share fills the others' deficits,
  in rank order.
- :func:`epoch_batches` — one trainer's batches of one epoch: its share
  shuffled by a permutation seeded with ``H(s0, worker, epoch)``, cut into the
  same number of steps on every trainer (``ceil(max share / batch_size)``,
  near-equal parts), each batch with sampling seed ``H(s0, worker, epoch, i)``.

``H`` is BLAKE2b (RapidGNN asks for a cryptographic hash): the streams of
different (worker, epoch, batch) tuples are unrelated, and the whole schedule
of the run is known before it starts.
"""

from __future__ import annotations

import hashlib
import math

import torch

from graphwire.sampler.base import Batch

__all__ = [
    "Batch",
    "epoch_batches",
    "schedule_seed",
    "share_sizes",
    "split_train",
    "steps_per_epoch",
]


def schedule_seed(*parts: int) -> int:
    """A 63-bit seed: BLAKE2b of the parts (e.g. ``s0, worker, epoch, batch``)."""
    data = b"".join(int(p).to_bytes(16, "little", signed=True) for p in parts)
    digest = hashlib.blake2b(data, digest_size=8, person=b"graphwire").digest()
    return int.from_bytes(digest, "little") >> 1


def split_train(per_rank: list[torch.Tensor], rank: int) -> torch.Tensor:
    """This trainer's training nodes under the two-level split.

    Args:
        per_rank: every partition's training nodes (global IDs), by rank.
        rank: this trainer.

    Returns:
        int64 [share], sorted; the shares of all ranks partition the union.
    """
    lists = [torch.sort(ids.to(torch.int64)).values for ids in per_rank]
    quota = share_sizes(sum(ids.numel() for ids in lists), len(per_rank))
    kept = [ids[: quota[r]] for r, ids in enumerate(lists)]
    pool = torch.cat([ids[quota[r] :] for r, ids in enumerate(lists)])
    start = sum(max(0, quota[r] - lists[r].numel()) for r in range(rank))
    need = max(0, quota[rank] - lists[rank].numel())
    mine = torch.cat([kept[rank], pool[start : start + need]])
    return torch.sort(mine).values


def share_sizes(total: int, world: int) -> list[int]:
    """Every trainer's number of training nodes: ``total // world``, the
    first ``total % world`` trainers one more."""
    return [total // world + (1 if r < total % world else 0) for r in range(world)]


def steps_per_epoch(shares: list[int], batch_size: int) -> int:
    """The number of steps every trainer runs per epoch."""
    if batch_size < 1:
        raise ValueError(f"batch_size: expected >= 1, got {batch_size}")
    return max(1, math.ceil(max(shares) / batch_size))


def epoch_batches(
    share: torch.Tensor, s0: int, worker: int, epoch: int, steps: int
) -> list[Batch]:
    """This trainer's ``steps`` batches of ``epoch`` (near-equal sizes)."""
    gen = torch.Generator().manual_seed(schedule_seed(s0, worker, epoch))
    order = share[torch.randperm(share.numel(), generator=gen)]
    return [
        Batch(
            epoch=epoch,
            index=i,
            seeds=seeds,
            seed=schedule_seed(s0, worker, epoch, i),
            dropout_seed=schedule_seed(s0, -1, epoch, i),
        )
        for i, seeds in enumerate(torch.tensor_split(order, steps))
    ]
