"""``--task link``: unsupervised link prediction, one process and distributed.

- on Cora, GraphSAGE embeddings with a dot decoder reach >= 0.85 test AUC
  on held-out edges (one process), and MRR and Hits@K come with it;
- one worker takes exactly one process's steps (bitwise parameters: the
  same schedule, hashed draws and hashed dropout);
- serial, fifo and bytegnn make bitwise the same link batches (seeds,
  positives and negatives, their blocks and rows) and end with the same
  parameters, at 2 and 4 workers;
- a user's seed and hop functions drive the batches of serial and bytegnn
  alike;
- fetchers that make node batches, and missing held-out pairs, are refused.
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

import pytest
import torch

from graphwire.comm.local import run_local
from graphwire.feature.ondemand import OnDemandConfig
from graphwire.fullgraph.inference import ExactInference
from graphwire.graph.links import LinkSplit, split_links
from graphwire.graph.planetoid import load_planetoid
from graphwire.graph.synthetic import ProductsConfig, products_graph
from graphwire.minibatch.bytegnn import ScheduledOnDemand
from graphwire.minibatch.dist import train_minibatch_distributed
from graphwire.minibatch.linktrainer import train_link, train_link_split
from graphwire.partition import (
    PartitionBook,
    get_partitioner,
    load_part,
    write_partitioned,
)
from graphwire.run.config import TrainConfig
from graphwire.sampler.base import Batch
from graphwire.sampler.dist import OwnedCSR
from graphwire.sampler.links import SamplingFunctions, uniform_hop

CONFIG = TrainConfig(
    model="sage", task="link", hidden=8, epochs=2, batch_size=40, fanouts=[3, 4]
)


def test_cora_embeddings_score_held_out_edges_above_085_auc(cora_dir: Path) -> None:
    graph = load_planetoid(cora_dir, "cora")
    config = TrainConfig(
        model="sage", task="link", epochs=8, batch_size=256, fanouts=[10, 10]
    )
    result = train_link(graph, config)
    best = result.records[result.best_epoch].extra["link"]
    assert result.test_acc == best["test_auc"] >= 0.85
    assert 0 < best["test_hits@1"] <= best["test_hits@10"] <= 1
    assert best["test_hits@1"] <= best["test_mrr"] <= 1


@pytest.fixture(scope="module")
def split() -> LinkSplit:
    graph = products_graph(
        ProductsConfig(nodes=600, degree=8, features=6, classes=4, seed=2)
    )
    return split_links(graph, seed=3)


def _folder(split: LinkSplit, world: int, tmp: Path) -> tuple[str, Any]:
    partition = get_partitioner("metis").partition(split.graph, world, seed=0)
    new = PartitionBook.from_partition(partition).new_of(
        torch.arange(split.graph.num_nodes)
    )
    held_out = (split.val.renumbered(new), split.test.renumbered(new))
    return str(write_partitioned(split.graph, partition, tmp / f"p{world}")), held_out


def _train(t: Any, folder: str, held_out: Any, config: TrainConfig, fetch: Any) -> Any:
    part = load_part(folder, t.rank)
    run = train_minibatch_distributed(
        part, t, config, fetch, inference=ExactInference, held_out=held_out
    )
    return run.result


def test_one_worker_takes_one_process_steps(split: LinkSplit, tmp_path: Path) -> None:
    # GAT with dropout on inputs and attention, and the MLP decoder
    config = TrainConfig(
        model="gat", task="link", hidden=4, heads=2, epochs=2, batch_size=64,
        fanouts=[4, 5], decoder="mlp", negatives=3,
    )  # fmt: skip
    folder, held_out = _folder(split, 1, tmp_path)
    one = train_link_split(split, config)
    (dist,) = run_local(lambda t: _train(t, folder, held_out, config, None), 1)
    for name, tensor in one.state_dict.items():
        assert torch.equal(tensor, dist.state_dict[name]), name
    assert dist.test_acc == pytest.approx(one.test_acc, abs=1e-6)


def _digest(fetched: Any) -> str:
    sampled, x, y = fetched
    h = hashlib.sha256()
    for block in sampled.blocks:
        for t in (block.src_nid, block.indptr, block.indices, block.eid):
            h.update(t.numpy().tobytes())
    h.update(x.numpy().tobytes())
    h.update(y.numpy().tobytes())
    return h.hexdigest()


@pytest.mark.parametrize("world", [2, 4])
def test_every_schedule_makes_the_same_link_batches(
    split: LinkSplit, tmp_path: Path, world: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    folder, held_out = _folder(split, world, tmp_path)
    seen: dict[str, list[tuple[int, int, int, str]]] = {}
    get = ScheduledOnDemand.get

    def recording(self: ScheduledOnDemand, batch: Batch, stats: dict) -> Any:
        fetched = get(self, batch, stats)
        seen[self.config.schedule].append(
            (self.store.rank, batch.epoch, batch.index, _digest(fetched))
        )
        return fetched

    monkeypatch.setattr(ScheduledOnDemand, "get", recording)
    states = {}
    for schedule in ("serial", "fifo", "bytegnn"):
        seen[schedule] = []
        fetch = (
            OnDemandConfig()
            if schedule == "serial"
            else OnDemandConfig(schedule=schedule, sampler_threads=3, prefetch=3)
        )
        results = run_local(
            lambda t, f=fetch: _train(t, folder, held_out, CONFIG, f), world
        )
        states[schedule] = results[0].state_dict
        for result in results[1:]:  # every rank ends with the same weights
            for name, tensor in result.state_dict.items():
                assert torch.equal(tensor, states[schedule][name])
    assert len(seen["serial"]) >= world * CONFIG.epochs
    for schedule in ("fifo", "bytegnn"):
        assert sorted(seen[schedule]) == sorted(seen["serial"]), schedule
        for name, tensor in states["serial"].items():
            assert torch.equal(tensor, states[schedule][name]), (schedule, name)


def _every_other_seed(batch: Batch) -> torch.Tensor:
    return batch.seeds[::2]


def _one_neighbour(csr: OwnedCSR, nid: torch.Tensor, fanout: int, seed: int) -> Any:
    del fanout
    return uniform_hop(csr, nid, 1, seed)


def _train_with(t: Any, folder: str, held_out: Any, fetch: Any) -> Any:
    functions = SamplingFunctions(seed=_every_other_seed, hop=_one_neighbour, k=2)
    part = load_part(folder, t.rank)
    run = train_minibatch_distributed(
        part, t, CONFIG, fetch, inference=ExactInference,
        held_out=held_out, functions=functions,
    )  # fmt: skip
    return run.result.state_dict


def test_a_users_functions_make_every_schedules_batches(
    split: LinkSplit, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    folder, held_out = _folder(split, 2, tmp_path)
    seen: dict[str, list] = {"serial": [], "bytegnn": []}
    get = ScheduledOnDemand.get

    def recording(self: ScheduledOnDemand, batch: Batch, stats: dict) -> Any:
        fetched = get(self, batch, stats)
        sampled, _, pairs = fetched
        # the hop function's one in-edge per node; the seed function's half
        # of the batch, each seed with one positive and two negatives
        assert all(int(b.in_degrees().max()) <= 1 for b in sampled.blocks)
        assert pairs.shape[1] <= 3 * ((batch.seeds.numel() + 1) // 2)
        seen[self.config.schedule].append(
            (self.store.rank, batch.epoch, batch.index, _digest(fetched))
        )
        return fetched

    monkeypatch.setattr(ScheduledOnDemand, "get", recording)  # once, here:
    # patching in each rank's thread would leave one rank's patch behind
    states = {}
    for schedule, fetch in (
        ("serial", OnDemandConfig()),
        ("bytegnn", OnDemandConfig(schedule="bytegnn", sampler_threads=3)),
    ):
        states[schedule] = run_local(
            lambda t, f=fetch: _train_with(t, folder, held_out, f), 2
        )[0]
    assert seen["serial"] and sorted(seen["serial"]) == sorted(seen["bytegnn"])
    for name, tensor in states["serial"].items():
        assert torch.equal(tensor, states["bytegnn"][name]), name


def test_node_batch_fetchers_and_missing_pairs_are_refused(
    split: LinkSplit, tmp_path: Path
) -> None:
    folder, held_out = _folder(split, 2, tmp_path)
    with pytest.raises(ValueError, match="--task link: only with --fetch on-demand"):
        run_local(lambda t: _train(t, folder, held_out, CONFIG, "rapid"), 2)
    with pytest.raises(ValueError, match="no held-out pairs"):
        run_local(lambda t: _train(t, folder, None, CONFIG, None), 2)
