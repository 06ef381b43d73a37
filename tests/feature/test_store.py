"""The feature store: true rows by every path, exact bytes, threads, embeddings.

The graph's feature row of ORIGINAL node ``i`` is ``i * 10 + column``, so one
``torch.equal`` checks any local or remote row. Each case partitions it, runs
:func:`tests.feature.probes.feature_suite` on every rank (threads
of this process, or gloo processes) and compares with the whole graph.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import torch

from graphwire.comm.local import run_local
from graphwire.comm.service import HEADER_BYTES
from graphwire.comm.wire import pack
from graphwire.feature.base import TensorStore
from graphwire.feature.dist import DistFeatureStore, EmbeddingSpec, initial_embedding
from graphwire.graph.graph import Graph
from graphwire.graph.synthetic import ProductsConfig, products_graph
from graphwire.partition import (
    PartitionBook,
    get_partitioner,
    load_part,
    write_partitioned,
)
from graphwire.testing import run_workers
from tests.feature.probes import feature_suite

NUM_NODES, NUM_FEATURES = 420, 6
EMBEDDINGS = {
    "sgd": {"dim": 5, "optimizer": "sgd", "lr": 0.1, "init_std": 0.1, "seed": 1},
    "ada": {"dim": 3, "optimizer": "adagrad", "lr": 0.05, "init_std": 0.2},
}
CASES = [
    ("local", "metis", 2),
    ("local", "random", 3),
    ("local", "metis", 4),
    ("torch", "metis", 2),
    ("torch", "random", 3),
]


@dataclass
class Case:
    graph: Graph
    book: PartitionBook
    folder: Path
    results: list[dict[str, Any]]


@pytest.fixture(scope="module")
def graph() -> Graph:
    base = products_graph(
        ProductsConfig(
            nodes=NUM_NODES, degree=6, features=NUM_FEATURES, classes=5, seed=3
        )
    )
    ids = torch.arange(NUM_NODES, dtype=torch.float32)
    x = ids[:, None] * 10 + torch.arange(NUM_FEATURES, dtype=torch.float32)
    return base.replace(x=x)


@pytest.fixture(scope="module", params=CASES, ids=[f"{k}-{m}{p}" for k, m, p in CASES])
def case(
    request: pytest.FixtureRequest,
    graph: Graph,
    tmp_path_factory: pytest.TempPathFactory,
) -> Case:
    runner, method, num_parts = request.param
    partition = get_partitioner(method).partition(graph, num_parts, seed=0)
    book = PartitionBook.from_partition(partition)
    folder = write_partitioned(
        graph, partition, tmp_path_factory.mktemp("feature") / f"{method}{num_parts}"
    )
    assert graph.x is not None
    x_new = graph.x[book.orig_from_new].contiguous()
    args = (str(folder), x_new, EMBEDDINGS)
    if runner == "local":
        results = run_local(lambda t: feature_suite(t, *args), num_parts, timeout=60)
    else:
        results = run_workers(feature_suite, num_parts, *args, timeout_s=120)
    return Case(graph, book, folder, results)


def _true_rows(case: Case, nid: torch.Tensor) -> torch.Tensor:
    assert case.graph.x is not None
    return case.graph.x[case.book.orig_of(nid)]


# --------------------------------------------------------------- true rows
def test_every_path_returns_the_true_rows(case: Case) -> None:
    assert case.graph.y is not None
    for rank, result in enumerate(case.results):
        nid = result["nid"]
        assert nid.numel() > NUM_NODES  # all IDs and repeats
        assert torch.equal(result["rows"], _true_rows(case, nid)), f"rank {rank}"
        assert torch.equal(result["sub"], _true_rows(case, nid)[:, result["cols"]])
        assert torch.equal(result["labels"], case.graph.y[case.book.orig_of(nid)])
        assert result["empty_shape"] == (0, NUM_FEATURES)
        owner = case.book.owner(torch.arange(NUM_NODES))
        assert torch.equal(result["is_local"], owner == rank)
        for measured in result["measured"]:
            want = _true_rows(case, measured["nid"])
            if measured["dims"] is not None:
                want = want[:, measured["dims"]]
            assert torch.equal(measured["rows"], want), measured["kind"]


# ----------------------------------------------------------- exact volumes
def _expected_traffic(
    book: PartitionBook, rank: int, measured: dict[str, Any]
) -> tuple[dict[tuple[str, int], tuple[int, int]], list[int]]:
    """Client-side ledger rows of one pull, and unique remote rows per peer."""
    kind, nid, dims = measured["kind"], measured["nid"], measured["dims"]
    wire_dims = torch.empty(0, dtype=torch.int64) if dims is None else dims
    width = NUM_FEATURES if dims is None else dims.numel()
    unique = torch.unique(nid)
    owner = book.owner(unique)
    traffic: dict[tuple[str, int], tuple[int, int]] = {}
    per_peer = [0] * book.num_parts
    for peer in range(book.num_parts):
        asked = unique[owner == peer]
        if peer == rank or asked.numel() == 0:
            continue
        per_peer[peer] = asked.numel()
        request = HEADER_BYTES + pack([asked, wire_dims]).numel()
        answer = pack([torch.zeros(asked.numel(), width)]).numel()
        traffic[(f"kv.{kind}.req", peer)] = (request, 1)
        traffic[(f"kv.{kind}", peer)] = (HEADER_BYTES + answer, 1)
    return traffic, per_peer


def test_ledger_and_counters_are_exact_per_pull(case: Case) -> None:
    for rank, result in enumerate(case.results):
        for measured in result["measured"]:
            kind = measured["kind"]
            traffic, per_peer = _expected_traffic(case.book, rank, measured)
            # Exactly one request per owner asked, none to the others, and no
            # traffic under any other tag (the kinds are told apart).
            assert measured["traffic"] == traffic, f"rank {rank} {kind}"
            stats = measured["stats"][kind]
            local = int(case.book.owner(measured["nid"]).eq(rank).sum())
            assert stats == {
                "calls": 1,
                "local_rows": local,
                "remote_rows": sum(per_peer),
                "remote_requests": sum(1 for n in per_peer if n),
                "remote_rows_per_peer": per_peer,
            }
            others = [k for k in measured["stats"] if k != kind]
            assert all(measured["stats"][k]["calls"] == 0 for k in others)


def test_measured_pulls_cover_the_cases(case: Case) -> None:
    """The ledger test must see a peer with no rows and a pull with none."""
    pull, prefetch, cache = case.results[0]["measured"]
    assert prefetch["kind"] == "prefetch" and prefetch["traffic"]
    assert all(tag.startswith("kv.prefetch") for tag, _ in prefetch["traffic"])
    assert cache["traffic"] == {} and cache["stats"]["cache"]["local_rows"] == 10
    asked = {peer for _, peer in pull["traffic"]}
    assert asked == {1}
    assert pull["stats"]["pull"]["remote_rows"] == 7  # 14 asked, 7 unique


# ---------------------------------------------------- threads, bad input
def test_two_threads_pulling_get_their_rows(case: Case) -> None:
    for rank, result in enumerate(case.results):
        assert result["thread_wrong"] == [], f"rank {rank}"


def test_bad_input_is_refused(case: Case) -> None:
    for rank, result in enumerate(case.results):
        assert f"IDs must lie in [0, {NUM_NODES})" in result["bad_nid"]
        peer = (rank + 1) % len(case.results)
        start = int(case.book.offsets[peer])
        assert "its handler raised: ValueError" in result["wrong_owner"]
        assert f"rank {peer} owns global IDs [{start}," in result["wrong_owner"]


# ---------------------------------------------------------------- embeddings
def _reference_table(case: Case, name: str) -> tuple[torch.Tensor, torch.Tensor]:
    """Initial and final table (new-ID order) applying every push in turn."""
    spec = EmbeddingSpec(**EMBEDDINGS[name])
    assert case.book.orig_from_new is not None
    initial = initial_embedding(spec, case.book.orig_from_new)
    weight, state = initial.clone().double(), torch.zeros(NUM_NODES, spec.dim).double()
    pushes = sorted(
        (p for r in case.results for p in r["pushes"] if p[2] == name),
        key=lambda p: (p[0], p[1]),
    )
    assert len(pushes) == 2 * len(case.results)
    for _, _, _, nid, grad in pushes:
        summed = torch.zeros(NUM_NODES, spec.dim).double()
        summed.index_add_(0, nid, grad.double())
        touched = torch.unique(nid)
        g = summed[touched]
        if spec.optimizer == "sgd":
            weight[touched] -= spec.lr * g
        else:
            state[touched] += g * g
            weight[touched] -= spec.lr * g / (state[touched].sqrt() + 1e-10)
    return initial, weight.float()


@pytest.mark.parametrize("name", sorted(EMBEDDINGS))
def test_embeddings_match_a_single_process_reference(case: Case, name: str) -> None:
    initial, final = _reference_table(case, name)
    assert not torch.allclose(initial, final)  # the pushes did something
    for rank, result in enumerate(case.results):
        # Initial rows depend on the original node only, not on the parts.
        assert torch.equal(result["emb_initial"][name], initial), f"rank {rank}"
        # float32 updates vs a float64 reference: a few ulps of values ~0.1-1.
        torch.testing.assert_close(result["emb_final"][name], final, atol=1e-6, rtol=0)
        assert result["stats"]["emb.push"]["calls"] == 2 * len(EMBEDDINGS)


def test_initial_embedding_is_normal_and_seeded() -> None:
    spec = EmbeddingSpec(dim=8, init_std=0.5, seed=3)
    table = initial_embedding(spec, torch.arange(5000))
    assert abs(float(table.mean())) < 0.02 and abs(float(table.std()) - 0.5) < 0.02
    picked = initial_embedding(spec, torch.tensor([4321, 7]))
    assert torch.equal(picked, table[[4321, 7]])
    other = initial_embedding(EmbeddingSpec(dim=8, init_std=0.5, seed=4), picked[:0])
    assert other.shape == (0, 8)
    assert not torch.equal(
        initial_embedding(EmbeddingSpec(dim=8, init_std=0.5, seed=4), torch.arange(2)),
        table[:2],
    )
    assert not initial_embedding(
        EmbeddingSpec(dim=2, init_std=0), torch.arange(3)
    ).any()


@pytest.mark.parametrize(
    ("field", "value", "match"),
    [
        ("dim", 0, "dim"),
        ("optimizer", "adam", "optimizer"),
        ("lr", 0.0, "lr"),
        ("init_std", -1.0, "init_std"),
    ],
)
def test_embedding_spec_rejects(field: str, value: Any, match: str) -> None:
    kwargs: dict[str, Any] = {"dim": 4, field: value}
    with pytest.raises(ValueError, match=match):
        EmbeddingSpec(**kwargs)


# ------------------------------------------------------- constructor errors
def _wrong_part(transport: Any, folder: str) -> str:
    # Every rank takes its neighbour's part: each fails before the collective.
    part = load_part(folder, (transport.rank + 1) % transport.world_size)
    try:
        DistFeatureStore(part, transport)
    except ValueError as error:
        return str(error)
    return ""


def test_a_gradient_that_requires_grad_updates_the_table_as_data(
    graph: Graph, tmp_path: Path
) -> None:
    """Rank 0's own rows were updated without a detach, so its table took
    autograd history (requires_grad, a grad_fn) from the pushed gradient."""
    partition = get_partitioner("random").partition(graph, 2, seed=0)
    folder = write_partitioned(graph, partition, tmp_path / "random2")
    spec = EmbeddingSpec(dim=2, optimizer="adagrad", lr=1.0, init_std=0.0)

    def body(transport: Any) -> tuple[bool, torch.Tensor]:
        part = load_part(str(folder), transport.rank)
        store = DistFeatureStore(part, transport, embeddings={"e": spec})
        nid = torch.tensor([0, NUM_NODES - 1])  # rank 0's first, rank 1's last
        if transport.rank == 0:
            grad = torch.ones(2, 2, requires_grad=True) * 2.0
            store.push("e", nid, grad)
        transport.barrier()
        weight = store.tables["e"].weight
        tracked = weight.requires_grad or weight.grad_fn is not None
        rows = store.pull_embedding("e", nid)
        transport.barrier()
        store.close()
        return tracked, rows

    for tracked, rows in run_local(body, 2):
        assert not tracked
        assert not rows.requires_grad
        # adagrad from zero state: -lr * g / sqrt(g * g) = -1 per entry
        assert torch.allclose(rows, torch.full((2, 2), -1.0))


def test_store_refuses_another_ranks_part(graph: Graph, tmp_path: Path) -> None:
    partition = get_partitioner("random").partition(graph, 2, seed=0)
    folder = write_partitioned(graph, partition, tmp_path / "random2")
    errors = run_local(lambda t: _wrong_part(t, str(folder)), 2, timeout=10)
    assert "rank 0 of 2 must hold part 0 of 2, found part 1" in errors[0]
    assert "rank 1 of 2 must hold part 1 of 2, found part 0" in errors[1]


def test_store_rejects_reserved_kinds_and_bad_requests(
    graph: Graph, tmp_path: Path
) -> None:
    partition = get_partitioner("random").partition(graph, 1, seed=0)
    folder = write_partitioned(graph, partition, tmp_path / "random1")

    def body(transport: Any) -> None:
        part = load_part(str(folder), 0)
        with pytest.raises(ValueError, match="reserved"):
            DistFeatureStore(part, transport, kinds=("pull", "labels"))
        store = DistFeatureStore(part, transport, kinds=("pull",))
        with pytest.raises(ValueError, match="kind"):
            store.pull(torch.arange(3), kind="prefetch")
        with pytest.raises(ValueError, match="no table"):
            store.pull_embedding("missing", torch.arange(3))
        assert store.stats()["pull"]["remote_requests"] == 0
        store.close()

    run_local(body, 1)


# -------------------------------------------------------------- TensorStore
def test_tensor_store_answers_everything_locally(graph: Graph) -> None:
    assert graph.x is not None and graph.y is not None
    store = TensorStore(graph.x, graph.y)
    nid = torch.tensor([5, 0, 5, NUM_NODES - 1])
    assert torch.equal(store.pull(nid), graph.x[nid])
    assert torch.equal(store.pull(nid, torch.tensor([3, 1])), graph.x[nid][:, [3, 1]])
    assert torch.equal(store.labels(nid), graph.y[nid])
    assert store.is_local(nid).all()
    assert store.pull(torch.empty(0, dtype=torch.int64)).shape == (0, NUM_FEATURES)
    store.pull(nid, kind="prefetch")
    stats = store.stats()
    assert stats["pull"]["local_rows"] == 8 and stats["pull"]["calls"] == 3
    assert stats["prefetch"]["calls"] == 1 and stats["pull"]["remote_rows"] == 0
    store.reset_stats()
    assert store.stats()["pull"]["calls"] == 0
    assert TensorStore(graph.x.double()).pull(nid).dtype == torch.float32


@pytest.mark.parametrize(
    ("nid", "dims", "match"),
    [
        (torch.tensor([NUM_NODES]), None, r"nid: IDs must lie in \[0, 420\)"),
        (torch.tensor([-1]), None, "nid: IDs must lie"),
        (torch.tensor([1.0]), None, "nid: expected a 1-D int64"),
        (torch.zeros(2, 2, dtype=torch.int64), None, "nid: expected a 1-D int64"),
        ([1, 2], None, "nid: expected an int64 tensor"),
        (torch.tensor([1]), torch.tensor([6]), r"dims: columns must lie in \[0, 6\)"),
        (torch.tensor([1]), torch.tensor([2, 2]), "dims: columns must be distinct"),
        (torch.tensor([1]), torch.tensor([], dtype=torch.int64), "dims: empty"),
    ],
)
def test_tensor_store_validates_input(
    graph: Graph, nid: Any, dims: Any, match: str
) -> None:
    assert graph.x is not None
    with pytest.raises(ValueError, match=match):
        TensorStore(graph.x).pull(nid, dims)


def test_tensor_store_without_labels(graph: Graph) -> None:
    assert graph.x is not None
    with pytest.raises(ValueError, match="without y"):
        TensorStore(graph.x).labels(torch.arange(2))
    with pytest.raises(ValueError, match="kind"):
        TensorStore(graph.x).pull(torch.arange(2), kind="nope")
    with pytest.raises(ValueError, match="x: expected a floating"):
        TensorStore(torch.arange(4))


def test_ascending_dims_travel_as_a_bitmask() -> None:
    """A pull of DGS's top dimensions sent 8 bytes per column in its
    request; ascending columns now take ceil(F / 8) bytes."""
    from graphwire.feature.base import dims_from_wire, dims_on_wire

    dims = torch.tensor([0, 3, 4, 99])
    wire = dims_on_wire(dims, 100)
    assert wire.dtype == torch.uint8 and wire.numel() == 13
    assert torch.equal(dims_from_wire(wire, 100), dims)
    shuffled = torch.tensor([4, 0, 3])
    assert torch.equal(dims_on_wire(shuffled, 100), shuffled)
    assert torch.equal(dims_from_wire(shuffled, 100), shuffled)
    assert (
        dims_on_wire(None, 100).numel() == 0 and dims_from_wire(wire[:0], 100) is None
    )
    with pytest.raises(ValueError, match="bitmask of 12 bytes, expected 13"):
        dims_from_wire(wire[:12], 100)
    with pytest.raises(ValueError, match="names columns at or past 100"):
        dims_from_wire(dims_on_wire(torch.tensor([1, 102]), 104), 100)
    with pytest.raises(ValueError, match="dims: empty"):
        dims_from_wire(torch.zeros(13, dtype=torch.uint8), 100)
