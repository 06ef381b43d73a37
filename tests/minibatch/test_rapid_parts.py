"""The schedule, the hot cache and the prefetcher, one at a time."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator

import pytest
import torch

from graphwire.comm.base import TransportError
from graphwire.feature.base import TensorStore
from graphwire.feature.cache import HotCache, assemble_inputs
from graphwire.feature.prefetch import Prefetcher
from graphwire.minibatch.schedule import (
    epoch_batches,
    schedule_seed,
    split_train,
    steps_per_epoch,
)


# ------------------------------------------------------------------ schedule
def test_two_level_split_is_equal_prefers_own_nodes_and_partitions_all() -> None:
    per_rank = [torch.arange(0, 10), torch.arange(100, 102), torch.arange(200, 207)]
    shares = [split_train(per_rank, r) for r in range(3)]
    assert [s.numel() for s in shares] == [7, 6, 6]  # 19 nodes: 7, 6, 6
    assert torch.equal(
        torch.sort(torch.cat(shares)).values, torch.sort(torch.cat(per_rank)).values
    )
    # Own nodes first: rank 0 keeps 7 of its own, rank 2 six of its seven.
    assert bool((shares[0] < 10).all())
    assert int((shares[2] >= 200).sum()) == 6
    own = (shares[1] >= 100) & (shares[1] < 102)
    assert int(own.sum()) == 2 and shares[1].numel() == 6


def test_every_trainer_runs_the_same_number_of_steps() -> None:
    shares = [torch.arange(101), torch.arange(1000, 1100)]
    steps = steps_per_epoch([s.numel() for s in shares], 25)
    assert steps == 5
    for rank, share in enumerate(shares):
        batches = epoch_batches(share, 7, rank, 3, steps)
        assert len(batches) == 5
        assert torch.equal(
            torch.sort(torch.cat([b.seeds for b in batches])).values, share
        )
        assert max(b.seeds.numel() for b in batches) <= 25


def test_schedule_is_a_function_of_seed_worker_epoch_batch() -> None:
    share = torch.arange(50)
    one = epoch_batches(share, 7, 1, 2, 4)
    two = epoch_batches(share, 7, 1, 2, 4)
    assert [b.seed for b in one] == [b.seed for b in two]
    assert all(torch.equal(a.seeds, b.seeds) for a, b in zip(one, two, strict=True))
    other = epoch_batches(share, 7, 1, 3, 4)
    assert not torch.equal(one[0].seeds, other[0].seeds)
    seeds = {
        schedule_seed(7, w, e, i) for w in range(3) for e in range(3) for i in range(5)
    }
    assert len(seeds) == 45
    # Dropout seeds do not depend on the worker.
    assert one[0].dropout_seed == epoch_batches(share, 7, 0, 2, 4)[0].dropout_seed


# ---------------------------------------------------------------------- cache
class _SlowStore(TensorStore):
    """Cache fills take ``delay`` seconds; rows are ``id * 10 + column``."""

    def __init__(self, num_nodes: int, dim: int, delay: float) -> None:
        x = torch.arange(num_nodes, dtype=torch.float32).unsqueeze(1) * 10
        super().__init__(x + torch.arange(dim, dtype=torch.float32))
        self.delay = delay

    def _pull(
        self, nid: torch.Tensor, dims: torch.Tensor | None, kind: str
    ) -> torch.Tensor:
        if kind == "cache":
            time.sleep(self.delay)
        return super()._pull(nid, dims, kind)


def _truth(nid: torch.Tensor, dim: int = 3) -> torch.Tensor:
    return nid.unsqueeze(1).float() * 10 + torch.arange(dim, dtype=torch.float32)


def test_swap_waits_for_the_next_buffer_to_be_complete() -> None:
    store = _SlowStore(100, 3, delay=0.4)
    cache = HotCache(store, n_hot=5)
    cache.fill(0, torch.tensor([9, 8, 7, 6, 5, 4]))
    cache.build(1, torch.tensor([1, 2, 9, 3]))  # background, 0.4 s
    seen: list[tuple[torch.Tensor, torch.Tensor]] = []
    reader = threading.Thread(
        target=lambda: seen.append(cache.lookup(torch.tensor([2, 9, 50]), epoch=1))
    )
    reader.start()  # a prefetcher already in epoch 1 waits for its buffer
    began = time.perf_counter()
    cache.swap(1)
    assert time.perf_counter() - began > 0.2  # the swap waited for the build
    reader.join()
    hit, rows = seen[0]
    assert hit.tolist() == [True, True, False]
    assert torch.equal(rows, _truth(torch.tensor([2, 9])))
    assert cache.counters["swap_waits"] >= 1
    assert cache.epoch == 1
    hit, rows = cache.lookup(torch.tensor([1, 3, 8]))
    assert hit.tolist() == [True, True, False]
    assert torch.equal(rows, _truth(torch.tensor([1, 3])))
    # 9 was in the steady buffer: copied, not pulled again; the free slot
    # keeps the old buffer's lowest other row (5), also copied.
    assert torch.equal(
        cache.lookup(torch.tensor([5, 6]))[0], torch.tensor([True, False])
    )
    assert cache.counters["copied_rows"] == 2
    assert cache.counters["filled_rows"] == 5 + 3


def test_a_cache_never_allocates_more_rows_than_the_graph_has() -> None:
    """A buffer holds distinct nodes: ``n_hot`` above the node count was
    allocated as asked (``torch.zeros(n_hot, F)``, twice)."""
    cache = HotCache(_SlowStore(50, 3, delay=0.0), n_hot=10**6)
    assert cache.n_hot == 50 and cache.nbytes == 2 * 50 * 3 * 4
    cache.fill(0, torch.arange(49, -1, -1))
    assert torch.equal(cache.lookup(torch.arange(50))[1], _truth(torch.arange(50)))


def test_a_buffer_holds_distinct_nodes_and_one_buffer_per_epoch() -> None:
    """Repeated hot IDs took several slots ([5, 5, 5, 9] of n_hot = 4), and a
    second fill of the steady epoch left two buffers labelled with it, the
    old one serving the lookups."""
    cache = HotCache(_SlowStore(50, 3, delay=0.0), n_hot=4)
    cache.fill(0, torch.tensor([5, 5, 5, 9, 1, 7, 9]))
    hit, rows = cache.lookup(torch.tensor([1, 5, 7, 9]))
    assert hit.tolist() == [True, True, True, True]  # the first 4 distinct
    assert torch.equal(rows, _truth(torch.tensor([1, 5, 7, 9])))
    assert cache.counters["filled_rows"] == 4
    with pytest.raises(ValueError, match=r"build\(0\): epoch 0's buffer is the"):
        cache.fill(0, torch.tensor([8, 9]))
    assert cache.lookup(torch.tensor([8]))[0].tolist() == [False]
    with pytest.raises(ValueError, match="hot_ids: expected a 1-D"):
        cache.build(1, torch.tensor([[1, 2]]))


def test_assemble_takes_cache_then_local_then_pulls_the_rest() -> None:
    store = _SlowStore(50, 3, delay=0.0)
    cache = HotCache(store, n_hot=2)
    cache.fill(0, torch.tensor([4, 7]))
    nid = torch.tensor([1, 4, 2, 7, 9])
    local = torch.tensor([True, False, True, False, False])
    x, counts = assemble_inputs(store, cache, nid, local, "prefetch", 0)
    assert torch.equal(x, _truth(nid))
    assert counts == {"cache_hits": 2, "local_rows": 2, "missed_rows": 1}


def test_closing_the_cache_ends_a_lookup_waiting_for_a_buffer() -> None:
    """A lookup for an epoch whose build has not started waits (the
    prefetcher ahead of the trainer); close() ends the wait with an error."""
    cache = HotCache(_SlowStore(50, 3, delay=0.0), n_hot=2)
    cache.fill(0, torch.tensor([1, 2]))
    errors: list[BaseException] = []

    def lookup() -> None:
        try:
            cache.lookup(torch.tensor([1]), epoch=2)
        except RuntimeError as error:
            errors.append(error)

    reader = threading.Thread(target=lookup, daemon=True)
    reader.start()
    cache.close()
    reader.join(timeout=10)
    assert not reader.is_alive()
    assert len(errors) == 1 and "closed" in str(errors[0])
    with pytest.raises(RuntimeError, match="cache: closed, so epoch 0"):
        cache.lookup(torch.tensor([1]))


class _ShortWaits(threading.Condition):
    """A condition whose every wait returns within 0.05 s, as a deadline
    of any length would when it ran out."""

    def wait(self, timeout: float | None = None) -> bool:
        return super().wait(timeout=0.05 if timeout is None else min(timeout, 0.05))


def test_a_lookup_waits_for_a_late_build_with_no_deadline_of_its_own() -> None:
    """The prefetcher looks up epoch 2 while the trainer still evaluates
    epoch 0 (and checkpoints), before epoch 1 starts 2's build: it waits as
    long as that takes. A fixed 600 s deadline failed a run whose evaluation
    took longer; here every wait times out at once, and the lookup still
    returns once the build is done."""
    cache = HotCache(_SlowStore(50, 3, delay=0.0), n_hot=2)
    cache._cond = _ShortWaits()  # (a deadline that ran out would raise)
    cache.fill(0, torch.tensor([1, 2]))
    seen: list[tuple[torch.Tensor, torch.Tensor]] = []
    reader = threading.Thread(
        target=lambda: seen.append(cache.lookup(torch.tensor([3, 7]), epoch=1)),
        daemon=True,
    )
    reader.start()
    time.sleep(0.3)  # the evaluation: several timed-out waits
    cache.build(1, torch.tensor([3, 4]))
    reader.join(timeout=10)
    assert not reader.is_alive() and len(seen) == 1
    hit, rows = seen[0]
    assert hit.tolist() == [True, False]
    assert torch.equal(rows, _truth(torch.tensor([3])))


def _within(seconds: float, call: Callable[[], object]) -> BaseException | None:
    """What ``call`` raised (None: nothing), asserting it returned within
    ``seconds``: a wrong wait is 600 s long, so the test does not sit in it."""
    raised: list[BaseException] = []

    def run() -> None:
        try:
            call()
        except Exception as error:
            raised.append(error)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(timeout=seconds)
    assert not thread.is_alive(), "still waiting"
    return raised[0] if raised else None


def test_a_wait_that_can_never_end_is_refused_at_once() -> None:
    """A lookup before any fill, or a swap to an epoch no buffer holds,
    waited 600 s for a buffer nothing was building."""
    cache = HotCache(_SlowStore(50, 3, delay=0.0), n_hot=2)
    for call in (
        lambda: cache.lookup(torch.tensor([1])),
        lambda: cache.lookup(torch.tensor([1]), epoch=0),
    ):
        error = _within(5, call)
        assert isinstance(error, RuntimeError)
        assert "before any fill()" in str(error)
    cache.fill(0, torch.tensor([1, 2]))
    error = _within(5, lambda: cache.swap(3))
    assert isinstance(error, ValueError)
    assert "swap(3): no buffer holds epoch 3" in str(error)
    # A build under way is waited for, as is an epoch not yet built: the
    # prefetcher's lookups ahead of the trainer.
    cache.build(1, torch.tensor([3, 4]))
    seen: list[tuple[torch.Tensor, torch.Tensor]] = []
    ahead = threading.Thread(
        target=lambda: seen.append(cache.lookup(torch.tensor([5]), epoch=2))
    )
    ahead.start()
    cache.swap(1)
    cache.build(2, torch.tensor([5, 6]))
    ahead.join(timeout=10)
    assert seen[0][0].tolist() == [True]


# ----------------------------------------------------------------- prefetcher
def _tensor_of(key: object) -> torch.Tensor:
    return torch.full((10,), float(key))  # type: ignore[arg-type]


def _wait_until(done: Callable[[], bool]) -> None:
    deadline = time.monotonic() + 10
    while not done():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.005)


def test_prefetcher_never_holds_more_than_q_batches_and_yields_to_the_trainer() -> None:
    """Keys 0-2 and 5-11 are the prefetcher's; 3 and 4 the trainer makes
    itself while the prefetcher's key source is held back."""
    made: list[int] = []
    resume = threading.Event()

    def keys() -> Iterator[int]:
        yield from range(3)
        resume.wait(timeout=10)
        yield from range(3, 12)

    def make(key: object) -> object:
        made.append(int(key))  # type: ignore[call-overload]
        return _tensor_of(key)

    prefetcher = Prefetcher(keys=keys(), make=make, depth=3, nbytes=lambda t: 40)
    _wait_until(lambda: prefetcher.counters["prefetched"] == 3)
    time.sleep(0.05)  # it fills its window, then stops: nothing is released
    assert prefetcher.counters["peak_alive"] == 3 and made == [0, 1, 2]
    own: list[int] = []
    for key in range(12):
        if key == 5:
            resume.set()
        if key not in (3, 4):
            _wait_until(lambda: key in made)  # noqa: B023 (called at once)
        item, prefetched = prefetcher.get(key, lambda k: own.append(k) or _tensor_of(k))
        assert prefetched == (key not in own)
        assert torch.equal(item, _tensor_of(key))  # type: ignore[arg-type]
        prefetcher.release(key)
    prefetcher.close()
    assert own == [3, 4] and made == [0, 1, 2, *range(5, 12)]
    assert prefetcher.counters["fallbacks"] == 2
    assert prefetcher.counters["peak_alive"] == 3
    assert prefetcher.counters["peak_bytes"] == 3 * 40


