"""SANCUS's broadcast engine: when blocks are broadcast, and what skipping saves.

Parity of ``--staleness none`` with one process is in tests/fullgraph/
test_parity.py (in-process ranks) and tests/multiprocess/test_fullgraph_dist.py
(gloo processes). Here, ranks run as threads over the in-process transport:

- ``epoch:1`` broadcasts every other epoch (6 epochs), and the bytes it saves
  are the skipped blocks' bytes, from the ledger;
- ``adaptive:1`` staggers the owners from their phases;
- ``gap:X`` broadcasts exactly when a block moved more than X from the copy
  its peers hold (the test drives the blocks);
- SkipG (``--grad-staleness``) sends no gradients in the epochs it reuses one;
- a run resumed from a checkpoint equals the uninterrupted run.
"""

from __future__ import annotations

import dataclasses
import functools
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

from graphwire.comm.base import Transport
from graphwire.comm.local import run_local
from graphwire.fullgraph.broadcast import BroadcastConfig
from graphwire.fullgraph.distributed import build_engine, train_distributed
from graphwire.fullgraph.staleness import Staleness, StalenessSpec, default_phases
from graphwire.partition import load_part
from graphwire.run.checkpoint import CheckpointConfig
from graphwire.run.config import TrainConfig
from tests.fullgraph.dist_helpers import small_graph, write_parts

# Three layers: layers 1 and 2 broadcast (layer 0 reads its cached halo).
CONFIG = TrainConfig(model="sage", hidden=8, num_layers=3, epochs=6, seed=7)


@pytest.fixture(scope="module")
def parts(tmp_path_factory: pytest.TempPathFactory) -> dict[int, Path]:
    where = tmp_path_factory.mktemp("broadcast")
    graph = small_graph()
    return {n: write_parts(graph, n, where, "metis") for n in (2, 4)}


def _train(
    transport: Transport,
    folder: str,
    config: BroadcastConfig,
    train: TrainConfig = CONFIG,
    checkpoint: CheckpointConfig | None = None,
) -> dict[str, Any]:
    part = load_part(folder, transport.rank)
    run = train_distributed(part, transport, train, config, checkpoint=checkpoint)
    return {
        "records": run.result.records,
        "sizes": (part.num_owned, part.num_halo),
        "weights": {k: v.clone() for k, v in run.result.state_dict.items()},
    }


def _run(folder: Path, world: int, **config: Any) -> list[dict[str, Any]]:
    step = functools.partial(
        _train, folder=str(folder), config=BroadcastConfig(**config)
    )
    return run_local(step, world)


def _sent(record: Any, kind: str, world: int = 2) -> list[int]:
    """Bytes each rank sent of ``kind`` in the epoch (0 where none)."""
    traffic = record.comm["by_rank"].get(kind)
    return traffic["sent"] if traffic else [0] * world


def _skipped(record: Any) -> set[tuple[int, int]]:
    return {(rank, layer) for rank, layer in record.extra["staleness"]["skipped"]}


