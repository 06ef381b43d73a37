"""`DGSFetcher` (``--fetch dgs``): DGS's explanation-guided sampling and pulls.

DGS (seed ``004``, chapter 3; digest §1) cuts the remote traffic of sampled
training with what an online explainer learns about the model:

1. **explanation** (:class:`~graphwire.feature.explain.Explainer`): each
   rank's star graph has its part's mean feature row and its halo's rows
   (those the batches before the first round read, the rest pulled once
   when it starts, ``kv.explain``). Round ``k`` starts when the
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
part or both (the paper's NS-only, FS-only and DGS); ``rf`` samples
uniformly and pulls a random ``N_f`` share of dimensions per batch, seeded by
the batch, with no explainer (the paper's +RF baseline).

A loader thread samples and pulls ahead of the trainer as on-demand's does
(at most ``prefetch`` batches alive, which must not exceed ``T``: a batch
ahead may need the round the trainer starts ``T`` steps before it).
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Any

import torch

from graphwire.feature.base import DEFAULT_KINDS
from graphwire.feature.explain import Explained, ExplainSettings
from graphwire.feature.fetcher import Fetched, Made, Schedule
from graphwire.feature.ondemand import DEFAULT_PREFETCH, PREFETCH_HELP, OnDemand
from graphwire.feature.rounds import (
    EXPLAIN_EVERY,
    FEATURE_RATE,
    DimStats,
    ExplainRounds,
    top_dims,
)
from graphwire.graph.seeds import derive_seed
from graphwire.options import OptionError, check_options, option
from graphwire.sampler.base import Batch, SampledBatch
from graphwire.sampler.dist import DistNeighborSampler
from graphwire.sampler.importance import NodeBias

__all__ = ["DGSConfig", "DGSFetcher"]

PARTS = ("both", "node", "feature", "rf")
_RF_SEED = 0x52F  # rf's dimensions: derive_seed(_RF_SEED, batch seed)


@dataclass(frozen=True, kw_only=True, slots=True)
class DGSConfig:
    """DGS's settings (the thesis's defaults: T_ex 30, ε 0.1, N_f 0.85,
    𝒯_E 50, ℒ 0.01)."""

    prefetch: int = option(
        None,
        least=1,
        help=PREFETCH_HELP + f" (dgs: {DEFAULT_PREFETCH} or T_ex, the less)",
    )
    explain_every: int = option(
        EXPLAIN_EVERY, least=1, help="T_ex: batches between explanation rounds"
    )
    feature_rate: float = option(
        FEATURE_RATE,
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
        if self.prefetch is None:  # (typed int: set here, before the checks)
            object.__setattr__(
                self, "prefetch", min(DEFAULT_PREFETCH, max(1, self.explain_every))
            )
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


@dataclass(frozen=True)
class _Round:
    """What one finished round gives the batches that use it."""

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
        self.biased = DistNeighborSampler(
            base.csr,
            base.book,
            self.store.transport,
            base.fanouts,
            service="dgs",
            biased=True,
        )
        self.rounds: ExplainRounds[_Round] | None = None
        if self.config.dgs_parts != "rf":  # rf: nothing to explain
            self.rounds = ExplainRounds(
                self.store,
                self.config.explain_every,
                self.config.settings,
                self._round,
            )
        self._published: set[int] = set()
        self._publishing = threading.Lock()
        self._dims_stats = DimStats()

    def start(self, schedule: Schedule, first: int, saved: Any | None) -> None:
        super().start(schedule, first, saved)
        if self.rounds is not None:
            self.rounds.start(schedule, saved)

    def get(self, batch: Batch, stats: dict[str, float]) -> Fetched:
        if self.rounds is not None:
            self.rounds.on_step(batch)
        return super().get(batch, stats)

    def _round(self, explained: Explained) -> _Round:
        """What a finished round gives the batches that use it."""
        parts = self.config.dgs_parts
        bias = None
        if parts != "feature":
            weight = explained.node_mask
            neutral = self.config.epsilon == 0 and bool((weight == weight[:1]).all())
            if not neutral:
                span = self.store.part.global_range
                assert self.rounds is not None
                bias = NodeBias(span, self.rounds.halo, weight, self.config.epsilon)
        dims = None
        if parts != "node":
            dims = top_dims(explained.feature_mask, self.config.feature_rate)
        return _Round(bias, dims)

    def _make(self, batch: Batch) -> Made:
        """On-demand's, and the remote rows of the batches before the first
        explanation round kept for its star graph."""
        made = super()._make(batch)
        if self.rounds is not None and self.rounds.wants(batch):
            sampled, x = made[0], made[1]
            remote = ~self.store.is_local(sampled.input_nid)
            self.rounds.record(batch, sampled.input_nid[remote], x[remote])
        return made

    def _sample(self, batch: Batch) -> SampledBatch:
        """``batch``'s blocks, drawn with its round's node mask (none yet,
        or a neutral one: uniformly)."""
        applied = None if self.rounds is None else self.rounds.applied(batch)
        bias = None if applied is None else applied[1].bias
        if applied is None or bias is None:
            return super()._sample(batch)
        number = applied[0]
        self._publish(number, bias)
        return self.biased.sample(batch.seeds, batch.seed, bias=number)

    def _dims(self, batch: Batch, local: torch.Tensor) -> torch.Tensor | None:
        """The top dimensions of ``batch``'s round's feature mask (rf: of a
        random one, seeded by the batch), counted for the epoch's record."""
        if self.rounds is None:
            mask = torch.rand(self.store.dim, generator=_generator(batch.seed))
            dims = top_dims(mask, self.config.feature_rate)
        else:
            applied = self.rounds.applied(batch)
            dims = None if applied is None else applied[1].dims
        share = 1.0 if dims is None else dims.numel() / self.store.dim
        self._dims_stats.add(int(local.numel() - local.sum()), share)
        return dims

    def _publish(self, number: int, bias: NodeBias) -> None:
        """Round ``number``'s node mask to every owner, once."""
        with self._publishing:
            if number not in self._published:
                self.biased.publish(number, bias)
                self._published.add(number)

    def epoch_counters(self) -> dict[str, Any]:
        """This epoch's ``extra["dgs"]`` (:meth:`DimStats.record`)."""
        finished = [] if self.rounds is None else self.rounds.finished()
        return {"dgs": self._dims_stats.record(finished)}

    def state(self, epoch: int) -> Any | None:
        """The explainer's masks and the rounds the next epochs use (rf:
        none, its dimensions come from the batches' seeds)."""
        return None if self.rounds is None else self.rounds.state(epoch)

    def counters(self) -> dict[str, Any]:
        out = super().counters()
        out["dgs_sampler"] = dict(self.biased.counters)
        out["dgs_rounds"] = 0 if self.rounds is None else self.rounds.started
        out["dgs_halo_reused"] = 0 if self.rounds is None else self.rounds.reused
        return out

    def finish(self) -> None:
        """Stop the loader, then both samplers' services (collective)."""
        self._stop_loader()
        if self._sampler_open:
            self.biased.close()
        super().finish()

    def close(self, collective: bool = True) -> None:
        super().close(collective)
        if self.rounds is not None:
            self.rounds.close(collective)


def _generator(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(derive_seed(_RF_SEED, seed))
