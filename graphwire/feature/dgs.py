"""`DGSFetcher` (``--fetch dgs``): DGS's explanation-guided sampling and pulls.

DGS (seed ``004``, chapter 3; digest §1) cuts the remote traffic of sampled
training with what an online explainer learns about the model:

1. **explanation** (:class:`~graphwire.feature.explain.Explainer`): each
   rank's star graph has its part's mean feature row and its halo's rows
   (pulled once at set-up, ``kv.explain``). Round ``k`` starts when the
   trainer begins global step ``k T`` (``T`` = ``--explain-every``, global
   step ``epoch * steps + index``), on a snapshot of the model then, on a
   thread of its own, and yields a node mask over the halo and a feature
   mask over the dimensions;
2. **sampling** (:mod:`~graphwire.sampler.importance`): batches of steps
   ``[(k+1) T, (k+2) T)`` use round ``k``'s masks: each row's picks split
   between local and remote neighbours as a uniform subset would, ``round(ε
   n)`` of them moved to local ones, remote ones drawn by node mask. The
   masks live at the owners, who sample remote frontiers: a rank publishes
   each round's node mask to every peer once (``dgs.bias``) before its first
   batch that uses it;
3. **dimension pulls**: remote input rows are pulled with only the top
   ``N_f`` share of dimensions by the feature mask (``pull(ids, dims)``),
   the others zero; local rows are whole.

Batches before step ``2 T`` (no round finished) are sampled and pulled as
on-demand fetching does them, and so is a round whose bias is neutral (ε = 0
and one weight for all), which is what a uniform sampler draws. Since a
batch's round is fixed by its step, the batches do not depend on how fast the
explainer runs: the trainer waits for a round only if it is not done ``T``
steps after it started. ``--dgs-parts`` keeps the node part, the feature
part or both (the paper's NS-only, FS-only and DGS).

A loader thread samples and pulls ahead of the trainer as on-demand's does
(at most ``prefetch`` batches alive, which must not exceed ``T``: a batch
ahead may need the round the trainer starts ``T`` steps before it).
"""

from __future__ import annotations

import dataclasses
import math
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, cast

import torch

from graphwire.feature.base import DEFAULT_KINDS
from graphwire.feature.cache import assemble_inputs, from_thread
from graphwire.feature.explain import Explained, Explainer, ExplainSettings
from graphwire.feature.fetcher import Fetched, Made, Schedule
from graphwire.feature.ondemand import DEFAULT_PREFETCH, PREFETCH_HELP, OnDemand
from graphwire.graph.seeds import derive_seed
from graphwire.options import OptionError, check_options, option
from graphwire.sampler.base import Batch
from graphwire.sampler.dist import DistNeighborSampler
from graphwire.sampler.importance import NodeBias

__all__ = ["DGSConfig", "DGSFetcher", "top_dims"]

PARTS = ("both", "node", "feature", "rf")
_SEED = 0xD65  # the explainers' mask seeds: derive_seed(_SEED, rank)


@dataclass(frozen=True, kw_only=True, slots=True)
class DGSConfig:
    """DGS's settings (the thesis's defaults: T_ex 30, ε 0.1, N_f 0.85,
    𝒯_E 50, ℒ 0.01)."""

    prefetch: int = option(DEFAULT_PREFETCH, least=1, help=PREFETCH_HELP)
    explain_every: int = option(
        30, least=1, help="T_ex: batches between explanation rounds"
    )
    feature_rate: float = option(
        0.85,
        least=0.0,
        strict=True,
        most=1.0,
        help="N_f: the share of dimensions pulled for remote rows, in (0, 1]",
    )
    epsilon: float = option(
        0.1,
        least=0.0,
        help="ε: the share of each row's picks moved from remote to local "
        "neighbours, in [0, 1)",
    )
    explain_epochs: int = option(
        50, least=1, help="𝒯_E: the most mask updates per explanation round"
    )
    explain_loss: float = option(
        0.01, least=0.0, help="ℒ: a round stops once its loss is at most this"
    )
    explain_nodes: int = option(
        2048,
        least=1,
        help="the most remote nodes one explainer step reads (a random subset "
        "of the halo, drawn each step)",
    )
    dgs_parts: str = option(
        "both",
        choices=PARTS,
        help="what DGS changes: node sampling, feature pulls, or both; rf: "
        "uniform sampling and random dimensions at N_f (the paper's +RF)",
    )

    def __post_init__(self) -> None:
        check_options(self)
        if self.epsilon >= 1.0:
            raise OptionError(
                "epsilon", f"expected a value in [0, 1), got {self.epsilon}"
            )
        if self.prefetch > self.explain_every:
            raise OptionError(
                "prefetch",
                f"at most explain_every ({self.explain_every}), got {self.prefetch}: "
                "a batch made ahead may need the round started T_ex steps before it",
                other="explain_every",
            )

    @property
    def settings(self) -> ExplainSettings:
        return ExplainSettings(
            epochs=self.explain_epochs,
            loss_threshold=self.explain_loss,
            nodes=self.explain_nodes,
        )


