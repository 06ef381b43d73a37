"""One rank's link-prediction loop (``--task link --workers W``).

The node-classification loop (:class:`~graphwire.minibatch.loop.RankLoop`)
with three things changed:

- the seeds: this part's nodes with a neighbour besides themselves, shared
  between trainers as training nodes are
  (:func:`~graphwire.minibatch.schedule.split_train`);
- the batch: seeds, positives and negatives, each branch sampled and
  fetched (:mod:`~graphwire.minibatch.linkbatch`), made by the on-demand
  fetcher under any ``--schedule``; the positives and negatives are drawn
  by the seeds' owners (``pair.pos``, ``pair.neg``);
- the loss and the metrics: binary cross-entropy of the decoder's logits;
  after an evaluated epoch, exact full-graph embeddings
  (:class:`~graphwire.fullgraph.inference.ExactInference`) of the nodes the
  held-out pairs name, gathered from their owners (``eval.link``, one
  message per peer), score the pairs on every rank alike.

Only ``--fetch on-demand`` makes link batches: rapid and DGS presample or
bias node batches.
"""

from __future__ import annotations

import torch

from graphwire.comm.base import Transport
from graphwire.graph.links import HeldOut
from graphwire.minibatch.bytegnn import ScheduledOnDemand
from graphwire.minibatch.fetchers import FETCHERS
from graphwire.minibatch.linktrainer import batch_loss, held_out_metrics, link_model
from graphwire.minibatch.loop import RankLoop
from graphwire.nn.link import LinkModel
from graphwire.nn.models import GNN
from graphwire.partition.local import LocalPart
from graphwire.run.collective import InferenceFactory, seeded, summed_loss
from graphwire.run.config import TrainConfig
from graphwire.sampler.base import SampledBatch
from graphwire.sampler.dist_pairs import DistPairSampler
from graphwire.sampler.links import SamplingFunctions, link_seed_nodes

__all__ = ["LinkLoop"]


class LinkLoop(RankLoop):
    """A rank's link-prediction state (module docstring).

    Args:
        part, transport, config, fetch, inference: as :class:`RankLoop`'s.
        held_out: the ``(val, test)`` pairs, global IDs (every rank the same).
        functions: the sampling operators' functions (None: the uniform
            ones, ``config.negatives`` negatives per seed).
    """

    model: LinkModel

    def __init__(
        self,
        part: LocalPart,
        transport: Transport,
        config: TrainConfig,
        fetch: object = None,
        *,
        inference: InferenceFactory,
        held_out: tuple[HeldOut, HeldOut],
        functions: SamplingFunctions | None = None,
    ) -> None:
        strategy, _ = FETCHERS.resolve(fetch or FETCHERS.default)
        if not issubclass(strategy.cls, ScheduledOnDemand):  # before any service
            raise ValueError(
                f"--task link: only with --fetch on-demand, not {strategy.name} "
                "(it samples each batch as it comes; the others make node batches)"
            )
        self.held_out = held_out
        super().__init__(
            part, transport, config, fetch, inference=inference, functions=functions
        )

    def pair_sampler(self) -> DistPairSampler:
        return DistPairSampler(
            self.sampler.csr, self.part.book, self.transport, self.functions
        )

    @property
    def gnn(self) -> GNN:
        return self.model.encoder

    def check_data(self) -> dict[str, int]:
        if self.part.x is None:
            raise ValueError(
                f"part {self.part.part_id}: link prediction needs features"
            )
        val, test = self.held_out
        sizes = {"val": val.num_pairs, "test": test.num_pairs}
        empty = [name for name, size in sizes.items() if not size]
        if empty:  # nothing to pick the best epoch by, or to report
            raise ValueError(f"--task link: no held-out {' or '.join(empty)} pairs")
        return sizes

    def seeds_trained(self, sampled: SampledBatch, y: torch.Tensor) -> int:
        """The seeds with a positive (a pair labelled 1 each)."""
        del sampled
        return int(y[2].sum())

    def seed_nodes(self) -> torch.Tensor:
        return link_seed_nodes(self.sampler.csr)

    def make_model(self) -> torch.nn.Module:
        assert self.part.x is not None  # (checked)
        num_features = self.part.x.shape[1]
        return seeded(self.config.seed, lambda: link_model(num_features, self.config))

    def loss_of(
        self, sampled: SampledBatch, x: torch.Tensor, y: torch.Tensor, seed: int
    ) -> torch.Tensor:
        return batch_loss(self.model, sampled, x, y, seed)

    def evaluate(self, loss: float) -> dict[str, float]:
        """Both splits' metrics on every rank alike, with the epoch's summed
        training ``loss`` (collective)."""
        h = self.inference(self.gnn)
        val, test = self.held_out
        nid, rows = self._gather(torch.cat([val.nodes(), test.nodes()]).unique(), h)
        metrics = held_out_metrics(
            self.model,
            lambda ids: rows.index_select(0, torch.searchsorted(nid, ids)),
            val,
            test,
        )
        metrics["loss"] = summed_loss(self.transport, loss)
        return metrics

    def _gather(
        self, wanted: torch.Tensor, h: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The embeddings of ``wanted`` (global IDs, ascending) from their
        owners: ``(wanted, rows)``."""
        start, stop = self.part.global_range
        mine = wanted[(wanted >= start) & (wanted < stop)]
        every = self.transport.all_gather_object(
            (mine, h.index_select(0, mine - start)), "eval.link"
        )
        nid = torch.cat([ids for ids, _ in every])
        rows = torch.cat([r for _, r in every])
        order = torch.argsort(nid)
        return nid[order], rows[order]
