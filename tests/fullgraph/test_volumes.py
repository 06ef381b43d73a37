"""Exact communication volumes of the exchange plans and engines, and the
per-epoch traffic figures a run prints."""

from __future__ import annotations

from collections import defaultdict
from dataclasses import replace
from functools import partial

import pytest
import torch

from graphwire.comm.local import run_local
from graphwire.comm.plan import ExchangePlan
from graphwire.fullgraph.distributed import (
    build_engine,
    forward_loss,
    train_distributed,
)
from graphwire.fullgraph.progress import epoch_lines
from graphwire.graph.graph import Graph
from graphwire.partition import get_partitioner, load_part, write_partitioned
from graphwire.partition.stats import PartitionStats
from graphwire.run.collective import seeded_model
from graphwire.run.job import RankReport
from graphwire.run.tables import print_comm, training_bytes_by_peer
from graphwire.run.training import EpochRecord
from graphwire.units import format_bytes
from tests.fullgraph.dist_helpers import (
    DROPOUT_SEED,
    config_for,
    run_dist_steps,
    small_graph,
    write_parts,
)
from tests.multiprocess.fullgraph_probes import engine_args


def _ring(n: int) -> Graph:
    src = torch.arange(n)
    dst = (src + 1) % n
    return Graph.from_edge_index(torch.cat([src, dst]), torch.cat([dst, src]), n)


def test_ring_plan_sends_exactly_the_boundary_rows(tmp_path) -> None:
    graph = _ring(8)  # chunk into 2: part 0 owns 0..3, part 1 owns 4..7
    partition = get_partitioner("chunk").partition(graph, 2)
    folder = write_partitioned(graph, partition, tmp_path / "ring")
    parts = [load_part(folder, p) for p in range(2)]
    plans = ExchangePlan.build_all(parts)
    # Part 0 needs nodes 7 and 4 (neighbours of 0 and 3); part 1 needs 3 and 0.
    assert sorted(plans[0].send_idx[1].tolist()) == [0, 3]  # local 0, 3 = nodes 0, 3
    assert sorted(plans[1].send_idx[0].tolist()) == [0, 3]  # local 0, 3 = nodes 4, 7
    assert plans[0].send_idx[0].numel() == 0
    assert plans[0].recv_rows == [0, 2] and plans[1].recv_rows == [2, 0]
    # The halo rows each part receives are exactly the ones its edges use.
    halo0 = parts[0].local_to_global(plans[0].recv_idx[1] + parts[0].num_owned).tolist()
    assert sorted(halo0) == [4, 7]


def test_plan_built_over_a_transport_equals_offline_plan(tmp_path) -> None:
    graph = small_graph()
    folder = write_parts(graph, 3, tmp_path, "random")
    offline = ExchangePlan.build_all([load_part(folder, p) for p in range(3)])

    def build(transport):
        return ExchangePlan.build(load_part(folder, transport.rank), transport)

    online = run_local(build, 3)
    for a, b in zip(online, offline, strict=True):
        for x, y in zip(a.send_idx + a.recv_idx, b.send_idx + b.recv_idx, strict=True):
            assert torch.equal(x, y)


def _sent(ledgers, tag: str) -> tuple[int, int]:
    """(bytes, messages) sent under ``tag`` over all ranks."""
    rows = [r for ledger in ledgers for r in ledger["sent"] if r[2] == tag]
    return sum(r[3] for r in rows), sum(r[4] for r in rows)