def test_the_trainers_own_batch_counts_against_q() -> None:
    """With Q=1, a batch the trainer makes itself holds the one permit: the
    prefetcher starts the next only once the trainer has released it (it
    used to run ahead, leaving Q+1 batches alive)."""
    may_start = threading.Event()
    made: list[int] = []

    def keys() -> Iterator[int]:
        may_start.wait(timeout=10)  # the trainer asks for 0 before this
        yield from range(3)

    def make(key: object) -> object:
        made.append(int(key))  # type: ignore[call-overload]
        return _tensor_of(key)

    prefetcher = Prefetcher(keys=keys(), make=make, depth=1, nbytes=lambda t: 40)
    item, prefetched = prefetcher.get(0, _tensor_of)
    assert not prefetched
    may_start.set()
    time.sleep(0.2)  # time enough to start batch 1, were it allowed to
    assert made == [], "the prefetcher started a batch beyond Q"
    prefetcher.release(0)
    for key in (1, 2):
        _wait_until(lambda: key in made)  # noqa: B023 (called at once)
        item, prefetched = prefetcher.get(key, _tensor_of)
        assert prefetched and torch.equal(item, _tensor_of(key))  # type: ignore[arg-type]
        prefetcher.release(key)
    prefetcher.close()
    assert made == [1, 2]
    assert prefetcher.counters["peak_alive"] == 1
    assert prefetcher.counters["peak_bytes"] == 40


