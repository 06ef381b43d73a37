"""A distributed mini-batch run's records add up to its totals.

Rapid's first hot-cache fill ran before epoch 0's ledger snapshot: the
summary counted its rows and bytes and no record did (Cora, 2 workers, 1
epoch: the records summed to 31 remote rows, the summary said 51); nor did
any record count the set-up collectives, the presampling or the closing of
the services, which ``bytes_sent`` / ``bytes_recv`` do. The set-up, epoch and
teardown windows now tile the run, for a fresh run and a resumed one.
Exact evaluation's set-up goes in the window of the first evaluation.

``remote_rows``, ``remote_bytes`` and ``remote_messages`` count the same
traffic, the input-feature fetches: labels are in ``comm`` only.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import pytest
import torch

from graphwire.comm.base import Transport
from graphwire.comm.local import run_local
from graphwire.feature.dist import DistFeatureStore
from graphwire.feature.rapid import RapidConfig
from graphwire.feature.traffic import TrafficWindows, fetch_traffic, fetched_rows
from graphwire.graph.synthetic import ProductsConfig, products_graph
from graphwire.partition import get_partitioner, load_part, write_partitioned
from graphwire.run.checkpoint import CheckpointConfig
from graphwire.run.config import TrainConfig
from tests.minibatch.probes import train

_FIELDS = ("bytes_sent", "bytes_recv", "remote_rows", "remote_bytes")


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> str:
    graph = products_graph(
        ProductsConfig(nodes=1200, degree=8, features=6, classes=4, seed=1)
    )
    partition = get_partitioner("metis").partition(graph, 2, seed=0)
    return str(write_partitioned(graph, partition, tmp_path_factory.mktemp("p") / "p"))


def _totals(rank: dict[str, Any]) -> dict[str, int]:
    """What the summary adds over ranks: the whole ledger's bytes, the
    store's remote rows, the feature fetches' bytes and messages."""
    ledger = rank["ledger"]
    fetched = fetch_traffic(ledger)
    return {
        "bytes_sent": sum(row[3] for row in ledger["sent"]),
        "bytes_recv": sum(row[3] for row in ledger["recv"]),
        "remote_rows": fetched_rows(rank["counters"]["store"]),
        "remote_bytes": fetched[0],
        "remote_messages": fetched[1],
    }


def _records_sum(rank: dict[str, Any], first: int) -> dict[str, int]:
    """The set-up, the epochs from ``first`` on and the teardown, summed."""
    phases = rank["counters"]["phases"]
    epochs = [r for r in rank["records"] if r["epoch"] >= first]
    windows = [phases["setup"], *epochs, phases["teardown"]]
    out = {
        key: sum(w["comm"][key] for w in windows)
        for key in ("bytes_sent", "bytes_recv")
    }
    for key in ("remote_rows", "remote_bytes", "remote_messages"):
        out[key] = sum(w["extra"][key] for w in windows)
    return out


@pytest.mark.parametrize("fetch", ["rapid", "on-demand"])
def test_set_up_epochs_and_teardown_add_up_to_the_run(
    folder: str, tmp_path: Path, fetch: str
) -> None:
    config = TrainConfig(
        model="sage",
        hidden=8,
        epochs=4,
        batch_size=30,
        fanouts=[3, 4],
        seed=5,
        eval_every=2,
    )
    options = RapidConfig(n_hot=10, prefetch=2) if fetch == "rapid" else fetch
    whole = run_local(lambda t: train(t, folder, config, options), 2)
    for rank in whole:
        assert _records_sum(rank, 0) == _totals(rank)
        assert _totals(rank)["remote_rows"] > 0
        # Exact evaluation's engine sends its halo's input rows at the first
        # evaluation (after epoch 1), not in the set-up of every run.
        assert (
            "setup.input" not in rank["counters"]["phases"]["setup"]["comm"]["by_tag"]
        )
        sent = [
            r["epoch"] for r in rank["records"] if "setup.input" in r["comm"]["by_tag"]
        ]
        assert sent == [1]
    if fetch == "rapid":  # the first fill is the set-up's
        for rank in whole:
            setup = rank["counters"]["phases"]["setup"]
            assert setup["extra"]["remote_rows"] >= rank["counters"]["n_hot"] > 0
            assert setup["comm"]["by_tag"]["kv.cache.req"] > 0
    # Resumed at epoch 2: its ledger and counters count from there, and so
    # do its set-up, the records of epochs 2 and 3, and its teardown.
    ckpt = str(tmp_path / "ckpt")
    half = dataclasses.replace(config, epochs=2)
    saving = CheckpointConfig(folder=ckpt, every=2)
    run_local(lambda t: train(t, folder, half, options, saving), 2)
    resume = dataclasses.replace(saving, resume=True)
    resumed = run_local(lambda t: train(t, folder, config, options, resume), 2)
    for rank in resumed:
        assert rank["restored"] == [0, 1]
        assert _records_sum(rank, 2) == _totals(rank)
        assert [r["epoch"] for r in rank["records"]] == [0, 1, 2, 3]


def test_remote_bytes_count_the_feature_fetches_and_not_the_labels(
    folder: str,
) -> None:
    """Labels pulled from a peer counted in ``remote_bytes`` and
    ``remote_messages`` (every ``kv.*`` tag), though not in ``remote_rows``."""

    def work(transport: Transport) -> list[dict[str, Any]]:
        part = load_part(folder, transport.rank)
        store = DistFeatureStore(part, transport)
        windows = TrafficWindows(transport, store)
        cuts = []
        if transport.rank == 0:
            remote = torch.arange(10) + part.global_range[1]  # rank 1's first 10
            windows.cut()
            store.labels(remote)
            cuts.append(windows.cut())
            store.pull(remote)
            cuts.append(windows.cut())
        transport.barrier()
        store.close()
        return cuts

    labels, features = run_local(work, 2)[0]
    assert labels["comm"]["by_tag"]["kv.labels.req"] > 0
    counted = ("remote_rows", "remote_bytes", "remote_messages")
    assert [labels[key] for key in counted] == [0, 0, 0]
    # 32-byte header per message; the request packs nid int64 [10] and empty
    # dims (preamble 8 * (1 + 6 * 2)), the answer rows float32 [10, 6]
    # (preamble 8 * (1 + 6)).
    request = 32 + 8 * 13 + 10 * 8
    answer = 32 + 8 * 7 + 10 * 6 * 4
    assert features["remote_rows"] == 10
    assert features["remote_bytes"] == request + answer
    assert features["remote_messages"] == 2
