"""RapidGNN's presampling, overlapped with training: one epoch ahead or more.

:class:`Presampler` samples the run's epochs to disk in order
(:func:`~graphwire.sampler.presample.presample_epoch`) on a thread of its
own, so that only the first epoch is sampled before training starts; the
others are sampled while the trainer trains the ones before, every rank's
sampling server answering the others' remote frontiers meanwhile.
:meth:`Presampler.epoch` hands out an epoch once it is on disk (waiting for
it if need be: ``waits`` counts how often a caller had to), and
:meth:`Presampler.forget` drops an epoch the run is done with, unmapping its
files and, in a temporary folder, removing them, so neither memory nor disk
holds more than the epochs still to come.
"""

from __future__ import annotations

import shutil
import threading
import time
from collections.abc import Callable
from pathlib import Path

from graphwire.sampler.base import Batch, SampledBatch
from graphwire.sampler.presample import (
    PresampledEpoch,
    epoch_folder,
    presample_epoch,
)

__all__ = ["Presampler"]


class _Stopped(Exception):
    """Raised inside a presample that :meth:`Presampler.stop` ended."""


class Presampler:
    """Presamples epochs in order, the first now and the rest on a thread.

    Args:
        folder: this rank's presample folder.
        epochs: the epochs to presample, in order.
        batches: ``epoch -> its batches``.
        sample: ``batch -> SampledBatch`` (the distributed sampler's).
        is_local: global IDs -> bool mask of the ones owned here.
        num_layers: layers per batch.
        weighted: whether the blocks carry edge weights (GCN).
        remove: whether :meth:`forget` removes an epoch's files (a
            temporary folder: yes; one the user gave: no).
        on_ready: called on the thread with each epoch once it is on disk
            (the first epoch's, in the constructor).

    Attributes:
        first_s: seconds the first epoch took (before training).
        busy_s: seconds the later ones took, on the thread.
        waits: how often :meth:`epoch` found its epoch not yet sampled.
    """

    def __init__(
        self,
        folder: Path,
        epochs: range,
        batches: Callable[[int], list[Batch]],
        sample: Callable[[Batch], SampledBatch],
        is_local: Callable,  # type: ignore[type-arg]
        num_layers: int,
        weighted: bool,
        *,
        remove: bool,
        on_ready: Callable[[int], None] = lambda epoch: None,
    ) -> None:
        self.folder = folder
        self._batches, self._sample, self._is_local = batches, sample, is_local
        self._layers, self._weighted, self._remove = num_layers, weighted, remove
        self._on_ready = on_ready
        self._cond = threading.Condition()
        self._ready: dict[int, PresampledEpoch] = {}
        self._forgotten: set[int] = set()
        self._error: BaseException | None = None
        self._stop = False
        self.first_s = self.busy_s = 0.0
        self.waits = 0
        self.max_inputs = 0
        began = time.perf_counter()
        if epochs:
            self._presample(epochs[0])
        self.first_s = time.perf_counter() - began
        self._thread = threading.Thread(
            target=self._run, args=(epochs[1:],), name="presample", daemon=True
        )
        self._thread.start()

    def _run(self, epochs: range) -> None:
        began = time.perf_counter()
        try:
            for epoch in epochs:
                self._presample(epoch)
        except _Stopped:
            pass
        except BaseException as error:  # raised again to whoever waits
            with self._cond:
                self._error = error
                self._cond.notify_all()
        finally:
            self.busy_s = time.perf_counter() - began

    def _presample(self, epoch: int) -> None:
        presample_epoch(
            self.folder, self._batches(epoch), self._checked_sample, self._is_local
        )
        sampled = PresampledEpoch(self.folder, epoch, self._layers, self._weighted)
        with self._cond:
            self._ready[epoch] = sampled
            self.max_inputs = max(self.max_inputs, sampled.max_inputs)
            self._cond.notify_all()
        self._on_ready(epoch)

    def _checked_sample(self, batch: Batch) -> SampledBatch:
        if self._stop:
            raise _Stopped
        return self._sample(batch)

    def ready(self, epoch: int) -> bool:
        """Whether ``epoch`` is on disk (never waits)."""
        with self._cond:
            return epoch in self._ready

    def epoch(self, epoch: int) -> PresampledEpoch:
        """``epoch``, once it is on disk.

        Raises:
            RuntimeError: presampling failed or was stopped before it, or
                the epoch was forgotten.
        """
        with self._cond:
            if epoch not in self._ready:
                self.waits += 1
            while epoch not in self._ready:
                if epoch in self._forgotten:
                    raise RuntimeError(f"presample: epoch {epoch} was dropped")
                if self._error is not None:
                    raise RuntimeError(
                        f"presampling failed before epoch {epoch}: {self._error}"
                    ) from self._error
                if self._stop or not self._thread.is_alive():
                    raise RuntimeError(
                        f"presample: epoch {epoch} will not be sampled (stopped)"
                    )
                self._cond.wait(timeout=0.5)
            return self._ready[epoch]

    def forget(self, epoch: int) -> None:
        """Drop ``epoch`` (the run is done with it): its memory maps go, and
        its files where the folder is temporary."""
        with self._cond:
            self._ready.pop(epoch, None)  # the maps close with the last reference
            self._forgotten.add(epoch)
        if self._remove:
            shutil.rmtree(epoch_folder(self.folder, epoch), ignore_errors=True)

    def stop(self, timeout: float | None = None) -> None:
        """End presampling after the batch being sampled, and wait for the
        thread to end, ``timeout`` seconds at most (after an error a sample
        may wait on a dead peer until the run's timeout)."""
        with self._cond:
            self._stop = True
            self._cond.notify_all()
        self._thread.join(timeout)

    def raise_error(self) -> None:
        """Raise what made presampling fail, if it did."""
        with self._cond:
            if self._error is not None:
                raise RuntimeError(f"presampling failed: {self._error}") from (
                    self._error
                )
