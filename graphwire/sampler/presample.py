"""RapidGNN's presampled schedule: every batch of the run, sampled before training.

The batches are streamed to disk and read back memory-mapped.

Because every batch's seeds are hashed from ``(s0, worker, epoch, batch)``
(the mini-batch schedule), the blocks of the whole run are known
before it starts. :func:`presample_epoch` samples one epoch's batches and
appends each to ``<folder>/epoch_<e>/`` as soon as it is sampled, so no more
than one batch's blocks is in memory at a time (with the epoch's remote
access counts); :class:`PresampledEpoch` reads them back memory-mapped, so
resident memory does not grow with the number of epochs.

One epoch folder (written to a temporary name, then renamed):

    ints.bin     int64 [*]   per batch: seeds, then per layer src_nid, indptr,
                             indices, eid (concatenated; raw, native order)
    weights.bin  float32 [*] per batch and layer, the edge weights (GCN) or none
    local.bin    bool [*]    per batch, whether each input node is owned here
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
from typing import IO, Any

import numpy as np
import torch

from graphwire.fsutil import load_npy
from graphwire.sampler.base import Batch, Block, SampledBatch

__all__ = ["PresampledEpoch", "access_ranking", "lock_rank_folder", "presample_epoch"]

Sample = Callable[[Batch], SampledBatch]

# The streamed arrays: file name -> dtype.
_STREAMS = {"ints": np.int64, "weights": np.float32, "local": np.bool_}


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
    counter = _AccessCounter()
    for i, r in zip(inputs, remote, strict=True):
        counter.add(i[r])
    return counter.ranking()


class _AccessCounter:
    """Access counts of node IDs, added batch by batch: the distinct IDs
    seen so far, sorted, with their counts (never every access kept)."""

    def __init__(self) -> None:
        self.ids = torch.empty(0, dtype=torch.int64)
        self.counts = torch.empty(0, dtype=torch.int64)

    def add(self, ids: torch.Tensor) -> None:
        new, new_counts = torch.unique(ids, return_counts=True)
        both = torch.cat([self.ids, new])
        self.ids, where = torch.unique(both, return_inverse=True)
        self.counts = torch.zeros(self.ids.numel(), dtype=torch.int64).index_add_(
            0, where, torch.cat([self.counts, new_counts])
        )

    def ranking(self) -> tuple[torch.Tensor, torch.Tensor]:
        """``(ids, counts)``, most accessed first, ties by lower ID."""
        order = torch.sort(self.counts, descending=True, stable=True).indices
        return self.ids[order], self.counts[order]


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
    target = epoch_folder(folder, epoch)
    partial = target.with_name(target.name + ".partial")
    shutil.rmtree(partial, ignore_errors=True)
    # Not parents=True: a folder removed under a run that is stopping
    # must stay removed.
    partial.mkdir()
    index: list[list[list[int]]] = []
    counter = _AccessCounter()
    cursor = dict.fromkeys(_STREAMS, 0)
    with _Streams(partial) as files:

        def put(kind: str, tensor: torch.Tensor) -> list[int]:
            files.write(kind, tensor.numpy().astype(_STREAMS[kind], copy=False))
            entry = [cursor[kind], tensor.numel()]
            cursor[kind] += tensor.numel()
            return entry

        for batch in batches:
            sampled = sample(batch)
            row = [put("ints", sampled.seeds)]
            for block in sampled.blocks:
                for field in (block.src_nid, block.indptr, block.indices, block.eid):
                    row.append(put("ints", field))
            for block in sampled.blocks:
                weight = block.edge_weight
                empty = torch.empty(0, dtype=torch.float32)
                row.append(put("weights", empty if weight is None else weight))
            local = is_local(sampled.input_nid)
            row.append(put("local", local))
            index.append(row)
            counter.add(sampled.input_nid[~local])
    hot_ids, hot_counts = counter.ranking()
    arrays = {
        "index": np.asarray(index, dtype=np.int64),
        "hot_ids": hot_ids.numpy(),
        "hot_counts": hot_counts.numpy(),
    }
    for name, array in arrays.items():
        np.save(partial / f"{name}.npy", array)
    shutil.rmtree(target, ignore_errors=True)
    partial.rename(target)
    return target


class _Streams:
    """One epoch's raw files, open for appending (:data:`_STREAMS`)."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self._files: dict[str, IO[bytes]] = {}

    def __enter__(self) -> _Streams:
        for kind in _STREAMS:
            self._files[kind] = open(self.folder / f"{kind}.bin", "wb")  # noqa: SIM115
        return self

    def write(self, kind: str, array: np.ndarray) -> None:
        np.ascontiguousarray(array).tofile(self._files[kind])

    def __exit__(self, *exc: Any) -> None:
        for handle in self._files.values():
            handle.close()


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
        index = load_npy(path / "index.npy", mmap_mode="r")
        self.hot_ids = torch.from_numpy(load_npy(path / "hot_ids.npy"))
        self.hot_counts = torch.from_numpy(load_npy(path / "hot_counts.npy"))
        expected = 2 + 5 * num_layers
        if index.shape[1:] != (expected, 2):
            raise ValueError(
                f"{path}/index.npy: expected shape [B, {expected}, 2] for "
                f"{num_layers} layers, found {index.shape}"
            )
        self._arrays: dict[str, np.ndarray] = {"index": index}
        # Which columns of a batch's row index each stream.
        columns = {
            "ints": slice(0, 1 + 4 * num_layers),
            "weights": slice(1 + 4 * num_layers, 1 + 5 * num_layers),
            "local": slice(1 + 5 * num_layers, 2 + 5 * num_layers),
        }
        for name, dtype in _STREAMS.items():
            entries = np.asarray(index[:, columns[name]]).reshape(-1, 2)
            need = int((entries[:, 0] + entries[:, 1]).max()) if len(entries) else 0
            self._arrays[name] = _map(path / f"{name}.bin", dtype, need)

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


def _map(path: Path, dtype: Any, need: int) -> np.ndarray:
    """``path``'s raw array of ``dtype``, memory-mapped, checked to hold the
    ``need`` items the index reads."""
    try:
        size = path.stat().st_size
    except FileNotFoundError:
        raise FileNotFoundError(f"{path}: missing from the presampled epoch") from None
    have = size // np.dtype(dtype).itemsize
    if have < need or size % np.dtype(dtype).itemsize:
        raise ValueError(
            f"{path}: holds {size} bytes, the index reads {need} items of "
            f"{np.dtype(dtype).name} (truncated or not a presampled file)"
        )
    if need == 0:
        return np.empty(0, dtype=dtype)
    return np.memmap(path, dtype=dtype, mode="r", shape=(have,))
