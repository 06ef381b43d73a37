"""RapidGNN's presampled schedule: every batch of the run, sampled before training.

The batches are streamed to disk and read back memory-mapped.

Because every batch's seeds are hashed from ``(s0, worker, epoch, batch)``
(the mini-batch schedule), the blocks of the whole run are known
before it starts. :func:`presample_epoch` samples one epoch's batches and
writes them to ``<folder>/epoch_<e>/``; only one epoch is in memory at a time,
and :class:`PresampledEpoch` reads them back memory-mapped, so resident memory
does not grow with the number of epochs.

One epoch folder (written to a temporary name, then renamed):

    ints.npy     int64 [*]   per batch: seeds, then per layer src_nid, indptr,
                             indices, eid (concatenated)
    weights.npy  float32 [*] per batch and layer, the edge weights (GCN) or none
    local.npy    bool [*]    per batch, whether each input node is owned here
    index.npy    int64 [B, 2 + 5 L, 2]   (offset, length) of each piece
    hot_ids.npy  int64 [H]   remote input nodes of the epoch, most accessed
    hot_counts.npy int64 [H] first (ties: lower ID first), and their counts

Blocks read back are bitwise equal to the ones sampled: the same sampler with
the same seeds produces them on demand (the test of ``--fetch rapid``).
"""

from __future__ import annotations

import fcntl
import os
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import IO

import numpy as np
import torch

from graphwire.fsutil import load_npy
from graphwire.sampler.base import Batch, Block, SampledBatch

__all__ = ["PresampledEpoch", "access_ranking", "lock_rank_folder", "presample_epoch"]

Sample = Callable[[Batch], SampledBatch]


def epoch_folder(folder: str | os.PathLike[str], epoch: int) -> Path:
    return Path(folder) / f"epoch_{epoch:05d}"


def access_ranking(
    inputs: list[torch.Tensor], remote: list[torch.Tensor]
) -> tuple[torch.Tensor, torch.Tensor]:
    """Remote input nodes by access count over an epoch's batches.

    Args:
        inputs: per batch, the input node IDs.
        remote: per batch, which of them are remote.

    Returns:
        ``(ids, counts)``, most accessed first, ties by lower ID.
    """
    ids = torch.cat([i[r] for i, r in zip(inputs, remote, strict=True)])
    unique, counts = torch.unique(ids, return_counts=True)  # sorted by ID
    order = torch.sort(counts, descending=True, stable=True).indices
    return unique[order], counts[order]


def presample_epoch(
    folder: str | os.PathLike[str],
    batches: list[Batch],
    sample: Sample,
    is_local: Callable[[torch.Tensor], torch.Tensor],
) -> Path:
    """Sample ``batches`` (one epoch) and write them under ``folder``.

    Args:
        folder: this rank's presample folder.
        batches: the epoch's batches, in order.
        sample: ``batch -> SampledBatch``.
        is_local: global IDs -> bool mask of the ones owned here.

    Returns:
        The epoch folder.
    """
    epoch = batches[0].epoch
    ints: list[torch.Tensor] = []
    weights: list[torch.Tensor] = []
    flags: list[torch.Tensor] = []
    index: list[list[list[int]]] = []
    inputs: list[torch.Tensor] = []
    remote: list[torch.Tensor] = []
    cursor = {"ints": 0, "weights": 0, "local": 0}

    def put(kind: str, store: list[torch.Tensor], tensor: torch.Tensor) -> list[int]:
        store.append(tensor)
        entry = [cursor[kind], tensor.numel()]
        cursor[kind] += tensor.numel()
        return entry

    for batch in batches:
        sampled = sample(batch)
        row = [put("ints", ints, sampled.seeds)]
        for block in sampled.blocks:
            for field in (block.src_nid, block.indptr, block.indices, block.eid):
                row.append(put("ints", ints, field))
        for block in sampled.blocks:
            weight = block.edge_weight
            empty = torch.empty(0, dtype=torch.float32)
            row.append(put("weights", weights, empty if weight is None else weight))
        local = is_local(sampled.input_nid)
        row.append(put("local", flags, local))
        index.append(row)
        inputs.append(sampled.input_nid)
        remote.append(~local)
    hot_ids, hot_counts = access_ranking(inputs, remote)
    arrays = {
        "ints": _cat(ints, torch.int64),
        "weights": _cat(weights, torch.float32),
        "local": _cat(flags, torch.bool),
        "index": np.asarray(index, dtype=np.int64),
        "hot_ids": hot_ids.numpy(),
        "hot_counts": hot_counts.numpy(),
    }
    target = epoch_folder(folder, epoch)
    partial = target.with_name(target.name + ".partial")
    shutil.rmtree(partial, ignore_errors=True)
    partial.mkdir(parents=True)
    for name, array in arrays.items():
        np.save(partial / f"{name}.npy", array)
    shutil.rmtree(target, ignore_errors=True)
    partial.rename(target)
    return target


