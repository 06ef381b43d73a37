"""`ExplainRounds`: DGS's explanation rounds, tied to the training steps.

One rank's explainer (:class:`~graphwire.feature.explain.Explainer`) runs a
round every ``T`` global steps (``epoch * steps + index``): round ``k``
starts when the trainer begins step ``k T``, on a snapshot of the model
then, on a thread of its own, and the batches of steps ``[(k+1) T, (k+2) T)``
use it. A batch's round is fixed by its step, so the batches do not depend
on how fast the explainer runs: whoever makes a batch waits for its round
only if that round is not done ``T`` steps after it started. A loader that
makes batches ahead of the trainer must stay fewer than ``T`` steps ahead
(its round may not have started yet otherwise).

The star graph's remote rows, the part's halo, are pulled once
(``kv.explain``), when the first round starts: the batches made before it
hand their remote rows to :meth:`ExplainRounds.record`, and only the halo
rows none of them read are pulled then (a resumed run pulls them all at the
start). A checkpoint keeps the explainer's masks and the
finished rounds the next epochs' batches use, so a resumed run makes the
batches the run that did not stop made. Used by ``--fetch dgs`` and
``--fetch rapid --dgs-dims``.
"""

from __future__ import annotations

import dataclasses
import math
import threading
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, Generic, TypeVar

import torch

from graphwire.feature.cache import from_thread
from graphwire.feature.dist import DistFeatureStore
from graphwire.feature.explain import Explained, Explainer, ExplainSettings
from graphwire.feature.fetcher import Schedule
from graphwire.graph.seeds import derive_seed
from graphwire.sampler.base import Batch

__all__ = ["EXPLAIN_EVERY", "FEATURE_RATE", "DimStats", "ExplainRounds", "top_dims"]

R = TypeVar("R")
_SEED = 0xD65  # the explainers' mask seeds: derive_seed(_SEED, rank)
EXPLAIN_EVERY = 30  # T_ex, steps between rounds (the thesis's)
FEATURE_RATE = 0.85  # N_f, the share of dimensions pulled (the thesis's)


def top_dims(feature_mask: torch.Tensor, rate: float) -> torch.Tensor | None:
    """int64 [d], sorted: the ``ceil(rate F)`` dimensions of largest mask
    (ties to the lower index); None when that is every dimension."""
    dim = feature_mask.numel()
    keep = max(1, math.ceil(round(rate * dim, 9)))
    if keep >= dim:
        return None
    order = torch.sort(feature_mask, descending=True, stable=True).indices
    return torch.sort(order[:keep]).values


