"""Distributed mini-batch training: on-demand (DistDGL) and rapid (RapidGNN).

- every feature path (prefetched, trainer-assembled fallback, cache, on-demand
  pull) returns the true rows, on a graph whose row ``g`` is ``10 g + col``;
- ``rapid`` and ``on-demand`` train on bitwise-identical batches and end with
  identical parameters (4 gloo processes, and 3 in-process);
- remote rows fetched do not grow with ``n_hot``; cache + prefetch memory stays
  within ``(2 n_hot + Q max_batch_inputs) F 4`` bytes; ``n_hot`` is cut to
  the remote nodes the run reads;
- an epoch's record times forward, backward (with the optimizer step) and
  the gradient sync apart, as a single process's does;
- Cora on 4 workers is within 1 point of single-process mini-batch training;
- a dead worker ends the run promptly naming it; a resumed run sees the same
  batches and ends with the same parameters; an early stop ends the
  prefetcher however far ahead it ran.
"""

from __future__ import annotations

import dataclasses
import fcntl
import functools
import math
import threading
import time
from pathlib import Path
from typing import Any

import pytest
import torch

from graphwire.comm.launch import WorkerFailed, launch_local
from graphwire.comm.local import run_local
from graphwire.feature import rapid
from graphwire.feature.ondemand import OnDemandConfig
from graphwire.feature.prefetch import Prefetcher
from graphwire.feature.rapid import RapidConfig
from graphwire.fullgraph.inference import ExactInference
from graphwire.graph.graph import Graph
from graphwire.graph.planetoid import load_planetoid
from graphwire.graph.synthetic import ProductsConfig, products_graph
from graphwire.minibatch.dist import train_minibatch_distributed, train_rank
from graphwire.minibatch.fetchers import FETCHERS
from graphwire.minibatch.trainer import train_minibatch
from graphwire.partition import (
    PartitionBook,
    get_partitioner,
    load_part,
    write_partitioned,
)
from graphwire.run.checkpoint import CheckpointConfig
from graphwire.run.config import TrainConfig
from graphwire.run.job import Job, run_rank
from graphwire.testing import run_workers
from tests.fullgraph.dist_helpers import nan_feature_halves
from tests.minibatch.probes import cache_contents, feature_paths, train


def _graph(nodes: int = 1200) -> Graph:
    return products_graph(
        ProductsConfig(nodes=nodes, degree=8, features=6, classes=4, seed=1)
    )


def _config(model: str = "sage", epochs: int = 2) -> TrainConfig:
    return TrainConfig(
        model=model, hidden=8, epochs=epochs, batch_size=30, fanouts=[3, 4], seed=5
    )


@pytest.fixture(scope="module")
def parts(tmp_path_factory: pytest.TempPathFactory) -> dict[int, str]:
    """METIS parts of one graph for 2, 3 and 4 workers; row ``g`` of the
    partitioned features is ``10 g + column`` (``g`` the new global ID)."""
    graph = _graph()
    out = {}
    for world in (2, 3, 4):
        partition = get_partitioner("metis").partition(graph, world, seed=0)
        new = PartitionBook.from_partition(partition).new_of(
            torch.arange(graph.num_nodes)
        )
        x = new.unsqueeze(1).float() * 10 + torch.arange(6, dtype=torch.float32)
        folder = tmp_path_factory.mktemp(f"metis{world}")
        out[world] = str(write_partitioned(graph.replace(x=x), partition, folder / "p"))
    return out


def test_every_feature_path_returns_the_true_rows(parts: dict[int, str]) -> None:
    results = run_local(
        lambda t: feature_paths(t, parts[3], _config(epochs=3), n_hot=40), 3
    )
    for result in results:
        assert result["worst"] == 0.0
        checked = result["checked"]
        assert checked["fallback"] > 0 and checked["on_demand"] > 0
        assert checked["cache"] > 0, "no cache hit was checked"
    assert sum(r["checked"]["prefetched"] for r in results) > 0


def _both(kind: str, world: int, folder: str, config: TrainConfig) -> list[list]:
    out = []
    for fetch in ("on-demand", "rapid"):
        options = RapidConfig(prefetch=2, n_hot=60) if fetch == "rapid" else fetch
        if kind == "local":
            out.append(
                run_local(lambda t, o=options: train(t, folder, config, o), world)
            )
        else:
            out.append(
                run_workers(train, world, folder, config, options, timeout_s=120)
            )
    return out