@pytest.mark.parametrize("hidden", [8, 16])
@pytest.mark.parametrize(
    ("exchange", "options"),
    [
        ("halo", {"cache_input": False}),
        ("g3", {"bin_rows": 16, "cache_input": False}),
        ("halo", {}),
        ("g3", {"bin_rows": 16}),
        ("halo", {"loss_rows": None}),
        ("g3", {"bin_rows": 16, "loss_rows": None}),
    ],
    ids=repr,
)
def test_forward_bytes_equal_halo_rows_times_width(tmp_path, exchange, options, hidden):
    graph = small_graph()  # 12 features, 5 classes
    num_parts = 4
    folder = write_parts(graph, num_parts, tmp_path, "metis")
    partition = get_partitioner("metis").partition(graph, num_parts, seed=0)
    stats = PartitionStats.compute(graph, partition)
    config = replace(config_for("sage"), hidden=hidden)
    ranks = run_dist_steps(folder, num_parts, config, exchange, options)
    ledgers = [r["ledger"] for r in ranks]
    halo_rows = sum(stats.num_halo)
    # A SAGE layer that narrows its rows (12 -> 8 features, any width -> 5
    # classes) has their owners project them (lin_neigh) and exchanges the
    # projections; the gradients of projected rows go back (W_neigh's
    # gradient needs them). 12 -> 16 exchanges the input rows, which need
    # no gradient.
    layer0_projects = graph.num_features > hidden
    widths = {"fwd.L0": hidden if layer0_projects else graph.num_features}
    widths["fwd.L1"] = graph.num_classes
    # Rows whose gradients go back (only when layer 0 exchanges projected
    # rows: input rows need none): in the output layer, those a training row
    # reads (any other's gradient is zero, since the loss reads training
    # rows); in layer 0, those read by rows whose gradient can be nonzero;
    # or all of them when the engine is not told which rows the loss reads.
    read = _halo_rows_returned(graph, partition.assignment, 2)
    assert 0 < read[1] < read[0] < halo_rows  # the test shows the difference
    if "loss_rows" in options:
        read = [halo_rows, halo_rows]
    returns = {
        "fwd.L0": read[0] if layer0_projects else 0,
        "fwd.L1": read[1],
    }
    cached = options.get("cache_input", True)
    # Telling the owners which gradients come back: a byte per halo row and
    # layer that returns any, once.
    told = 0 if "loss_rows" in options else halo_rows * (1 if cached else 2)
    assert _sent(ledgers, "setup.plan.loss")[0] == told
    if cached:
        # Input rows (and their int64 IDs) cross once, at set-up, not per epoch.
        assert _sent(ledgers, "setup.input")[0] == halo_rows * (
            graph.num_features * 4 + 8
        )
        assert _sent(ledgers, "fwd.L0") == (0, 0)
        assert _sent(ledgers, "bwd.L0") == (0, 0)
        del widths["fwd.L0"]
    else:
        # Only the halo's int64 original IDs (hashed dropout keys), once.
        assert _sent(ledgers, "setup.input")[0] == halo_rows * 8
    for tag, width in widths.items():
        num_bytes, messages = _sent(ledgers, tag)
        assert num_bytes == halo_rows * width * 4  # each halo row exactly once
        assert _sent(ledgers, "b" + tag[1:])[0] == returns[tag] * width * 4
        pairs = sum(1 for r in ledgers for row in r["sent"] if row[2] == tag)
        if exchange == "halo":
            assert messages == pairs  # one message per peer that needs rows
        else:
            assert messages >= pairs  # one per (bin, peer)
    # Received equals sent, rank by rank and tag by tag.
    sent = {(r[0], r[1], r[2]): r[3] for led in ledgers for r in led["sent"]}
    recv = {(r[0], r[1], r[2]): r[3] for led in ledgers for r in led["recv"]}
    assert sent == recv


def _halo_rows_returned(
    graph: Graph, assignment: torch.Tensor, num_layers: int
) -> list[int]:
    """Per layer (input layer first), the sum over parts of the distinct nodes
    owned elsewhere with an edge into one of the part's nodes whose output
    gradient can be nonzero: in the output layer the training nodes, in each
    layer below those and every node with an edge into them."""
    src, dst = graph.edge_index()
    assert graph.train_idx is not None
    needed = torch.zeros(graph.num_nodes, dtype=torch.bool)
    needed[graph.train_idx] = True
    returned = []
    for _ in range(num_layers):
        cut = (assignment[src] != assignment[dst]) & needed[dst]
        pairs = assignment[dst[cut]] * graph.num_nodes + src[cut]
        returned.insert(0, int(torch.unique(pairs).numel()))
        needed = needed.clone()
        needed[src[needed[dst]]] = True
    return returned


def test_a_restricted_plan_returns_exactly_the_kept_rows(tmp_path) -> None:
    """``ExchangePlan.restrict``: both ends keep the same rows in the same
    order, so returning gradients along it equals returning them along the
    whole plan with the other rows zero."""
    folder = write_parts(small_graph(), 3, tmp_path, "random")

    def restrict(transport):
        plan = ExchangePlan.build(load_part(folder, transport.rank), transport)
        generator = torch.Generator().manual_seed(transport.rank)
        keep = torch.rand(plan.num_halo, generator=generator) < 0.4
        grad = torch.randn(plan.num_halo, 3, generator=generator)
        sub = plan.restrict(keep, transport, "setup.test")
        whole = plan.scatter_grad(grad * keep[:, None], transport, "whole")
        part = sub.scatter_grad(grad, transport, "part")
        return plan, keep, sub, whole, part, transport.ledger.snapshot()

    ranks = run_local(restrict, 3)
    for rank, (plan, keep, sub, whole, part, ledger) in enumerate(ranks):
        torch.testing.assert_close(part, whole, rtol=0, atol=0)  # same sums
        for peer, (other, other_keep, *_) in enumerate(ranks):
            assert torch.equal(
                sub.recv_idx[peer], plan.recv_idx[peer][keep[plan.recv_idx[peer]]]
            )
            kept_by_peer = other_keep[other.recv_idx[rank]]
            assert torch.equal(sub.send_idx[peer], plan.send_idx[peer][kept_by_peer])
        masks = sum(r[3] for r in ledger["sent"] if r[2] == "setup.test")
        assert masks == plan.num_halo  # one byte per halo row
        returned = sum(r[3] for r in ledger["sent"] if r[2] == "part")
        assert returned == int(keep.sum()) * 3 * 4
    with pytest.raises(ValueError, match="keep must be bool"):
        ranks[0][0].restrict(torch.ones(1), None, "x")  # type: ignore[arg-type]