class ExplainRounds(Generic[R]):
    """One rank's explanation rounds (module docstring).

    Args:
        store: the rank's store (its part, halo and rows).
        every: ``T``, steps between rounds.
        settings: the explainer's.
        convert: what a finished round gives the batches (runs on the
            explainer's thread).
    """

    def __init__(
        self,
        store: DistFeatureStore,
        every: int,
        settings: ExplainSettings,
        convert: Callable[[Explained], R],
    ) -> None:
        self.store, self.every, self.settings = store, every, settings
        self.convert = convert
        self.explainer: Explainer | None = None
        self.halo = store.part.halo_nid.to(torch.int64)
        self._model: Any = None
        self._steps = 1
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="explain")
        self._rounds: dict[int, Future[tuple[Explained, R]]] = {}
        self._reported: set[int] = set()
        # The halo rows at hand (``record``) until the first round pulls the
        # rest; None once it has.
        self._have: torch.Tensor | None = None
        self._recording = threading.Lock()
        self.reused = 0  # halo rows the first round took from the batches

    def start(self, schedule: Schedule, saved: dict[str, Any] | None) -> None:
        """Build the explainer, and restore ``saved`` (what :meth:`state`
        returned; None: a fresh run, whose halo rows come from the batches
        and the first round's pull; a resumed run pulls them all now)."""
        self._model = schedule.gnn
        self._steps = schedule.steps
        if saved:  # no batches before the first round: pull every row now
            remote_x = self.store.pull(self.halo, kind="explain")
        else:
            remote_x = torch.zeros(self.halo.numel(), self.store.dim)
            self._have = torch.zeros(self.halo.numel(), dtype=torch.bool)
        self.explainer = Explainer(
            schedule.gnn,
            schedule.layer_kind,
            self.store.x.mean(0),
            remote_x,
            self.settings,
            seed=derive_seed(_SEED, self.store.rank),
        )
        if saved:
            self.explainer.load_state(saved["explainer"])
            for number, fields in saved["rounds"].items():
                explained = Explained(**fields)
                future: Future[tuple[Explained, R]] = Future()
                future.set_result((explained, self.convert(explained)))
                self._rounds[number] = future

    def wants(self, batch: Batch) -> bool:
        """Whether :meth:`record` keeps anything of ``batch``'s rows: not
        once the first round has started, nor past its batches (whose rows
        may miss dimensions), nor with no halo."""
        return (
            self._have is not None
            and self.halo.numel() > 0
            and self.step_of(batch) < 2 * self.every
        )

    def record(self, batch: Batch, nid: torch.Tensor, x: torch.Tensor) -> None:
        """``batch`` read the whole rows ``x`` of remote nodes ``nid``: keep
        those of the halo, for the first round (:meth:`wants`)."""
        if not self.wants(batch):
            return
        pos = torch.searchsorted(self.halo, nid).clamp(max=self.halo.numel() - 1)
        hit = self.halo.index_select(0, pos) == nid
        with self._recording:
            if self._have is None:
                return
            assert self.explainer is not None
            self.explainer.set_remote(pos[hit], x[hit])
            self._have[pos[hit]] = True

    def _pull_rest(self) -> None:
        """The halo rows no batch has read (the first round's start)."""
        with self._recording:
            have, self._have = self._have, None
        if have is None:
            return
        self.reused = int(have.sum())
        missing = (~have).nonzero().view(-1)
        if missing.numel():
            rows = self.store.pull(self.halo.index_select(0, missing), kind="explain")
            assert self.explainer is not None
            self.explainer.set_remote(missing, rows)

    def step_of(self, batch: Batch) -> int:
        return batch.epoch * self._steps + batch.index

    def on_step(self, batch: Batch) -> None:
        """The trainer begins ``batch``: start a round on its boundaries."""
        step = self.step_of(batch)
        number = step // self.every
        if step % self.every or number < 1 or number in self._rounds:
            return
        weights = {k: v.detach().clone() for k, v in self._model.state_dict().items()}
        explainer = self.explainer
        assert explainer is not None

        def run() -> tuple[Explained, R]:
            self._pull_rest()
            explained = explainer.explain(weights)
            return explained, self.convert(explained)

        self._rounds[number] = self._pool.submit(run)

    def applied(self, batch: Batch) -> tuple[int, R] | None:
        """``(round, what it gives)`` for ``batch`` (waited for), or None
        before the first round is due."""
        number = self.step_of(batch) // self.every - 1
        if number < 1:
            return None
        return number, self._result(number)[1]

    def _result(self, number: int) -> tuple[Explained, R]:
        future = self._rounds.get(number)
        if future is None:
            raise RuntimeError(f"dgs: explanation round {number} was never started")
        try:
            return future.result()
        except BaseException as error:
            raise from_thread(f"explanation round {number}", error) from error

    @property
    def started(self) -> int:
        return len(self._rounds)

    def finished(self) -> list[Explained]:
        """The rounds finished since the last call, in order."""
        done = [
            n
            for n, f in sorted(self._rounds.items())
            if n not in self._reported and f.done() and f.exception() is None
        ]
        self._reported.update(done)
        return [self._rounds[n].result()[0] for n in done]

    def state(self, epoch: int) -> dict[str, Any]:
        """The masks, and the rounds the batches after ``epoch`` use (waited
        for)."""
        assert self.explainer is not None
        after = (epoch + 1) * self._steps  # the next epoch's first step
        keep = range(max(1, after // self.every - 1), (after - 1) // self.every + 1)
        rounds = {
            n: dataclasses.asdict(self._result(n)[0]) for n in keep if n in self._rounds
        }
        return {"explainer": self.explainer.state(), "rounds": rounds}

    def close(self, collective: bool) -> None:
        self._pool.shutdown(wait=collective, cancel_futures=True)


class DimStats:
    """Remote rows and the share of dimensions they carried, between two
    epoch records (made on any thread)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._rows = 0
        self._dims = 0.0  # rows times their share

    def add(self, rows: int, share: float) -> None:
        with self._lock:
            self._rows += rows
            self._dims += rows * share

    def record(self, finished: list[Explained]) -> dict[str, Any]:
        """The epoch's ``extra["dgs"]``: rows, their mean share of
        dimensions, and the explainer's finished rounds."""
        with self._lock:
            rows, dims = self._rows, self._dims
            self._rows, self._dims = 0, 0.0
        return {
            "dims_share": dims / rows if rows else 1.0,
            "remote_rows": rows,
            "explain_rounds": len(finished),
            "explain_cpu_s": sum(e.cpu_s for e in finished),
            "explain_loss": finished[-1].loss if finished else None,
            "explain_epochs": sum(e.epochs for e in finished),
        }