# 4 gloo processes (3 peers each) run every path 2 would; 2 ranks are
# compared end to end in tests/multiprocess/test_cli_workers.py.
@pytest.mark.parametrize(
    "kind,world,model", [("torch", 4, "sage"), ("local", 3, "gcn")]
)
def test_rapid_and_on_demand_take_identical_steps(
    parts: dict[int, str], kind: str, world: int, model: str
) -> None:
    on_demand, rapid = _both(kind, world, parts[world], _config(model))
    for rank in range(world):
        assert on_demand[rank]["batches"] == rapid[rank]["batches"]
        for name, tensor in on_demand[rank]["state"].items():
            assert torch.equal(tensor, rapid[rank]["state"][name]), (rank, name)
    # Same batches, fewer rows over the network.
    rows = [
        sum(
            r["counters"]["store"][k]["remote_rows"]
            for r in run
            for k in ("pull", "prefetch", "cache")
        )
        for run in (on_demand, rapid)
    ]
    assert rows[1] < rows[0]
    hits = sum(rec["extra"]["cache_hits"] for r in rapid for rec in r["records"])
    assert hits > 0
    # Per-epoch fetch messages: each request and each answer, from the ledger.
    for r in on_demand:
        store = r["counters"]["store"]
        requests = store["pull"]["remote_requests"] + store["labels"]["remote_requests"]
        sent = sum(rec["extra"]["remote_messages"] for rec in r["records"])
        assert sent == 2 * requests > 0


def test_on_demands_loader_moves_the_time_never_the_steps(
    parts: dict[int, str],
) -> None:
    """On-demand samples and fetches batches ahead on a loader thread (Q=3)
    or each when the trainer reaches it (Q=1, no thread): the same batches
    and parameters, bitwise. With the loader the trainer's sampling and
    fetching is what it waited for (or made itself, a fallback), and the
    seconds spent on them wherever they ran are counted beside."""
    config = _config(epochs=3)
    runs = {
        q: run_local(
            lambda t, q=q: train(t, parts[2], config, OnDemandConfig(prefetch=q)), 2
        )
        for q in (1, 3)
    }
    for one, ahead in zip(runs[1], runs[3], strict=True):
        assert one["batches"] == ahead["batches"]
        for name, tensor in one["state"].items():
            assert torch.equal(tensor, ahead["state"][name]), name
        for record in one["records"]:
            times, extra = record["times"], record["extra"]
            assert times["sample_s"] == extra["sample_busy_s"] > 0
            assert times["fetch_s"] == extra["fetch_busy_s"] > 0
            assert times["wait_s"] == 0 and extra["fallbacks"] == 0
        assert ahead["counters"]["prefetch"]["prefetched"] > 0
        records = ahead["records"]
        for exposed, busy in (
            ("sample_s", "sample_busy_s"),
            ("fetch_s", "fetch_busy_s"),
        ):
            made_here = sum(r["times"][exposed] for r in records)
            assert made_here < sum(r["extra"][busy] for r in records)


def test_epoch_times_split_forward_backward_and_sync_as_one_process_does(
    parts: dict[int, str],
) -> None:
    """``backward_s`` was always 0.0: the backward was timed with the
    forward, the optimizer step with the gradient sync. Now the fields mean
    what a single process's do (forward and loss; backward with the step),
    and ``sync_s`` is the all-reduce alone: disjoint parts of ``train_s``."""
    results = run_local(lambda t: train(t, parts[2], _config(), "on-demand"), 2)
    phases = ("sample_s", "fetch_s", "wait_s", "forward_s", "backward_s", "sync_s")
    for r in results:
        for record in r["records"]:
            times = record["times"]
            assert times["forward_s"] > 0 and times["backward_s"] > 0
            assert times["sync_s"] > 0
            assert sum(times[k] for k in phases) <= record["extra"]["train_s"]


def _remote_rows(results: list[dict[str, Any]]) -> int:
    return sum(
        r["counters"]["store"][k]["remote_rows"]
        for r in results
        for k in ("pull", "prefetch", "cache")
    )