def test_a_trainer_holding_q_batches_is_told_to_release_one() -> None:
    """Q=3: the trainer holds a prefetched batch (0) and two of its own (1, 2)."""
    resume = threading.Event()

    def keys() -> Iterator[int]:
        yield 0
        resume.wait(timeout=10)

    prefetcher = Prefetcher(keys=keys(), make=_tensor_of, depth=3)
    _wait_until(lambda: prefetcher.counters["prefetched"] == 1)
    assert prefetcher.get(0, _tensor_of)[1]
    prefetcher.get(1, _tensor_of)
    with pytest.raises(RuntimeError, match="batch 1 is the trainer's own already"):
        prefetcher.get(1, _tensor_of)  # (it took a second permit, never freed)
    prefetcher.get(2, _tensor_of)
    with pytest.raises(
        RuntimeError, match="batch 3: the trainer holds 3 of Q=3 batches and 0 made"
    ):
        prefetcher.get(3, _tensor_of)
    with pytest.raises(RuntimeError, match="batch 3: the trainer holds 3"):
        prefetcher.get(3, _tensor_of)  # (nothing was taken by the first ask)
    prefetcher.release(0)
    assert not prefetcher.get(3, _tensor_of)[1]
    assert prefetcher.counters["fallbacks"] == 3
    resume.set()
    prefetcher.close()


