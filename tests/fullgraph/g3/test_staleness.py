"""G3 under ``--staleness``: skipped messages, cached rows, gap's flags, resume.

Three in-process ranks train a 3-layer GCN for four epochs on 16-row bins:
layer 0 reads cached input rows (never exchanged), layer 1's halo rows land
in a halo buffer, layer 2 sums its messages as they come. Dropout is off, so
every message's rows move every epoch (``gap:0`` then sends them all).
Probes record, per rank and training epoch, the logits, layer 1's halo
buffer, the rows layer 2 summed per message, and the rows each rank sent or
skipped per layer.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

import graphwire.fullgraph.distributed as distributed
from graphwire.comm.local import run_local
from graphwire.fullgraph.broadcast import BroadcastConfig
from graphwire.fullgraph.g3.config import G3Config
from graphwire.fullgraph.g3.engine import G3Engine
from graphwire.fullgraph.g3.wire import Wire
from graphwire.fullgraph.progress import epoch_lines
from graphwire.options import OptionError, option_fields
from graphwire.partition import load_part
from graphwire.run.checkpoint import CheckpointConfig
from graphwire.run.config import TrainConfig
from tests.fullgraph.dist_helpers import config_for, small_graph, write_parts

WORLD, EPOCHS = 3, 4
LAYERS = (1, 2)  # the exchanged layers: 1 in bins, 2 summed message by message
CONFIG = dataclasses.replace(
    config_for("gcn"),
    num_layers=3,
    fanouts=None,
    dropout=0.0,
    epochs=EPOCHS,
    eval_every=EPOCHS,
)

Seen = dict[str, Any]  # what the probes saw in one training epoch of one rank


@dataclasses.dataclass
class Run:
    """Per rank: the epoch records, the final weights, the ledger, and what
    the probes saw in each training epoch this process ran."""

    records: list[list[Any]]
    weights: list[dict[str, torch.Tensor]]
    ledgers: list[dict[str, Any]]
    seen: list[list[Seen]]


def _probes(monkeypatch: pytest.MonkeyPatch) -> dict[int, list[Seen]]:
    """Record, per rank, each training epoch's logits, halo rows, summed
    messages and rows sent (``sent``) and skipped (``skipped``) per layer."""
    seen: dict[int, list[Seen]] = {r: [] for r in range(WORLD)}

    def begin_epoch(self: G3Engine, epoch: int) -> None:
        seen[self.transport.rank].append({"summed": {}})
        begin(self, epoch)

    def arrivals(self: Wire, layer: int) -> Iterator[tuple[Any, torch.Tensor]]:
        engine = self._engine
        for key, rows in take(self, layer):
            if engine.phase == "":
                seen[engine.transport.rank][-1]["summed"][key] = rows.clone()
            yield key, rows

    def forward_loss(engine: Any, *args: Any) -> Any:
        logits, loss = forward(engine, *args)
        if engine.phase == "":
            seen[engine.transport.rank][-1]["logits"] = logits.detach().clone()
        return logits, loss

    def end_epoch(self: G3Engine) -> dict[str, Any]:
        rank, stale = self.transport.rank, self.stale
        skipped = set() if stale is None else stale.skipped
        now = seen[rank][-1]
        now["halo"] = self.wire.halo[1].clone()
        now["recv_pos"] = self.messages[1].recv_pos
        now["stale_in"] = {(n, p, b) for n, p, r, b in skipped if r == rank}
        now["sent"], now["skipped"] = {}, {}
        for layer in LAYERS:
            chunks = [
                (p, b, r)
                for p, c in enumerate(self.messages[layer].send_rows)
                for b, (r, _) in c.items()
            ]
            now["sent"][layer] = sum(r.numel() for _, _, r in chunks)
            now["skipped"][layer] = sum(
                r.numel() for p, b, r in chunks if (layer, rank, p, b) in skipped
            )
        now["keys"] = [
            sum(len(self.messages[layer].send_rows[p]) for layer in LAYERS)
            for p in range(WORLD)
        ]
        return end(self)

    begin, end, take = G3Engine.begin_epoch, G3Engine.end_epoch, Wire.arrivals
    forward = distributed.forward_loss
    monkeypatch.setattr(G3Engine, "begin_epoch", begin_epoch)
    monkeypatch.setattr(G3Engine, "end_epoch", end_epoch)
    monkeypatch.setattr(Wire, "arrivals", arrivals)
    monkeypatch.setattr(distributed, "forward_loss", forward_loss)
    return seen


def _train(
    folder: Path,
    staleness: str | None,
    config: TrainConfig = CONFIG,
    checkpoint: CheckpointConfig | None = None,
) -> Run:
    fields = {"bin_rows": 16} | ({} if staleness is None else {"staleness": staleness})
    exchange = G3Config(**fields)

    def rank(transport: Any) -> tuple[Any, ...]:
        part = load_part(folder, transport.rank)
        run = distributed.train_distributed(
            part, transport, config, exchange, checkpoint=checkpoint
        )
        return run.result.records, run.result.state_dict, run.ledger

    with pytest.MonkeyPatch.context() as monkeypatch:
        seen = _probes(monkeypatch)
        ranks = run_local(rank, WORLD)
    records, weights, ledgers = (list(column) for column in zip(*ranks, strict=True))
    return Run(records, weights, ledgers, [seen[r] for r in range(WORLD)])


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_parts(small_graph(200), WORLD, tmp_path_factory.mktemp("g3s"), "metis")


@pytest.fixture(scope="module")
def runs(folder: Path) -> Callable[[str | None], Run]:
    """Four-epoch runs by ``--staleness`` (None: plain G3), each run once."""
    done: dict[str | None, Run] = {}

    def run(staleness: str | None) -> Run:
        if staleness not in done:
            done[staleness] = _train(folder, staleness)
        return done[staleness]

    return run


def _bytes(record: Any, tag: str) -> int:
    return int(record.comm["by_tag"].get(tag, 0))


def _assert_same_training(run: Run, plain: Run) -> None:
    """Bit for bit: losses, logits and final weights."""
    for rank in range(WORLD):
        losses = [r.loss for r in run.records[rank]]
        assert losses == [r.loss for r in plain.records[rank]]
        for now, then in zip(run.seen[rank], plain.seen[rank], strict=True):
            assert torch.equal(now["logits"], then["logits"])
        for name, weight in run.weights[rank].items():
            assert torch.equal(weight, plain.weights[rank][name]), name


def _assert_saves_the_skipped_rows(run: Run, plain: Run) -> int:
    """Per rank, epoch and exchanged layer: the forward bytes saved against
    plain G3 are exactly the skipped messages' rows times the row's bytes;
    gradients cost the same. Returns the rows skipped in all."""
    skipped_rows = 0
    for rank in range(WORLD):
        epochs = zip(
            run.records[rank], plain.records[rank], run.seen[rank], strict=True
        )
        for record, base, seen in epochs:
            for layer in LAYERS:
                tag = f"fwd.L{layer}"
                row_bytes, rest = divmod(_bytes(base, tag), seen["sent"][layer])
                assert rest == 0 and row_bytes > 0
                saved = _bytes(base, tag) - _bytes(record, tag)
                assert saved == seen["skipped"][layer] * row_bytes, (rank, tag)
                assert _bytes(record, f"bwd.L{layer}") == _bytes(base, f"bwd.L{layer}")
                skipped_rows += seen["skipped"][layer]
    return skipped_rows


def _assert_reads_the_cached_copies(run: Run) -> int:
    """Per rank and epoch: each skipped message's rows, where layer 1 reads
    them (the halo buffer) and where layer 2 sums them, are those it last
    received. Returns the skipped messages checked."""
    checked = 0
    for rank in range(WORLD):
        last: dict[tuple[int, int, int], torch.Tensor] = {}
        for seen in run.seen[rank]:
            read = {(1, *k): seen["halo"][pos] for k, pos in seen["recv_pos"].items()}
            read |= {(2, *key): rows for key, rows in seen["summed"].items()}
            for message, rows in read.items():
                if message in seen["stale_in"]:
                    assert torch.equal(rows, last[message]), (rank, message)
                    checked += 1
                last[message] = rows
    return checked


def test_none_is_plain_g3_and_epoch_0_skips_nothing(runs) -> None:
    plain = runs(None)
    none = runs("none")
    _assert_same_training(none, plain)
    assert none.ledgers == plain.ledgers  # not even a set-up message more
    # epoch:0 runs the staleness bookkeeping, sending every message every epoch.
    zero = runs("epoch:0")
    _assert_same_training(zero, plain)
    assert _assert_saves_the_skipped_rows(zero, plain) == 0


@pytest.mark.parametrize("staleness", ["epoch:1", "adaptive:1"])
def test_skipped_messages_save_exactly_their_rows(runs, staleness: str) -> None:
    plain, run = runs(None), runs(staleness)
    assert _assert_saves_the_skipped_rows(run, plain) > 0
    assert _assert_reads_the_cached_copies(run) > 0
    for rank in range(WORLD):
        first, *later = run.records[rank]
        assert first.comm["by_tag"] == plain.records[rank][0].comm["by_tag"]
        assert first.extra["staleness"]["skipped"] == []
        for record in later:  # sync.grad, evaluation: as plain G3's
            base = plain.records[rank][record.epoch].comm["by_tag"]
            same = {t for t in base if not t.startswith("fwd.")}
            assert {t: record.comm["by_tag"].get(t) for t in same} == {
                t: base[t] for t in same
            }
    if staleness == "epoch:1":  # every other epoch sends nothing forward
        for rank in range(WORLD):
            fwd = [[_bytes(r, f"fwd.L{n}") for n in LAYERS] for r in run.records[rank]]
            assert fwd[1] == fwd[3] == [0, 0] and fwd[0] == fwd[2] != [0, 0]
            report = run.records[rank][1].extra["staleness"]
            assert report["age"] == [[1] * WORLD, [1] * WORLD]
            assert all(s == t for _, _, s, t in report["messages"])
            line = epoch_lines(run.records[rank][1])[-1]
            for sender, layer, skipped, total in report["messages"]:
                assert f"({sender},{layer}) {skipped}/{total}" in line
            assert "age L1 1,1,1  L2 1,1,1" in line
            assert "skipped (rank,layer) -" in epoch_lines(first)[-1]


def test_a_skipped_message_is_read_from_the_cached_copy(runs) -> None:
    """Epoch 1 of ``epoch:1`` reads epoch 0's rows from every peer, in the
    halo buffer (layer 1) and in the summed messages (layer 2); plain G3
    reads new rows, so the logits part."""
    plain, run = runs(None), runs("epoch:1")
    for rank in range(WORLD):
        (zero, one, two, _), base = run.seen[rank], plain.seen[rank]
        assert torch.equal(one["halo"], zero["halo"])
        assert one["summed"].keys() == zero["summed"].keys() != set()
        for key, rows in one["summed"].items():
            assert torch.equal(rows, zero["summed"][key]), key
        assert not torch.equal(two["halo"], zero["halo"])  # sent afresh
        # plain G3's rows moved: the comparisons above could fail
        assert not torch.equal(base[1]["halo"], base[0]["halo"])
        assert torch.equal(zero["logits"], base[0]["logits"])
        assert not torch.equal(one["logits"], base[1]["logits"])
    # The evaluation after the last epoch sends everything, as plain G3's.
    for rank in range(WORLD):
        last, base = run.records[rank][-1], plain.records[rank][-1]
        for layer in LAYERS:
            tag = f"eval.fwd.L{layer}"
            assert _bytes(last, tag) == _bytes(base, tag) > 0


def test_gap_decides_one_epoch_ahead_with_one_flag_per_message(runs) -> None:
    plain = runs(None)
    # gap:0: every message moved, so every message is sent every epoch.
    zero = runs("gap:0")
    _assert_same_training(zero, plain)
    assert _assert_saves_the_skipped_rows(zero, plain) == 0
    for rank in range(WORLD):
        keys = zero.seen[rank][0]["keys"]
        flags = {
            dst: num_bytes
            for _, dst, tag, num_bytes, _ in zero.ledgers[rank]["sent"]
            if tag == "flags"
        }
        assert flags == {p: EPOCHS * keys[p] for p in range(WORLD) if p != rank}
        for record in zero.records[rank]:
            assert _bytes(record, "flags") == sum(keys)
    # A bound nothing moves beyond: epoch 1 still sends all (no move was
    # measured yet), then nothing.
    huge = runs("gap:1e9")
    _assert_saves_the_skipped_rows(huge, plain)
    for rank in range(WORLD):
        fwd = [[_bytes(r, f"fwd.L{n}") for n in LAYERS] for r in huge.records[rank]]
        base = [[_bytes(r, f"fwd.L{n}") for n in LAYERS] for r in plain.records[rank]]
        assert fwd[:2] == base[:2] and fwd[2:] == [[0, 0], [0, 0]]
    # In between, some messages stay home.
    some = runs("gap:0.1")
    skipped = _assert_saves_the_skipped_rows(some, plain)
    assert _assert_reads_the_cached_copies(some) > 0
    sent = sum(s["sent"][n] for seen in some.seen for s in seen for n in LAYERS)
    assert 0 < skipped < sent / 2


@pytest.mark.parametrize("staleness", ["adaptive:1", "gap:0.1"])
def test_a_resumed_run_equals_an_uninterrupted_one(
    runs, folder: Path, tmp_path: Path, staleness: str
) -> None:
    """Checkpointed after epoch 1, resumed to epoch 3: which messages epoch 2
    skips (stamps, adaptive's due set, gap's flags and sent copies) and the
    rows it reads for them come from the checkpoint. (Under ``epoch:1`` the
    resumed epoch 2 would send everything anyway: no test.)"""
    whole = runs(staleness)
    saving = CheckpointConfig(str(tmp_path / "ckpt"), every=1)
    _train(folder, staleness, dataclasses.replace(CONFIG, epochs=2), saving)
    resumed = _train(
        folder, staleness, CONFIG, dataclasses.replace(saving, resume=True)
    )
    for rank in range(WORLD):
        assert [len(resumed.seen[rank]), len(resumed.records[rank])] == [2, EPOCHS]
        losses = [r.loss for r in resumed.records[rank]]
        assert losses == [r.loss for r in whole.records[rank]]
        for now, then in zip(resumed.records[rank], whole.records[rank], strict=True):
            for layer in LAYERS:
                for tag in (f"fwd.L{layer}", f"bwd.L{layer}"):
                    assert _bytes(now, tag) == _bytes(then, tag), (now.epoch, tag)
            assert _bytes(now, "flags") == _bytes(then, "flags")
            assert now.extra["staleness"] == then.extra["staleness"]
        for name, weight in resumed.weights[rank].items():
            assert torch.equal(weight, whole.weights[rank][name]), name


def test_staleness_options_are_the_broadcast_engines() -> None:
    """One flag for both engines (the flag table merges same-named fields)."""
    g3 = {f.name: f for f in option_fields(G3Config)}
    for field in option_fields(BroadcastConfig)[:2]:
        assert g3[field.name].metadata == field.metadata
        assert g3[field.name].type == field.type
        assert g3[field.name].default == field.default
    with pytest.raises(OptionError, match="expected none, epoch:K") as caught:
        G3Config(staleness="epoch")
    assert caught.value.field == "staleness"
    with pytest.raises(OptionError, match="expected one of relative, frobenius"):
        G3Config(staleness_norm="l2")