@pytest.mark.parametrize("exchange", ["halo", "g3"])
def test_a_loss_outside_the_loss_rows_is_refused(tmp_path, exchange) -> None:
    """An engine built for the training loss (``loss_rows``: the training
    rows) refuses a backward whose output gradient reaches other rows, rather
    than leave their halo gradients out; with ``loss_rows=None`` it runs."""
    folder = write_parts(small_graph(), 2, tmp_path, "metis")
    config = config_for("gcn")

    def step(transport, options):
        part = load_part(folder, transport.rank)
        engine = build_engine(part, transport, config, *engine_args(exchange, options))
        assert part.x is not None
        model = seeded_model(part.x.shape[1], int(part.meta["num_classes"]), config)
        logits, _ = forward_loss(engine, model, 1, DROPOUT_SEED)
        logits.sum().backward()  # every row, not only the training rows
        return transport.ledger.snapshot()

    with pytest.raises(
        RuntimeError, match=r"nonzero on \d+ owned row\(s\) outside loss_rows"
    ):
        run_local(partial(step, options=None), 2)
    ledgers = run_local(partial(step, options={"loss_rows": None}), 2)
    assert _sent(ledgers, "bwd.L1")[0] == _sent(ledgers, "fwd.L1")[0] > 0


def test_replicate_moves_nothing_per_layer_and_counts_its_recomputation(tmp_path):
    graph = small_graph()
    folder = write_parts(graph, 3, tmp_path, "metis")
    ranks = run_dist_steps(folder, 3, config_for("gcn"), "replicate")
    tags = {row[2] for r in ranks for row in r["ledger"]["sent"]}
    assert not {t for t in tags if t.startswith(("fwd.", "bwd."))}
    assert "setup.replicate" in tags and "sync.grad" in tags
    assert "setup.input" not in tags  # original IDs come with the replicated rows
    stats = PartitionStats.compute(
        graph, get_partitioner("metis").partition(graph, 3, seed=0)
    )
    for rank, halo in zip(ranks, stats.num_halo, strict=True):
        counters = rank["counters"]
        # Layer 0 computes the owned nodes and their 1-hop halo; layer 1 only
        # the owned nodes: the halo rows are the recomputation.
        assert counters["redundant_rows"] == halo
        assert counters["replicated_rows"] > halo  # the 2-hop nodes as well


def _training_kind(tag: str) -> str | None:
    """The kind of traffic ``traffic_by_rank`` counts ``tag`` under (None:
    set-up, evaluation and metrics, outside an epoch's training)."""
    if tag.startswith(("fwd.", "bwd.")):
        return tag
    return "sync.grad" if tag.startswith("sync.grad") else None


@pytest.mark.parametrize("exchange", ["halo", "g3", "replicate"])
def test_epoch_traffic_by_rank_adds_up_to_every_ledger(tmp_path, exchange) -> None:
    """Each epoch's bytes per rank and kind (summed over ranks in one
    all-reduce) are the same on every rank and add up over the epochs to what
    each rank's ledger holds, sent and received."""
    folder = write_parts(small_graph(), 3, tmp_path, "random")  # uneven parts
    config = replace(config_for("gcn"), epochs=2)

    def train(transport):
        part = load_part(folder, transport.rank)
        run = train_distributed(part, transport, config, exchange)
        return run.result.records, transport.ledger.snapshot()

    ranks = run_local(train, 3)
    records = ranks[0][0]
    epochs = [record.comm["by_rank"] for record in records]
    assert all([r.comm["by_rank"] for r in rank[0]] == epochs for rank in ranks)
    for rank, (_, ledger) in enumerate(ranks):
        for way in ("sent", "recv"):
            want: dict[str, int] = defaultdict(int)
            for _, _, tag, num_bytes, _ in ledger[way]:
                kind = _training_kind(tag)
                if kind is not None:
                    want[kind] += num_bytes
            got: dict[str, int] = defaultdict(int)
            for traffic in epochs:
                for kind, counts in traffic.items():
                    got[kind] += counts[way][rank]
            assert {k: v for k, v in got.items() if v} == want, (rank, way)
    # What rank 0 prints: each kind's total.
    line = epoch_lines(records[-1])[1]
    for kind, counts in epochs[-1].items():
        assert f"{kind} {format_bytes(sum(counts['sent']))}" in line
    # The end-of-run table: who sent whom what, adding up to the epochs'.
    matrix = training_bytes_by_peer(
        [_report(rank, ledger) for rank, (_, ledger) in enumerate(ranks)]
    )
    for rank in range(3):
        assert matrix[rank][rank] == 0
        for way, total in (
            ("sent", sum(matrix[rank])),
            ("recv", sum(row[rank] for row in matrix)),
        ):
            got = sum(c[way][rank] for traffic in epochs for c in traffic.values())
            assert total == got, (rank, way)