def test_keys_asked_out_of_order_are_named() -> None:
    """Skipping a batch the prefetcher made leaves its permit taken for good."""
    made: list[int] = []
    prefetcher = Prefetcher(keys=range(3), make=lambda k: made.append(k), depth=1)
    _wait_until(lambda: made == [0])
    with pytest.raises(
        RuntimeError, match="holds 0 of Q=1 batches and 1 made ahead were never"
    ):
        prefetcher.get(1, _tensor_of)
    prefetcher.close()


def test_a_batch_is_released_only_once_assembled() -> None:
    started, finish = threading.Event(), threading.Event()

    def make(key: object) -> object:
        started.set()
        finish.wait(timeout=10)
        return _tensor_of(key)

    prefetcher = Prefetcher(keys=range(1), make=make, depth=1, nbytes=lambda t: 40)
    started.wait(timeout=10)
    with pytest.raises(RuntimeError, match="batch 0 is still being assembled"):
        prefetcher.release(0)
    finish.set()
    assert prefetcher.get(0, _tensor_of)[1]
    prefetcher.release(0)
    prefetcher.close()
    assert prefetcher.counters["peak_alive"] == 1


def test_a_failed_own_batch_gives_its_key_and_permit_back() -> None:
    """The prefetcher, which had not reached key 0, then makes it; the
    failed attempt is no fallback."""
    resume = threading.Event()

    def keys() -> Iterator[int]:
        resume.wait(timeout=10)
        yield 0

    def fail(key: object) -> object:
        raise OSError("disk gone")

    prefetcher = Prefetcher(keys=keys(), make=_tensor_of, depth=1)
    with pytest.raises(OSError, match="disk gone"):
        prefetcher.get(0, fail)
    resume.set()
    _wait_until(lambda: prefetcher.counters["prefetched"] == 1)
    assert prefetcher.get(0, fail)[1]
    assert prefetcher.counters["fallbacks"] == 0
    prefetcher.close()