def test_epoch_bound_broadcasts_every_other_epoch_and_saves_the_skipped_blocks(
    parts,
) -> None:
    full = _run(parts[2], 2)
    stale = _run(parts[2], 2, staleness="epoch:1")
    every = {(rank, layer) for rank in range(2) for layer in (1, 2)}
    for epoch in range(6):
        record = stale[0]["records"][epoch]
        assert _skipped(record) == (every if epoch % 2 else set()), epoch
        ages = record.extra["staleness"]["age"]
        assert ages == [[epoch % 2] * 2] * 2
    # The bytes saved: each skipped block, once to the other rank. A block of
    # layer l is [rows of its owner, width] float32: SAGE exchanges its 8
    # hidden columns at layer 1, and the output layer's 5 projected ones.
    for epoch in range(6):
        for layer, width in ((1, 8), (2, 5)):
            kind = f"fwd.L{layer}"
            full_sent = _sent(full[0]["records"][epoch], kind)
            stale_sent = _sent(stale[0]["records"][epoch], kind)
            blocks = [rank["sizes"][0] * width * 4 for rank in full]
            saved = [b if epoch % 2 else 0 for b in blocks]
            assert [f - s for f, s in zip(full_sent, stale_sent, strict=True)] == saved
            # Backward gradients are never skipped.
            bwd = f"bwd.L{layer}"
            assert _sent(stale[0]["records"][epoch], bwd) == _sent(
                full[0]["records"][epoch], bwd
            )
    # Each rank caches the halo rows it reads of the other block, per layer:
    # at most (p - 1) / p * N * F * 4 bytes per cached layer.
    cache = stale[0]["records"][1].extra["staleness"]["cache_bytes"]
    assert cache == [rank["sizes"][1] * (8 + 5) * 4 for rank in stale]
    num_nodes = sum(rank["sizes"][0] for rank in stale)
    assert max(cache) <= (num_nodes // 2) * (8 + 5) * 4
    assert full[0]["records"][1].extra["staleness"]["cache_bytes"] == [0, 0]


def test_adaptive_bound_staggers_as_the_papers_example() -> None:
    """SANCUS Fig. 14(b), epsilon_A = 1: worker 2's copy from epoch 7 is too
    old in epoch 9, so it broadcasts in 10; workers 1, 3 and 4 (copies from
    epoch 8) in 11."""
    rule = Staleness(StalenessSpec.parse("adaptive:1"), world_size=4)
    rule.stamps = {0: 8, 1: 7, 2: 8, 3: 8}  # keys: the workers, 0-based
    owners = [(key, key) for key in range(4)]
    rule.end_epoch(9, owners)
    assert [rule.must_send(k, 10, k) for k in range(4)] == [False, True, False, False]
    rule.sent(1, 10)
    rule.end_epoch(10, owners)
    assert [rule.must_send(k, 11, k) for k in range(4)] == [True, False, True, True]


def test_adaptive_phases_stagger_the_owners_broadcasts(parts) -> None:
    """Four owners, adaptive:1: phases 0, 0, 1, 2 of a 3-epoch period, so
    after epoch 0 each epoch has part of the owners broadcasting."""
    assert default_phases(4, 1) == [0, 0, 1, 2]
    ranks = _run(parts[4], 4, staleness="adaptive:1")
    sends = {0: (0, 3), 1: (0, 3), 2: (0, 2, 5), 3: (0, 1, 4)}
    for epoch, record in enumerate(ranks[0]["records"]):
        quiet = {rank for rank, sent in sends.items() if epoch not in sent}
        assert _skipped(record) == {(r, layer) for r in quiet for layer in (1, 2)}
        for rank in range(4):  # never older than the period allows
            assert all(row[rank] <= 2 for row in record.extra["staleness"]["age"])


def _drive_gap(transport: Transport, folder: str) -> list[Any]:
    """Rank 0's block of layer 1 moves by the scales below (relative to its
    epoch-0 rows); rank 1's never moves. Returns, per epoch, which roots
    broadcast and the rows rank 1 read of rank 0's block."""
    part = load_part(folder, transport.rank)
    config = BroadcastConfig(staleness="gap:0.05")
    engine = build_engine(part, transport, CONFIG, config)
    engine.begin(nn.Linear(1, 1), None)  # a module in training mode
    scales = [1.0, 1.03, 1.06, 1.08, 1.12]
    base = torch.arange(part.num_owned * 4, dtype=torch.float32).view(-1, 4) + 1
    seen = []
    for epoch, scale in enumerate(scales):
        engine.begin_epoch(epoch)
        own = base * (scale if transport.rank == 0 else 1.0)
        local = engine.gather(1, own)
        report = engine.end_epoch()["staleness"]
        skipped = {rank for rank, _ in report["skipped"]}
        seen.append(({0, 1} - skipped, local[part.num_owned :].clone()))
    return [seen, transport.ledger.bytes_sent("flags.L1")]


def test_gap_bound_broadcasts_exactly_when_the_block_moved_beyond_it(parts) -> None:
    ranks = run_local(functools.partial(_drive_gap, folder=str(parts[2])), 2)
    seen, flags = ranks[1]
    # Moves from the last copy sent: 0.03, 0.06 (sent), 0.02/1.06, 0.06/1.06.
    assert [active for active, _ in seen] == [{0, 1}, set(), {0}, set(), {0}]
    halo = [rows for _, rows in seen]
    torch.testing.assert_close(halo[1], halo[0])  # the cached copy
    torch.testing.assert_close(halo[2], halo[0] * 1.06)
    torch.testing.assert_close(halo[3], halo[2])
    torch.testing.assert_close(halo[4], halo[0] * 1.12)
    # One byte to the peer per epoch after the first (epoch 0 sends all).
    assert flags == 4 and ranks[0][1] == 4


def test_skipg_sends_no_gradients_while_it_reuses_the_sum(parts) -> None:
    ranks = _run(parts[2], 2, grad_staleness=1)
    for epoch, record in enumerate(ranks[0]["records"]):
        reused = epoch % 2 == 1
        assert record.extra["grad_skipped"] == reused
        for kind in ("bwd.L1", "bwd.L2", "sync.grad"):
            assert (sum(_sent(record, kind)) == 0) == reused, (epoch, kind)
        assert sum(_sent(record, "fwd.L1")) > 0  # embeddings still fresh
    # Every rank steps with the same summed gradient: the replicas agree.
    for name, weight in ranks[0]["weights"].items():
        torch.testing.assert_close(ranks[1]["weights"][name], weight)


@pytest.mark.parametrize("staleness", ["epoch:1", "gap:0.02"])
def test_a_resumed_run_equals_the_uninterrupted_one(parts, tmp_path, staleness):
    """Checkpoint after epoch 2, resume to epoch 5: the caches, stamps and
    flags come back with the model, so losses and weights match."""
    config = BroadcastConfig(staleness=staleness, grad_staleness=1)
    whole = run_local(functools.partial(_train, folder=str(parts[2]), config=config), 2)
    first = CheckpointConfig(folder=str(tmp_path), every=3)
    stopped = dataclasses.replace(CONFIG, epochs=3)
    run_local(
        functools.partial(
            _train, folder=str(parts[2]), config=config, train=stopped, checkpoint=first
        ),
        2,
    )
    again = CheckpointConfig(folder=str(tmp_path), every=3, resume=True)
    resumed = run_local(
        functools.partial(
            _train, folder=str(parts[2]), config=config, checkpoint=again
        ),
        2,
    )
    losses = [r.loss for r in whole[0]["records"]]
    assert [r.loss for r in resumed[0]["records"]] == pytest.approx(losses, rel=1e-6)
    for name, weight in whole[0]["weights"].items():
        torch.testing.assert_close(resumed[0]["weights"][name], weight)


def _clipped_grads(transport: Transport, folder: str) -> list[Any]:
    """Each rank sends back an all-ones gradient, clipped to norm sqrt(2)."""
    part = load_part(folder, transport.rank)
    config = BroadcastConfig(grad_clip=1.0)  # th_i = sqrt(2) * 1 on 2 ranks
    engine = build_engine(part, transport, CONFIG, config)
    grad = torch.ones(part.num_local, 4)
    summed = engine.scatter_grad(1, grad)
    scale = 2**0.5 / float(torch.linalg.vector_norm(grad))
    return [
        summed,
        scale,
        part.num_owned,
        part.local_to_global(torch.arange(part.num_owned, part.num_local)),
    ]


def test_each_rank_clips_the_gradient_it_sends_to_sqrt_p_times_the_threshold(
    parts,
) -> None:
    ranks = run_local(functools.partial(_clipped_grads, folder=str(parts[2])), 2)
    for rank, (summed, scale, n, _) in enumerate(ranks):
        peer_summed, peer_scale, _, peer_halo = ranks[1 - rank]
        del peer_summed
        start = 0 if rank == 0 else ranks[0][2]
        read_by_peer = torch.zeros(n)
        read_by_peer[peer_halo - start] = 1.0
        expected = scale + peer_scale * read_by_peer
        torch.testing.assert_close(summed, expected[:, None].expand(n, 4))