def top_dims(feature_mask: torch.Tensor, rate: float) -> torch.Tensor | None:
    """int64 [d], sorted: the ``ceil(rate F)`` dimensions of largest mask
    (ties to the lower index); None when that is every dimension."""
    dim = feature_mask.numel()
    keep = max(1, math.ceil(round(rate * dim, 9)))
    if keep >= dim:
        return None
    order = torch.sort(feature_mask, descending=True, stable=True).indices
    return torch.sort(order[:keep]).values


@dataclass(frozen=True)
class _Round:
    """What one finished round gives the batches that use it."""

    explained: Explained | None  # None: random dimensions (rf)
    bias: NodeBias | None  # None: sample uniformly
    dims: torch.Tensor | None  # None: every dimension


class DGSFetcher(OnDemand):
    """Sample with DGS's bias and pull remote rows' top dimensions (module
    docstring), ahead of the trainer."""

    config: DGSConfig  # type: ignore[assignment]
    KINDS = (*DEFAULT_KINDS, "explain")  # the store's pull kinds

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        base = self.sampler
        self.transport = self.store.transport
        self.biased = DistNeighborSampler(
            base.csr,
            base.book,
            self.transport,
            base.fanouts,
            service="dgs",
            biased=True,
        )
        self.explainer: Explainer | None = None
        self._model: Any = None
        self._steps = 1
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="explain")
        self._rounds: dict[int, Future[_Round]] = {}
        self._published: set[int] = set()
        self._publishing = threading.Lock()
        self._epoch_stats = _EpochStats()

    # ------------------------------------------------------------ set-up
    def start(self, schedule: Schedule, first: int, saved: Any | None) -> None:
        super().start(schedule, first, saved)
        self._model = schedule.model
        self._steps = schedule.steps
        if self.config.dgs_parts == "rf":
            return  # nothing to explain
        part = self.store.part
        halo = part.halo_nid.to(torch.int64)
        remote_x = self.store.pull(halo, kind="explain")
        self.explainer = Explainer(
            schedule.model,
            schedule.layer_kind,
            self.store.x.mean(0),
            remote_x,
            self.config.settings,
            seed=derive_seed(_SEED, self.store.rank),
        )
        self._halo = halo
        if saved:
            self.explainer.load_state(saved["explainer"])
            for number, explained in saved["rounds"].items():
                self._rounds[number] = _done(self._round(Explained(**explained)))

    # ------------------------------------------------------------ batches
    def get(self, batch: Batch, stats: dict[str, float]) -> Fetched:
        step = self._step(batch)
        every = self.config.explain_every
        number = step // every
        explains = self.config.dgs_parts != "rf"
        if (
            explains
            and step % every == 0
            and number >= 1
            and number not in self._rounds
        ):
            self._launch(number)
        return super().get(batch, stats)

    def _step(self, batch: Batch) -> int:
        return batch.epoch * self._steps + batch.index

    def _launch(self, number: int) -> None:
        """Round ``number`` on a snapshot of the model now (trainer thread)."""
        weights = {k: v.detach().clone() for k, v in self._model.state_dict().items()}
        explainer = self.explainer
        assert explainer is not None
        self._rounds[number] = self._pool.submit(
            lambda: self._round(explainer.explain(weights))
        )

    def _round(self, explained: Explained) -> _Round:
        parts = self.config.dgs_parts
        bias = None
        if parts != "feature":
            weight = explained.node_mask
            neutral = self.config.epsilon == 0 and bool((weight == weight[:1]).all())
            if not neutral:
                span = self.store.part.global_range
                bias = NodeBias(span, self._halo, weight, self.config.epsilon)
        dims = None
        if parts != "node":
            dims = top_dims(explained.feature_mask, self.config.feature_rate)
        return _Round(explained, bias, dims)

    def _ready(self, number: int) -> _Round:
        future = self._rounds.get(number)
        if future is None:
            raise RuntimeError(f"dgs: explanation round {number} was never started")
        try:
            return future.result()
        except BaseException as error:
            raise from_thread(f"explanation round {number}", error) from error

    def _make(self, batch: Batch) -> Made:
        """Sample ``batch`` with its round's masks and read its rows."""
        number = self._step(batch) // self.config.explain_every - 1
        applied = self._ready(number) if number >= 1 else None
        if self.config.dgs_parts == "rf":  # uniform, random dimensions
            mask = torch.rand(self.store.dim, generator=_generator(batch.seed))
            applied = _Round(None, None, top_dims(mask, self.config.feature_rate))
        began = time.perf_counter()
        if applied is not None and applied.bias is not None:
            self._publish(number, applied.bias)
            sampled = self.biased.sample(batch.seeds, batch.seed, bias=number)
        else:
            sampled = self.sampler.sample(batch.seeds, batch.seed)
        sampled_at = time.perf_counter()
        dims = None if applied is None else applied.dims
        local = self.store.is_local(sampled.input_nid)
        x, counts = assemble_inputs(
            self.store, None, sampled.input_nid, local, "pull", dims=dims
        )
        y = self.store.labels(sampled.seeds)
        share = 1.0 if dims is None else dims.numel() / self.store.dim
        self._epoch_stats.rows(counts["missed_rows"], share)
        busy = {
            "sample_busy_s": sampled_at - began,
            "fetch_busy_s": time.perf_counter() - sampled_at,
        }
        return sampled, x, y, {**counts, **busy}

    def _publish(self, number: int, bias: NodeBias) -> None:
        """Round ``number``'s node mask to every owner, once."""
        with self._publishing:
            if number not in self._published:
                self.biased.publish(number, bias)
                self._published.add(number)

    # ------------------------------------------------------------ records
    def epoch_counters(self) -> dict[str, Any]:
        """This epoch's DGS figures (the epoch record's ``extra["dgs"]``):
        the share of dimensions pulled per remote row, and the rounds that
        finished since the last call: their count, CPU seconds and last loss."""
        finished = [
            cast(Explained, f.result().explained)
            for n, f in sorted(self._rounds.items())
            if f.done()
            and n not in self._epoch_stats.reported
            and f.exception() is None
        ]
        self._epoch_stats.reported.update(
            n for n, f in self._rounds.items() if f.done() and f.exception() is None
        )
        rows, share = self._epoch_stats.take()
        return {
            "dgs": {
                "dims_share": share,
                "remote_rows": rows,
                "explain_rounds": len(finished),
                "explain_cpu_s": sum(e.cpu_s for e in finished),
                "explain_loss": finished[-1].loss if finished else None,
                "explain_epochs": sum(e.epochs for e in finished),
            }
        }

    def state(self, epoch: int) -> Any | None:
        """The explainer's masks, and the rounds the next epochs' batches use
        (waited for: a resumed run must sample with the same masks)."""
        if self.explainer is None:
            return None  # rf: the dimensions come from the batches' seeds
        after = (epoch + 1) * self._steps  # the next epoch's first step
        every = self.config.explain_every
        keep = range(max(1, after // every - 1), (after - 1) // every + 1)
        rounds = {
            n: dataclasses.asdict(cast(Explained, self._ready(n).explained))
            for n in keep
            if n in self._rounds
        }
        return {"explainer": self.explainer.state(), "rounds": rounds}

    def counters(self) -> dict[str, Any]:
        out = super().counters()
        out["dgs_sampler"] = dict(self.biased.counters)
        out["dgs_rounds"] = len(self._rounds)
        return out

    def finish(self) -> None:
        """Stop the loader, then both samplers' services (collective)."""
        self._stop_loader()
        if self._sampler_open:
            self.biased.close()
        super().finish()

    def close(self, collective: bool = True) -> None:
        super().close(collective)
        self._pool.shutdown(wait=collective, cancel_futures=True)


class _EpochStats:
    """Remote rows and their dimension shares, between two records."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._rows = 0
        self._dims = 0.0  # rows times their share
        self.reported: set[int] = set()

    def rows(self, count: int, share: float) -> None:
        with self._lock:
            self._rows += count
            self._dims += count * share

    def take(self) -> tuple[int, float]:
        with self._lock:
            rows, dims = self._rows, self._dims
            self._rows, self._dims = 0, 0.0
        return rows, dims / rows if rows else 1.0


def _generator(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(derive_seed(_SEED, seed))


def _done(value: _Round) -> Future[_Round]:
    future: Future[_Round] = Future()
    future.set_result(value)
    return future