@pytest.mark.parametrize(
    ("raised", "seen"), [(TransportError, TransportError), (OSError, RuntimeError)]
)
def test_a_prefetcher_error_reaches_the_trainer_as_what_it_was(
    raised: type[Exception], seen: type[Exception]
) -> None:
    """A peer that dies or hangs while the prefetcher fetches from it is a
    TransportError on the trainer's thread too: the launcher then blames
    that peer (a hung one by name), not this rank."""

    tried = threading.Event()

    def make(key: object) -> object:
        tried.set()  # (slot 0 exists: get waits for it, not make its own)
        raise raised("rank 0: kv.x request to rank 1 failed: timed out")

    prefetcher = Prefetcher(keys=range(3), make=make, depth=2)
    tried.wait(timeout=10)
    with pytest.raises(seen, match="prefetcher failed: rank 0: kv.x") as caught:
        prefetcher.get(0, make)
    assert type(caught.value) is seen
    assert isinstance(caught.value.__cause__, raised)
    prefetcher.close()


def test_prefetch_depth_must_be_positive() -> None:
    with pytest.raises(ValueError, match="Q"):
        Prefetcher(keys=[], make=lambda k: k, depth=0)


# ----------------------------------------------------------------- presample
def test_presampled_epochs_read_back_bitwise_and_memory_mapped(tmp_path) -> None:
    import numpy as np

    from graphwire.graph.graph import Graph
    from graphwire.sampler.presample import PresampledEpoch, presample_epoch
    from graphwire.sampler.uniform import UniformNeighborSampler

    gen = torch.Generator().manual_seed(0)
    src, dst = torch.randint(0, 300, (2, 3000), generator=gen)
    graph = Graph.from_edge_index(src, dst, num_nodes=300).deduplicate()
    weight = torch.rand(graph.num_edges, generator=gen)
    sampler = UniformNeighborSampler(graph, [3, 4], edge_weight=weight, hashed=True)
    share = torch.arange(0, 300, 2)
    local = lambda nid: nid < 150  # noqa: E731
    for epoch in range(2):
        batches = epoch_batches(share, 3, 0, epoch, 4)
        presample_epoch(
            tmp_path, batches, lambda b: sampler.sample(b.seeds, b.seed), local
        )
    assert sorted(p.name for p in tmp_path.iterdir()) == ["epoch_00000", "epoch_00001"]
    for epoch in range(2):
        stored = PresampledEpoch(tmp_path, epoch, 2, weighted=True)
        assert isinstance(stored._arrays["ints"], np.memmap)
        inputs = []
        for batch in epoch_batches(share, 3, 0, epoch, 4):
            want = sampler.sample(batch.seeds, batch.seed)
            got, flags = stored.batch(batch.index)
            assert torch.equal(got.seeds, want.seeds)
            assert torch.equal(flags, local(want.input_nid))
            for a, b in zip(got.blocks, want.blocks, strict=True):
                for field in ("src_nid", "dst_nid", "indptr", "indices", "eid"):
                    assert torch.equal(getattr(a, field), getattr(b, field))
                assert torch.equal(a.edge_weight, b.edge_weight)
            inputs.append(want.input_nid)
        # The ranking: remote inputs by access count, most first, ties by ID.
        remote = torch.cat([i[i >= 150] for i in inputs])
        ids, counts = torch.unique(remote, return_counts=True)
        assert torch.equal(
            stored.hot_counts, torch.sort(counts, descending=True).values
        )
        top = stored.hot_ids[stored.hot_counts == stored.hot_counts[0]]
        assert torch.equal(top, torch.sort(top).values)
        assert set(stored.hot_ids.tolist()) == set(ids.tolist())
        assert stored.max_inputs == max(i.numel() for i in inputs)
    # A truncated stream is refused, naming it, not read short.
    ints = tmp_path / "epoch_00001" / "ints.bin"
    ints.write_bytes(ints.read_bytes()[:-8])
    with pytest.raises(ValueError, match=r"ints\.bin: holds .*\(truncated"):
        PresampledEpoch(tmp_path, 1, 2, weighted=True)


