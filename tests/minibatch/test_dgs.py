"""``--fetch dgs``: DGS's sampling and pulls in the distributed loop.

- with neutral masks (all ones, ε = 0) and N_f = 1 it takes on-demand's
  steps and moves on-demand's feature bytes;
- remote rows carry exactly the top-N_f dimensions by the feature mask, the
  others zero, local rows whole; the ledger counts exactly those bytes;
- the first explanation round pulls only the halo rows no batch before it
  read, and its star graph holds every halo row;
- the same seed gives the same batches and parameters (the explainer runs on
  its own thread, yet a batch's masks are fixed by its step);
- a resumed run restores the masks and the explainer, and ends as the run
  that did not stop.
"""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path
from typing import Any

import pytest
import torch

from graphwire.comm.local import run_local
from graphwire.feature.dgs import DGSConfig, DGSFetcher
from graphwire.feature.dist import DistFeatureStore
from graphwire.feature.explain import Explained, Explainer
from graphwire.feature.rapid import RapidConfig
from graphwire.feature.rounds import ExplainRounds, top_dims
from graphwire.graph.synthetic import ProductsConfig, products_graph
from graphwire.minibatch.fetchers import FETCHERS
from graphwire.minibatch.loop import RankLoop
from graphwire.options import OptionError
from graphwire.partition import PartitionBook, get_partitioner, write_partitioned
from graphwire.run.checkpoint import CheckpointConfig
from graphwire.run.config import TrainConfig
from graphwire.sampler.base import Batch
from tests.minibatch.probes import train

DIM = 6
CONFIG = TrainConfig(
    model="sage", hidden=8, epochs=3, batch_size=30, fanouts=[3, 4], seed=5
)


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> str:
    """Two METIS parts; row ``g`` of the features is ``10 g + column``."""
    graph = products_graph(
        ProductsConfig(nodes=1200, degree=8, features=DIM, classes=4, seed=1)
    )
    partition = get_partitioner("metis").partition(graph, 2, seed=0)
    new = PartitionBook.from_partition(partition).new_of(torch.arange(graph.num_nodes))
    x = new.unsqueeze(1).float() * 10 + torch.arange(DIM, dtype=torch.float32)
    out = tmp_path_factory.mktemp("dgs") / "parts"
    return str(write_partitioned(graph.replace(x=x), partition, out))


def _fixed_masks(
    monkeypatch: pytest.MonkeyPatch, node: float | None, feature: list[float]
) -> None:
    """Every explanation round returns these masks (node: one value for
    every remote node, None: a seeded random mask)."""

    def explain(self: Explainer, weights: dict[str, torch.Tensor]) -> Explained:
        self.rounds += 1
        m = self.num_remote
        gen = torch.Generator().manual_seed(m)
        mask = torch.rand(m, generator=gen) if node is None else torch.full((m,), node)
        return Explained(mask, torch.tensor(feature), loss=0.5, epochs=1, cpu_s=0.0)

    monkeypatch.setattr(Explainer, "explain", explain)


def _run(folder: str, fetch: Any, config: TrainConfig = CONFIG, **kw: Any) -> list:
    return run_local(lambda t: train(t, folder, config, fetch, **kw), 2)


def _tag_bytes(result: dict[str, Any], tag: str, side: str = "recv") -> int:
    return sum(row[3] for row in result["ledger"][side] if row[2] == tag)