def lock_rank_folder(folder: Path, rank: int) -> IO[str] | None:
    """Hold an exclusive lock on ``folder/.lock`` until the returned file is closed.

    The lock file is made if missing; the lock also ends with the process. Two
    runs given one ``--presample-dir`` would replace each other's epochs under
    the reader. None where the file system has no locks.

    Raises:
        ValueError: another live process holds the lock.
    """
    folder.mkdir(parents=True, exist_ok=True)
    lock = open(folder / ".lock", "w")  # noqa: SIM115 - the caller's to close
    try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        lock.close()
        raise ValueError(
            f"--presample-dir {folder.parent}: rank {rank}'s folder is in use by "
            "another run; give each run its own"
        ) from None
    except OSError:  # no locks on this file system
        lock.close()
        return None
    return lock


def _cat(parts: list[torch.Tensor], dtype: torch.dtype) -> np.ndarray:
    if not parts:
        return np.empty(0, dtype=torch.empty(0, dtype=dtype).numpy().dtype)
    return torch.cat([p.to(dtype) for p in parts]).numpy()


class PresampledEpoch:
    """One presampled epoch, memory-mapped.

    Args:
        folder: this rank's presample folder.
        epoch: which epoch.
        num_layers: layers per batch.
        weighted: whether the blocks carry edge weights (GCN).
    """

    def __init__(
        self,
        folder: str | os.PathLike[str],
        epoch: int,
        num_layers: int,
        weighted: bool,
    ) -> None:
        path = epoch_folder(folder, epoch)
        if not (path / "index.npy").exists():
            raise FileNotFoundError(f"{path}: epoch {epoch} was not presampled")
        self.epoch = epoch
        self.num_layers = num_layers
        self.weighted = weighted
        self._arrays = {
            name: load_npy(path / f"{name}.npy", mmap_mode="r")
            for name in ("ints", "weights", "local", "index")
        }
        self.hot_ids = torch.from_numpy(load_npy(path / "hot_ids.npy"))
        self.hot_counts = torch.from_numpy(load_npy(path / "hot_counts.npy"))
        expected = 2 + 5 * num_layers
        if self._arrays["index"].shape[1:] != (expected, 2):
            raise ValueError(
                f"{path}/index.npy: expected shape [B, {expected}, 2] for "
                f"{num_layers} layers, found {self._arrays['index'].shape}"
            )

    @property
    def max_inputs(self) -> int:
        """The most input nodes of any batch of this epoch."""
        index = self._arrays["index"]
        return int(index[:, 1 + 5 * self.num_layers, 1].max()) if len(index) else 0

    @property
    def num_batches(self) -> int:
        return int(self._arrays["index"].shape[0])

    def _piece(self, name: str, entry: np.ndarray) -> torch.Tensor:
        start, length = int(entry[0]), int(entry[1])
        return torch.from_numpy(np.array(self._arrays[name][start : start + length]))

    def batch(self, index: int) -> tuple[SampledBatch, torch.Tensor]:
        """``(blocks, local flags of the input nodes)`` of batch ``index``."""
        row = self._arrays["index"][index]
        layers = self.num_layers
        seeds = self._piece("ints", row[0])
        blocks: list[Block] = []
        for layer in range(layers):
            src_nid, indptr, indices, eid = (
                self._piece("ints", row[1 + 4 * layer + k]) for k in range(4)
            )
            weight = self._piece("weights", row[1 + 4 * layers + layer])
            num_dst = indptr.numel() - 1
            blocks.append(
                Block(
                    indptr,
                    indices,
                    src_nid.numel(),
                    num_dst,
                    weight if self.weighted else None,
                    src_nid=src_nid,
                    dst_nid=src_nid[:num_dst],
                    eid=eid,
                )
            )
        local = self._piece("local", row[1 + 5 * layers])
        return SampledBatch(seeds=seeds, blocks=blocks), local