def test_presampling_overlaps_training_and_drops_the_epochs_done(tmp_path) -> None:
    """Only the first epoch is sampled before the Presampler returns; the
    others follow on its thread (a reader waits for one not yet on disk); a
    forgotten epoch's files go; stop() ends it early, and an epoch it never
    sampled, or one whose sampling failed, is an error naming it."""
    from graphwire.feature.presampler import Presampler
    from graphwire.graph.graph import Graph
    from graphwire.sampler.uniform import UniformNeighborSampler

    gen = torch.Generator().manual_seed(0)
    src, dst = torch.randint(0, 100, (2, 800), generator=gen)
    graph = Graph.from_edge_index(src, dst, num_nodes=100).deduplicate()
    sampler = UniformNeighborSampler(graph, [3], hashed=True)
    share = torch.arange(0, 100, 2)
    gate = threading.Event()
    made: list[int] = []

    def sample(batch):
        if batch.epoch >= 1:
            assert gate.wait(timeout=30)
        if batch.epoch == 4:
            raise RuntimeError("owner 1 is gone")
        made.append(batch.epoch)
        return sampler.sample(batch.seeds, batch.seed)

    def presampler(epochs: range) -> Presampler:
        return Presampler(
            tmp_path,
            epochs,
            lambda e: epoch_batches(share, 3, 0, e, 2),
            sample,
            lambda nid: nid < 50,
            1,
            False,
            remove=True,
        )

    first = presampler(range(0, 4))
    assert made == [0, 0] and first.ready(0) and not first.ready(1)
    reader = threading.Thread(target=first.epoch, args=(2,))
    reader.start()
    for _ in range(3000):  # until the reader waits (epoch 1 is held back)
        if first.waits:
            break
        time.sleep(0.01)
    assert first.waits == 1
    gate.set()
    reader.join(timeout=30)
    assert first.epoch(2).num_batches == 2  # waited for, then read
    first.forget(0)
    assert not (tmp_path / "epoch_00000").exists()
    assert (tmp_path / "epoch_00001").exists()
    with pytest.raises(RuntimeError, match="epoch 0 was dropped"):
        first.epoch(0)
    first.stop()
    with pytest.raises(RuntimeError, match="epoch 9 will not be sampled"):
        first.epoch(9)
    failing = presampler(range(3, 6))
    with pytest.raises(RuntimeError, match="failed before epoch 5: owner 1 is gone"):
        failing.epoch(5)
    with pytest.raises(RuntimeError, match="owner 1 is gone"):
        failing.raise_error()