def test_remote_rows_do_not_grow_with_n_hot_and_memory_stays_bounded(
    parts: dict[int, str],
) -> None:
    config = _config(epochs=3)
    fetched = []
    for n_hot in (0, 10, 40, 160, 2000):
        options = RapidConfig(n_hot=n_hot, prefetch=2)
        results = run_local(lambda t, o=options: train(t, parts[2], config, o), 2)
        fetched.append(_remote_rows(results))
        for r in results:
            c = r["counters"]
            bound = (2 * n_hot + 2 * c["max_batch_inputs"]) * 6 * 4
            assert c["cache_bytes"] + c["prefetch"]["peak_bytes"] <= bound
            assert c["prefetch"]["peak_alive"] <= 2
    assert all(a >= b for a, b in zip(fetched, fetched[1:], strict=False)), fetched
    assert fetched[-1] < fetched[0]


def test_the_cache_holds_each_epochs_most_read_rows_within_its_budget(
    parts: dict[int, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """RapidGNN's TopHot: within ``--cache-mb`` (here 40 rows a buffer) each
    epoch's buffer holds the remote rows its batches read most often (ties:
    the lower ID), counted here from the presampled batches themselves, and
    its bytes never pass the budget. ``--cache-share`` sizes the cache as a
    share of the rows the schedule's first epoch reads; unset, the budget is
    512 MiB or a tenth of the memory available over the machine's workers."""
    rows, width = 40, 6 * 4
    budget = rows * 2 * width / 2**20
    options = RapidConfig(cache_mb=budget, prefetch=2)
    config = _config(epochs=3)
    results = run_local(lambda t: cache_contents(t, parts[2], config, options), 2)
    for r in results:
        c = r["counters"]
        assert c["n_hot"] == rows and c["cache_bytes"] <= budget * 2**20
        assert sorted(r["seen"]) == [0, 1, 2]
        for epoch, (held, reads) in r["seen"].items():
            ids, counts = torch.unique(reads, return_counts=True)
            assert ids.numel() > rows  # the budget binds
            ranked = sorted(zip((-counts).tolist(), ids.tolist(), strict=True))
            top = sorted(node for _, node in ranked[:rows])
            assert held.tolist() == top, epoch
    share = RapidConfig(cache_share=0.25, prefetch=2)
    for r in run_local(lambda t: train(t, parts[2], config, share), 2):
        c = r["counters"]
        assert c["n_hot"] == math.ceil(0.25 * c["touched_rows"]) > 0
    available = type("Memory", (), {"available": 2**30})()  # 1 GiB free
    monkeypatch.setattr(rapid.psutil, "virtual_memory", lambda: available)
    assert rapid.default_cache_mb(4) == pytest.approx(1024 * 0.1 / 4)
    monkeypatch.setattr(available, "available", 2**35)  # 32 GiB: the cap
    assert rapid.default_cache_mb(4) == rapid.DEFAULT_CACHE_MB


def test_a_presample_dir_in_use_by_another_run_is_refused(
    parts: dict[int, str], tmp_path: Path
) -> None:
    """Two runs given one ``--presample-dir`` (a sweep) replaced each other's
    epochs between one's presampling and its reads. A rank's folder is held
    while its run lasts; a run finding it held stops, naming the folder, and
    runs once it is free (as after the other run ends, alive or killed)."""
    where = tmp_path / "presample"
    (where / "rank1").mkdir(parents=True)
    other = open(where / "rank1" / ".lock", "w")  # another run's rank 1
    fcntl.flock(other, fcntl.LOCK_EX | fcntl.LOCK_NB)
    options = RapidConfig(prefetch=2, presample_dir=str(where))
    config = _config(epochs=2)
    try:
        with pytest.raises(ValueError, match="rank 1's folder is in use by another"):
            run_local(lambda t: train(t, parts[2], config, options), 2)
    finally:
        other.close()
    results = run_local(lambda t: train(t, parts[2], config, options), 2)
    assert all(r["counters"]["n_hot"] > 0 for r in results)


def test_rapid_lets_go_of_its_cache_and_epochs_before_the_last_evaluation(
    parts: dict[int, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The last evaluation adds to what training held: the peak RSS. Before
    it, rapid's cache rows, prefetcher and presampled epochs go (the
    sampler closed), while the evaluations before it find them in place;
    the counters still give the cache's bytes."""
    from graphwire.minibatch.loop import RankLoop

    seen: dict[int, list[tuple[int, bool, bool]]] = {0: [], 1: []}
    original = RankLoop.evaluate

    def evaluate(self: RankLoop, loss: float) -> dict[str, float]:
        store = self.fetcher
        assert isinstance(store, rapid.RapidStore) and store.cache is not None
        rows = sum(b.rows.numel() for b in store.cache._buffers)
        seen[self.rank].append((rows, store._sampler_open, store.presampler.ready(1)))
        return original(self, loss)

    monkeypatch.setattr(RankLoop, "evaluate", evaluate)
    config = dataclasses.replace(_config(epochs=2), eval_every=1)
    results = run_local(lambda t: train(t, parts[2], config, "rapid"), 2)
    for rank, r in enumerate(results):
        # (epoch 1 was presampled to be trained: not ready at the end is
        # dropped; at epoch 0's evaluation it may be on disk or not yet)
        (held, open_, _), (last_held, last_open, last_ready) = seen[rank]
        assert held > 0 and open_
        assert (last_held, last_open, last_ready) == (0, False, False)
        assert r["counters"]["cache_bytes"] == held * 4


@pytest.mark.parametrize(
    "fields", [{"n_hot": 10**5}, {"cache_mb": 1e303}], ids=["n_hot", "cache_mb"]
)
def test_n_hot_is_cut_to_the_remote_nodes_an_epoch_reads(
    parts: dict[int, str], fields: dict[str, Any]
) -> None:
    """A buffer holds one epoch's hot set, so a larger ``n_hot`` (``--n-hot
    20000`` on Cora's 2,708 nodes), or a ``cache_mb`` that fits more, is cut
    to the remote input nodes of the first epoch before the buffers are
    allocated, and the counters say so. A finite ``cache_mb`` of 1e303 MiB
    overflowed to inf rows, and every worker failed with OverflowError."""
    options = RapidConfig(prefetch=2, **fields)
    results = run_local(lambda t: train(t, parts[2], _config(epochs=3), options), 2)
    for r in results:
        c = r["counters"]
        assert 0 < c["n_hot"] == c["touched_rows"] < 1200  # nodes of the graph
        assert c["cache"]["filled_rows"] >= c["n_hot"]
        assert c["cache_bytes"] == 2 * c["n_hot"] * 6 * 4


def test_cora_on_four_workers_is_within_a_point_of_one_process(
    tmp_path: Path, cora_dir: Path
) -> None:
    cora = load_planetoid(cora_dir, "cora")
    # 140 training nodes: one step per epoch either way (4 x 35 or 1 x 140).
    single = train_minibatch(cora, TrainConfig(model="sage", epochs=30, batch_size=140))
    partition = get_partitioner("metis").partition(cora, 4, seed=0)
    folder = write_partitioned(cora, partition, tmp_path / "cora-metis4")
    job = Job(
        folder=str(folder),
        config=TrainConfig(model="sage", epochs=30, batch_size=35),
        train=functools.partial(train_rank, inference=ExactInference),
        strategy=RapidConfig(),
    )
    reports = launch_local(run_rank, 4, job, timeout_s=300.0, run_timeout_s=300.0)[0]
    assert reports is not None
    assert single.test_acc >= 0.77
    assert abs(reports[0].test_acc - single.test_acc) <= 0.01


@pytest.mark.parametrize("how", ["kill", "raise"])
def test_a_dead_worker_ends_the_run_promptly_naming_it(
    parts: dict[int, str], how: str
) -> None:
    began = time.monotonic()
    match = "rank 1" if how == "kill" else "rank 1.*injected failure"
    with pytest.raises(WorkerFailed, match=match):
        run_workers(
            train,
            3,
            parts[3],
            _config(epochs=3),
            RapidConfig(),
            None,
            (1, 1),
            how,
            timeout_s=120,
        )
    assert time.monotonic() - began < 60


def test_resume_sees_the_same_batches_and_ends_with_the_same_parameters(
    parts: dict[int, str], tmp_path: Path
) -> None:
    config = _config(epochs=4)
    options = RapidConfig(n_hot=50, prefetch=2)
    whole = run_workers(train, 2, parts[2], config, options, timeout_s=120)
    ckpt = CheckpointConfig(folder=str(tmp_path / "ckpt"), every=2)
    with pytest.raises(WorkerFailed):
        run_workers(train, 2, parts[2], config, options, ckpt, (0, 3), timeout_s=120)
    resume = CheckpointConfig(folder=str(tmp_path / "ckpt"), every=2, resume=True)
    resumed = run_workers(train, 2, parts[2], config, options, resume, timeout_s=120)
    for rank in range(2):
        assert whole[rank]["restored"] == [] and resumed[rank]["restored"] == [0, 1]
        tail = [b for b in whole[rank]["batches"] if b[0] >= 2]
        assert resumed[rank]["batches"] == tail
        for name, tensor in whole[rank]["state"].items():
            assert torch.equal(tensor, resumed[rank]["state"][name]), name


def test_a_run_that_stopped_early_stays_stopped_when_resumed(
    parts: dict[int, str], tmp_path: Path
) -> None:
    """A resume of a run whose early stop fell on a checkpoint's epoch used
    to train on from there; it trains nothing now (rapid: not even its
    presampling), and a larger patience goes on."""
    config = dataclasses.replace(_config(epochs=30), patience=1)
    options = RapidConfig(n_hot=20, prefetch=2)
    saving = CheckpointConfig(folder=str(tmp_path / "ckpt"), every=1)

    def epochs(checkpoint: CheckpointConfig, patience: int = 1) -> list[list[int]]:
        run = dataclasses.replace(config, patience=patience)
        ranks = run_local(lambda t: train(t, parts[2], run, options, checkpoint), 2)
        return [[r["epoch"] for r in rank["records"]] for rank in ranks]

    ran = epochs(saving)
    assert len(ran[0]) < config.epochs  # it stopped early
    resume = dataclasses.replace(saving, resume=True)
    assert epochs(resume) == ran
    # Patience 2, one above the run's: at least one more epoch, often one.
    assert len(epochs(resume, patience=2)[0]) > len(ran[0])


def test_an_early_stop_ends_a_prefetcher_that_ran_two_epochs_ahead(
    parts: dict[int, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """One step per epoch and Q = 2: the prefetcher runs into epoch e + 2,
    whose lookup waits for a buffer built when epoch e + 1 starts. After an
    early stop at e that wait never ended: closing gave up on the thread after
    30 s and left it blocked (up to 600 s)."""
    config = TrainConfig(
        model="sage",
        hidden=8,
        epochs=30,
        batch_size=10**4,
        fanouts=[3, 3],
        seed=1,
        patience=1,
        lr=0.5,
    )
    options = RapidConfig(prefetch=2)
    before = set(threading.enumerate())
    # Whether each close found its thread ended, or gave up on it after 30 s
    # (finish() closed the prefetcher before the cache it waited on).
    ended: list[bool] = []
    close = Prefetcher.close

    def closing(self: Prefetcher) -> None:
        close(self)
        ended.append(not self._thread.is_alive())

    monkeypatch.setattr(Prefetcher, "close", closing)
    ranks = run_local(lambda t: train(t, parts[2], config, options), 2)
    for rank in ranks:
        assert rank["counters"]["steps_per_epoch"] == 1
        assert len(rank["records"]) <= config.epochs - 3  # stopped early
    assert ended and all(ended)
    # Closing joins the thread; it gave up after 30 s (the lookup waits 600).
    left = [t for t in threading.enumerate() if t not in before]
    assert not [t.name for t in left if t.name == "prefetch"]


def test_a_split_empty_on_every_part_is_refused_before_serving(
    tmp_path: Path,
) -> None:
    """Without training nodes every loss was NaN; the check runs before the
    sampling and feature services start, so no rank is left serving."""
    graph = _graph(300)
    no_train = graph.replace(train_idx=torch.empty(0, dtype=torch.int64))
    partition = get_partitioner("random").partition(no_train, 2, seed=0)
    folder = str(write_partitioned(no_train, partition, tmp_path / "no-train"))
    with pytest.raises(ValueError, match=r"\(all 2 parts\): train_idx holds no"):
        run_local(lambda t: train(t, folder, _config(), "on-demand"), 2)


def test_a_rank_with_fewer_seeds_than_steps_has_a_finite_loss(
    tmp_path: Path,
) -> None:
    """5 training nodes on 2 ranks, batch size 1: 3 steps each, so rank 1's
    share of 2 has an empty batch, whose NaN loss made its epoch's loss NaN
    (and its metrics.jsonl record not JSON)."""
    graph = _graph(300)
    five = graph.replace(train_idx=graph.train_idx[:5])
    partition = get_partitioner("random").partition(five, 2, seed=0)
    folder = str(write_partitioned(five, partition, tmp_path / "five"))
    config = TrainConfig(
        model="sage", hidden=8, epochs=2, batch_size=1, fanouts=[3, 4], seed=5
    )
    runs = run_local(lambda t: train(t, folder, config, "on-demand"), 2)
    assert [len(run["batches"]) for run in runs] == [6, 6]  # 3 steps x 2 epochs
    losses = [rec["loss"] for run in runs for rec in run["records"]]
    assert len(losses) == 4 and all(0 < loss < 10 for loss in losses), losses


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"n_hot": -1}, "n_hot: expected >= 0"),
        ({"cache_mb": 0.0}, "cache_mb: expected > 0, got 0.0"),
        ({"cache_mb": float("inf")}, "cache_mb: expected a finite value > 0"),
        ({"cache_mb": float("nan")}, "cache_mb: expected a finite value > 0"),
        ({"prefetch": 0}, "prefetch: expected >= 1"),
        ({"n_hot": 9, "cache_mb": 1.0}, "cache_mb: only without n_hot"),
    ],
)
def test_fetch_options_refuse_values_the_loop_cannot_use(fields, message) -> None:
    """An infinite ``cache_mb`` was taken, to fail in the workers when the
    cache's rows were counted from it; one given with ``n_hot`` was ignored,
    and the cache took more memory than it said."""
    with pytest.raises(ValueError, match=message):
        RapidConfig(**fields)
    with pytest.raises(ValueError, match="fetch: unknown 'eager'; known: on-demand"):
        FETCHERS.get("eager")


def _nan_loss_message(
    transport: Any, folder: str, eval_every: int, lr: float = 0.01
) -> str:
    config = TrainConfig(
        model="sage",
        epochs=2,
        hidden=4,
        batch_size=1,
        fanouts=[2, 2],
        eval_every=eval_every,
        lr=lr,
    )
    part = load_part(folder, transport.rank)
    try:
        train_minibatch_distributed(
            part, transport, config, "on-demand", inference=ExactInference
        )
    except ValueError as error:
        return str(error)
    return "no error"


@pytest.mark.parametrize("eval_every", [1, 2], ids=["evaluated", "not-evaluated"])
def test_a_non_finite_loss_on_one_part_stops_every_rank(
    tmp_path: Path, eval_every: int
) -> None:
    """Only part 1's training node reads the NaN feature, so only rank 1's own
    loss is NaN: every rank stops at epoch 0 alike (the summed loss decides),
    in an epoch with an evaluation and in one without (which found it only
    at the next evaluation)."""
    folder = nan_feature_halves(tmp_path)
    messages = run_local(lambda t: _nan_loss_message(t, str(folder), eval_every), 2)
    assert messages[0] == messages[1]
    assert messages[0].startswith("epoch 0: the training loss is nan (not finite)")


def test_a_non_finite_validation_loss_stops_every_rank(tmp_path: Path) -> None:
    """Epoch 0's steps overflow the weights (lr 1e30) after finite training
    losses; only rank 0 holds the validation node, so only its own
    validation loss is NaN: every rank stops at epoch 0 alike."""
    folder = nan_feature_halves(tmp_path, nan=False)
    messages = run_local(lambda t: _nan_loss_message(t, str(folder), 1, 1e30), 2)
    assert messages[0] == messages[1]
    assert messages[0].startswith("epoch 0: the validation loss is nan (not finite)")