def _report(rank: int, ledger: dict, per_epoch: dict | None = None) -> RankReport:
    """A rank's report of a 2-epoch run holding ``ledger`` and, for each
    epoch, a record whose window sent ``per_epoch`` (tag -> bytes)."""
    return RankReport(
        rank=rank,
        records=[
            {"epoch": epoch, "comm": {"by_tag": dict(per_epoch or {})}}
            for epoch in range(2)
        ],
        ledger=ledger,
        counters={},
        num_owned=0,
        num_halo=0,
        test_acc=0.0,
        val_acc=0.0,
        best_epoch=0,
        epochs_run=2,
        seconds=0.0,
    )


def test_the_end_of_run_tables_give_bytes_by_tag_and_by_peer(capsys) -> None:
    def sent(src: int, *rows: tuple[int, str, int]) -> dict:
        return {"sent": [(src, dst, tag, n, 1) for dst, tag, n in rows], "recv": []}

    # Per epoch: the epoch records' windows. sync.metrics is sent in both
    # epochs and once at set-up (24 = 8 + 2 x 8): 8 B per epoch, not 12.
    reports = [
        _report(
            0,
            sent(0, (1, "fwd.L1", 3_000_000), (1, "setup.input", 5000)),
            {"fwd.L1": 1_500_000},
        ),
        _report(
            1,
            sent(1, (0, "bwd.L1", 512), (0, "sync.metrics", 24)),
            {"bwd.L1": 256, "sync.metrics": 8},
        ),
    ]
    assert training_bytes_by_peer(reports) == [[0, 3_000_000], [512, 0]]
    totals = print_comm(reports)
    assert totals == {"bytes_sent": 3_005_536, "bytes_recv": 0}
    lines = [
        " ".join(line.strip("│ ").split())
        for line in capsys.readouterr().out.splitlines()
    ]
    assert "bytes by tag (all ranks, 2 epochs)" in lines
    assert "fwd.L1 │ 3,000,000 │ 1.43 MiB │ 1" in lines  # 2 epochs
    assert "setup.input │ 5,000 │ - │ 1" in lines  # once per run
    assert "sync.metrics │ 24 │ 8 B │ 1" in lines
    # Rank, sent, received (training tags only), then to each rank.
    assert "0 │ 2.86 MiB │ 512 B │ - │ 2.86 MiB" in lines
    assert "1 │ 512 B │ 2.86 MiB │ 512 B │ -" in lines
    # Resumed after epoch 0: the ledgers hold epoch 1 alone.
    for report in reports:
        report.first_epoch = 1
    print_comm(reports)
    text = " ".join(capsys.readouterr().out.split())
    assert "bytes by tag (all ranks, epochs 1-1, resumed)" in text
    assert "fwd.L1 │ 3,000,000 │ 1.43 MiB │ 1" in text  # epoch 1's record
    # Resumed after the last epoch: nothing to divide by.
    for report in reports:
        report.first_epoch = 2
    print_comm(reports)
    text = " ".join(capsys.readouterr().out.split())
    assert "bytes by tag (all ranks, no epochs left to run, resumed)" in text
    assert "fwd.L1 │ 3,000,000 │ - │ 1" in text


def test_the_epoch_line_gives_each_kind_and_each_ranks_bytes() -> None:
    traffic = {
        "fwd.L1": {"sent": [1000, 3_000_000], "recv": [3_000_000, 1000]},
        "sync.grad": {"sent": [512, 512], "recv": [512, 512]},
    }
    times = {"forward_s": 0.5, "backward_s": 0.25, "comm_s": 0.125, "sync_s": 0.0625}
    record = EpochRecord(
        epoch=3,
        loss=1.5,
        train_acc=0.5,
        val_acc=0.25,
        test_acc=0.125,
        times=times,
        peak_rss_mb=1.0,
        comm={"by_rank": traffic},
    )
    first, second = epoch_lines(record)
    assert first.startswith("epoch    3  loss 1.5000  train 0.5000  val 0.2500")
    assert "compute 0.625s  comm 0.125s  sync 0.062s" in first
    assert "bytes fwd.L1 2.86 MiB  sync.grad 1 KiB  |" in second
    # Sent / received per rank, all kinds together (1000 + 512 bytes).
    assert second.endswith("0: 1.48 KiB / 2.86 MiB  1: 2.86 MiB / 1.48 KiB")