def test_neutral_masks_take_on_demands_steps_and_bytes(
    folder: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    _fixed_masks(monkeypatch, 1.0, [1.0] * DIM)
    neutral = DGSConfig(explain_every=2, prefetch=2, epsilon=0.0, feature_rate=1.0)
    dgs = _run(folder, neutral)
    plain = _run(folder, "on-demand")
    for got, want in zip(dgs, plain, strict=True):
        assert got["counters"]["dgs_rounds"] >= 2  # masks were in use
        assert got["batches"] == want["batches"]
        for name, tensor in want["state"].items():
            assert torch.equal(tensor, got["state"][name]), name
        for tag in ("kv.pull", "kv.pull.req"):
            side = "sent" if tag.endswith(".req") else "recv"
            assert _tag_bytes(got, tag, side) == _tag_bytes(want, tag, side), tag
        assert _tag_bytes(got, "dgs.bias.req", "sent") == 0  # nothing published


def test_rf_samples_uniformly_and_pulls_random_dimensions(folder: str) -> None:
    """The paper's +RF: on-demand's batches, each remote row a random N_f
    share of its dimensions from the first step, no explainer."""
    rf = _run(folder, DGSConfig(dgs_parts="rf", feature_rate=0.5, prefetch=2))
    plain = _run(folder, "on-demand")
    for got, want in zip(rf, plain, strict=True):
        assert got["batches"] == want["batches"]
        assert got["counters"]["dgs_rounds"] == 0
        assert _tag_bytes(got, "kv.explain") == 0
        shares = {r["extra"]["dgs"]["dims_share"] for r in got["records"]}
        assert shares == {0.5}
        assert 0 < _tag_bytes(got, "kv.pull") < _tag_bytes(want, "kv.pull")


def test_remote_rows_carry_exactly_the_top_dimensions(
    folder: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    feature = [0.1, 0.9, 0.5, 0.3, 0.8, 0.2]
    _fixed_masks(monkeypatch, None, feature)
    dims = top_dims(torch.tensor(feature), 0.5)
    assert dims is not None and dims.tolist() == [1, 2, 4]
    checked = {"remote": 0, "local": 0}
    answers: list[tuple[int, int, int]] = []  # (asker, rows, width)
    make, serve = DGSFetcher._make, DistFeatureStore._serve_rows

    def checking_make(self: DGSFetcher, batch: Batch) -> Any:
        made = make(self, batch)
        sampled, x = made[0], made[1]
        nid = sampled.input_nid
        truth = nid.unsqueeze(1).float() * 10 + torch.arange(DIM, dtype=torch.float32)
        local = self.store.is_local(nid)
        assert torch.equal(x[local], truth[local])
        assert self.rounds is not None
        step = self.rounds.step_of(batch)
        if step >= 2 * self.config.explain_every:  # masks in use
            remote = ~local
            assert torch.equal(x[remote][:, dims], truth[remote][:, dims])
            others = [d for d in range(DIM) if d not in dims.tolist()]
            assert bool((x[remote][:, others] == 0).all())
            checked["remote"] += int(remote.sum())
        checked["local"] += int(local.sum())
        return made

    def counting_serve(self: DistFeatureStore, src: int, request: list) -> list:
        answer = serve(self, src, request)
        answers.append((src, *answer[0].shape))
        return answer

    monkeypatch.setattr(DGSFetcher, "_make", checking_make)
    monkeypatch.setattr(DistFeatureStore, "_serve_rows", counting_serve)
    config = DGSConfig(explain_every=2, prefetch=2, feature_rate=0.5)
    results = _run(folder, config)
    assert checked["remote"] > 0 and checked["local"] > 0
    assert any(width == dims.numel() for _, _, width in answers)
    for rank, result in enumerate(results):
        # kv.pull and kv.explain answers: a 32-byte header, the 56-byte
        # preamble of one tensor, and 4 bytes per value.
        mine = [(rows, width) for src, rows, width in answers if src == rank]
        want = sum(32 + 56 + 4 * rows * width for rows, width in mine)
        got = _tag_bytes(result, "kv.pull") + _tag_bytes(result, "kv.explain")
        assert got == want, rank


def test_the_first_round_pulls_only_the_halo_rows_no_batch_read(
    folder: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    _fixed_masks(monkeypatch, 1.0, [1.0] * DIM)
    pull_rest = ExplainRounds._pull_rest
    halos: dict[int, int] = {}

    def checking(self: ExplainRounds) -> None:
        pull_rest(self)
        assert self.explainer is not None
        truth = self.halo.unsqueeze(1).float() * 10 + torch.arange(DIM)
        assert torch.equal(self.explainer.x[1:], truth)  # every row, the right one
        halos[self.store.rank] = self.halo.numel()

    monkeypatch.setattr(ExplainRounds, "_pull_rest", checking)
    results = _run(folder, DGSConfig(explain_every=2, prefetch=2))
    for rank, result in enumerate(results):
        reused = result["counters"]["dgs_halo_reused"]
        assert 0 < reused < halos[rank]
        # One owner answers the rest: a 32-byte header, the 56-byte preamble
        # of one tensor, 4 bytes a value.
        want = 32 + 56 + 4 * DIM * (halos[rank] - reused)
        assert _tag_bytes(result, "kv.explain") == want


def test_the_same_seed_gives_the_same_batches_and_a_resume_the_same_run(
    folder: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    config = dataclasses.replace(CONFIG, epochs=4)
    dgs = DGSConfig(explain_every=2, prefetch=2, explain_epochs=5, feature_rate=0.5)
    first, again = _run(folder, dgs, config), _run(folder, dgs, config)
    ckpt = CheckpointConfig(folder=str(tmp_path / "ckpt"), every=2)
    step = RankLoop.step

    def dying(self: RankLoop, batch: Batch, stats: dict[str, float]) -> float:
        if batch.epoch == 3:
            raise ValueError("injected failure in epoch 3")
        return step(self, batch, stats)

    with monkeypatch.context() as patch:
        patch.setattr(RankLoop, "step", dying)
        with pytest.raises(ValueError, match="injected failure"):
            _run(folder, dgs, config, checkpoint=ckpt)
    resumed = _run(
        folder, dgs, config, checkpoint=dataclasses.replace(ckpt, resume=True)
    )
    for rank in range(2):
        assert first[rank]["counters"]["dgs_rounds"] >= 3
        assert first[rank]["batches"] == again[rank]["batches"]
        assert resumed[rank]["restored"] == [0, 1]
        tail = [b for b in first[rank]["batches"] if b[0] >= 2]
        assert resumed[rank]["batches"] == tail
        for name, tensor in first[rank]["state"].items():
            assert torch.equal(tensor, again[rank]["state"][name]), name
            assert torch.equal(tensor, resumed[rank]["state"][name]), name
        shares = [r["extra"]["dgs"]["dims_share"] for r in first[rank]["records"]]
        assert shares[0] == 1.0 and min(shares) < 1.0


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"feature_rate": 0.0}, "feature_rate: expected > 0 and <= 1, got 0.0"),
        ({"feature_rate": 1.5}, "feature_rate: expected > 0 and <= 1, got 1.5"),
        ({"epsilon": 1.0}, "epsilon: expected a value in \\[0, 1\\)"),
        ({"epsilon": -0.1}, "epsilon: expected >= 0"),
        ({"explain_every": 0}, "explain_every: expected >= 1"),
        ({"explain_every": 2, "prefetch": 3}, "prefetch: at most explain_every"),
        ({"dgs_parts": "edges"}, "dgs_parts: expected one of both, node, feature"),
    ],
)
def test_bad_settings_are_refused_naming_the_field(fields: dict, message: str) -> None:
    with pytest.raises(OptionError, match=message):
        DGSConfig(**fields)


