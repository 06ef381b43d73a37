"""``--schedule serial|fifo|bytegnn``: the same batches, whoever makes them.

- every batch (blocks, input rows, labels) and the final parameters are
  bitwise the serial loop's under the fifo and bytegnn schedules, at 2 and
  4 workers;
- each epoch records the launcher's queue, DAGs in flight and CPU use;
- sampler threads and σ are refused without a schedule that takes them.
"""

from __future__ import annotations

import hashlib
from typing import Any

import pytest
import torch

from graphwire.comm.local import run_local
from graphwire.feature.ondemand import OnDemandConfig
from graphwire.graph.synthetic import ProductsConfig, products_graph
from graphwire.minibatch.bytegnn import ScheduledOnDemand
from graphwire.minibatch.taskgraph import link_dag, supervised_dag
from graphwire.options import OptionError
from graphwire.partition import get_partitioner, write_partitioned
from graphwire.run.config import TrainConfig
from graphwire.sampler.base import Batch
from tests.minibatch.probes import train

CONFIG = TrainConfig(
    model="sage", hidden=8, epochs=2, batch_size=40, fanouts=[4, 5], seed=3
)


@pytest.fixture(scope="module")
def folders(tmp_path_factory: pytest.TempPathFactory) -> dict[int, str]:
    graph = products_graph(
        ProductsConfig(nodes=1500, degree=8, features=6, classes=4, seed=2)
    )
    out = {}
    for parts in (2, 4):
        partition = get_partitioner("metis").partition(graph, parts, seed=0)
        folder = tmp_path_factory.mktemp(f"parts{parts}") / "parts"
        out[parts] = str(write_partitioned(graph, partition, folder))
    return out


def _digest(fetched: Any) -> str:
    sampled, x, y = fetched
    h = hashlib.sha256()
    for block in sampled.blocks:
        for t in (block.src_nid, block.dst_nid, block.indptr, block.indices, block.eid):
            h.update(t.numpy().tobytes())
    h.update(x.numpy().tobytes())
    h.update(y.numpy().tobytes())
    return h.hexdigest()


def _run(folder: str, world: int, fetch: OnDemandConfig, monkeypatch) -> list:
    seen: dict[int, list[tuple[int, int, str]]] = {}
    get = ScheduledOnDemand.get

    def recording(self: ScheduledOnDemand, batch: Batch, stats: dict) -> Any:
        fetched = get(self, batch, stats)
        rank = self.store.rank
        seen.setdefault(rank, []).append((batch.epoch, batch.index, _digest(fetched)))
        return fetched

    with monkeypatch.context() as patch:
        patch.setattr(ScheduledOnDemand, "get", recording)
        results = run_local(lambda t: train(t, folder, CONFIG, fetch), world)
    for rank, result in enumerate(results):
        result["made"] = seen[rank]
    return results


@pytest.mark.parametrize("world", [2, 4])
def test_every_schedule_makes_the_serial_loops_batches(
    folders: dict[int, str], world: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    serial = _run(folders[world], world, OnDemandConfig(), monkeypatch)
    for schedule in ("fifo", "bytegnn"):
        config = OnDemandConfig(schedule=schedule, sampler_threads=3, prefetch=3)
        got = _run(folders[world], world, config, monkeypatch)
        for ours, theirs in zip(got, serial, strict=True):
            assert ours["made"] == theirs["made"], schedule
            for name, tensor in theirs["state"].items():
                assert torch.equal(tensor, ours["state"][name]), (schedule, name)
            records = [r["extra"]["schedule"] for r in ours["records"]]
            assert len(records) == CONFIG.epochs
            assert all(r["inflight_max"] <= 3 for r in records)
            assert ours["counters"]["schedule"]["launched"] == len(ours["made"])
            sampled = ours["counters"]["sampler"]
            assert sampled["batches"] == theirs["counters"]["sampler"]["batches"]
            assert sampled["edges"] == theirs["counters"]["sampler"]["edges"]


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"sampler_threads": 2}, "sampler_threads: only with a fifo or bytegnn"),
        ({"schedule": "fifo", "sigma": 2.0}, "sigma: only with the bytegnn"),
        ({"schedule": "bytegnn", "sigma": 0.0}, "sigma: expected > 0"),
        (
            {"schedule": "bytegnn", "sampler_threads": 0},
            "sampler_threads: expected >= 1",
        ),
        ({"schedule": "lifo"}, "schedule: expected one of"),
    ],
)
def test_bad_schedule_settings_name_the_flag(fields: dict, message: str) -> None:
    with pytest.raises(OptionError, match=message):
        OnDemandConfig(**fields)


def test_the_logical_dags_fetch_after_every_hop_and_end_after_all() -> None:
    ops = {op.name: op for op in supervised_dag(2)}
    assert list(ops) == [
        "seed",
        "seed.fetch",
        "seed.hop1",
        "seed.fetch1",
        "seed.hop0",
        "seed.fetch0",
        "end",
    ]
    assert ops["seed.hop1"].parents == ("seed",)
    assert ops["seed.hop0"].parents == ("seed.hop1",)
    assert ops["seed.fetch1"].parents == ("seed.hop1",)
    assert set(ops["end"].parents) == set(ops) - {"end"}
    link = {op.name: op for op in link_dag(2)}
    assert link["positive"].parents == link["negative"].parents == ("seed",)
    for root in ("seed", "positive", "negative"):  # three branches
        assert link[f"{root}.fetch"].parents == (root,)
        assert link[f"{root}.hop1"].parents == (root,)
        assert link[f"{root}.fetch0"].parents == (f"{root}.hop0",)
    assert set(link["end"].parents) == set(link) - {"end"}