@pytest.mark.parametrize("fetch", ["fastgcn", "ladies"])
def test_layer_wise_baselines_train_and_count_their_syncs(
    folder: str, fetch: str
) -> None:
    config = dataclasses.replace(CONFIG, epochs=2)
    results = _run(folder, FETCHERS.resolve(fetch)[1].__class__(layer_nodes=40), config)
    for result in results:
        losses = [r["loss"] for r in result["records"]]
        assert len(losses) == 2 and all(math.isfinite(loss) for loss in losses)
        assert _tag_bytes(result, "layer.edges.req", "sent") > 0
        assert _tag_bytes(result, "kv.pull") > 0
        norms = _tag_bytes(result, "layer.norms.req", "sent")
        synced = _tag_bytes(result, "setup.fastgcn", "sent")
        assert (norms > 0, synced > 0) == (fetch == "ladies", fetch == "fastgcn")


def test_rapid_with_dgs_dims_pulls_its_misses_top_dimensions(
    folder: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Rapid's batches and cache, its misses pulled with the round's top
    dimensions (the cache fills stay whole)."""
    _fixed_masks(monkeypatch, None, [0.1, 0.9, 0.5, 0.3, 0.8, 0.2])
    config = dataclasses.replace(CONFIG, epochs=4)
    base = dict(n_hot=20, prefetch=2)
    dims = _run(
        folder,
        RapidConfig(**base, dgs_dims=True, explain_every=2, feature_rate=0.5),
        config,
    )
    plain = _run(folder, RapidConfig(**base), config)
    for got, want in zip(dims, plain, strict=True):
        assert got["batches"] == want["batches"]
        shares = [r["extra"]["dgs"]["dims_share"] for r in got["records"]]
        assert shares[0] == 1.0 and min(shares) == 0.5  # (1.0: no miss)
        for tag in ("kv.prefetch", "kv.pull"):
            assert _tag_bytes(got, tag) <= _tag_bytes(want, tag)
        assert _tag_bytes(got, "kv.cache") == _tag_bytes(want, "kv.cache")
        assert _tag_bytes(got, "kv.prefetch") + _tag_bytes(got, "kv.pull") < (
            _tag_bytes(want, "kv.prefetch") + _tag_bytes(want, "kv.pull")
        )
