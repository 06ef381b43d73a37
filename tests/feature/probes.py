"""Worker functions for the feature-store tests (in-process and gloo ranks).

:func:`feature_suite` runs every check of one rank's
:class:`~graphwire.feature.dist.DistFeatureStore` in phases, returning what
the test compares with a single-process oracle:

1. measured pulls (one per kind), each with this rank's client-side ledger
   traffic and counters for that pull alone;
2. plain pulls of every ID (shuffled, repeated), with and without ``dims``,
   labels, an empty pull, ``is_local``;
3. bad input: an out-of-range ID, and a request sent straight to a peer's
   handler for an ID the peer does not own (the store must keep serving);
4. two threads pulling at once (checked here against ``x_new``);
5. sparse embeddings: ranks push in turn (so the order of updates is known),
   then every rank pulls every table.

A child process imports these by name (see :mod:`graphwire.testing.workers`).
"""

from __future__ import annotations

import threading
from typing import Any

import torch

from graphwire.comm.base import Transport, TransportError
from graphwire.feature.dist import DistFeatureStore, EmbeddingSpec
from graphwire.partition import load_part

Traffic = dict[tuple[str, int], tuple[int, int]]
"""``(tag, peer) -> (bytes, messages)``."""


def feature_suite(
    transport: Transport,
    folder: str,
    x_new: torch.Tensor,
    embeddings: dict[str, dict[str, Any]],
    push_rounds: int = 2,
) -> dict[str, Any]:
    """One rank's run of every phase (see the module docstring).

    Args:
        folder: a partitioned folder with one part per rank.
        x_new: float32 [N, F]: the true rows in new-ID order (for the threads).
        embeddings: ``EmbeddingSpec`` keyword arguments by table name.
        push_rounds: how many times each rank pushes to every table.
    """
    part = load_part(folder, transport.rank)
    specs = {name: EmbeddingSpec(**kw) for name, kw in embeddings.items()}
    store = DistFeatureStore(part, transport, embeddings=specs)
    out: dict[str, Any] = {"measured": _measured_pulls(store, transport)}
    out.update(_plain_pulls(store))
    out.update(_bad_input(store))
    out["thread_wrong"] = _threaded_pulls(store, x_new)
    out.update(_embedding_rounds(store, transport, push_rounds))
    out["stats"] = store.stats()
    store.close()
    return out


def _client_traffic(before: dict[str, Any], after: dict[str, Any]) -> Traffic:
    """What this rank sent as a caller (``*.req``) and received as answers
    between two ledger snapshots."""
    out: Traffic = {}
    for side, requests in (("sent", True), ("recv", False)):
        old = {(s, d, t): (b, m) for s, d, t, b, m in before[side]}
        for src, dst, tag, num_bytes, messages in after[side]:
            if tag.endswith(".req") != requests:
                continue
            b0, m0 = old.get((src, dst, tag), (0, 0))
            if num_bytes != b0 or messages != m0:
                peer = dst if side == "sent" else src
                out[(tag, peer)] = (num_bytes - b0, messages - m0)
    return out


def _measured_pulls(
    store: DistFeatureStore, transport: Transport
) -> list[dict[str, Any]]:
    """One pull per kind, each measured alone.

    ``pull``: some own IDs and the next part's first IDs, twice (so with three
    or more parts, other owners must get no message); ``prefetch``: random IDs
    over all parts with ``dims``; ``cache``: own IDs only (no message at all).
    """
    rank, world = transport.rank, transport.world_size
    offsets = store.book.offsets.tolist()
    start, stop = offsets[rank], offsets[rank + 1]
    q = (rank + 1) % world
    gen = torch.Generator().manual_seed(rank)
    mine = torch.arange(start, min(stop, start + 5))
    theirs = torch.arange(offsets[q], min(offsets[q + 1], offsets[q] + 7))
    plans = [
        ("pull", torch.cat([mine, theirs, theirs.flip(0)]), None),
        (
            "prefetch",
            torch.randint(0, store.num_nodes, (200,), generator=gen),
            torch.tensor([5, 1, 3]),
        ),
        ("cache", torch.cat([mine, mine]), None),
    ]
    measured = []
    for kind, nid, dims in plans:
        store.reset_stats()
        before = transport.ledger.snapshot()
        rows = store.pull(nid, dims, kind=kind)
        after = transport.ledger.snapshot()
        measured.append(
            {
                "kind": kind,
                "nid": nid,
                "dims": dims,
                "rows": rows,
                "traffic": _client_traffic(before, after),
                "stats": store.stats(),
            }
        )
    return measured


def _plain_pulls(store: DistFeatureStore) -> dict[str, Any]:
    gen = torch.Generator().manual_seed(store.rank + 100)
    num_nodes = store.num_nodes
    nid = torch.cat(
        [
            torch.randperm(num_nodes, generator=gen),
            torch.randint(0, num_nodes, (num_nodes // 3,), generator=gen),
        ]
    )
    cols = torch.tensor([4, 0, 2])
    return {
        "nid": nid,
        "rows": store.pull(nid),
        "cols": cols,
        "sub": store.pull(nid, cols),
        "labels": store.labels(nid),
        "empty_shape": tuple(store.pull(torch.empty(0, dtype=torch.int64)).shape),
        "is_local": store.is_local(torch.arange(num_nodes)),
    }


def _bad_input(store: DistFeatureStore) -> dict[str, str]:
    out = {"bad_nid": "", "wrong_owner": ""}
    try:
        store.pull(torch.tensor([store.num_nodes]))
    except ValueError as error:
        out["bad_nid"] = str(error)
    peer = (store.rank + 1) % store.book.num_parts
    foreign = torch.tensor([store.start])  # this rank's ID, not the peer's
    try:
        store.service.call({peer: [foreign, torch.empty(0, dtype=torch.int64)]}, "pull")
    except TransportError as error:
        out["wrong_owner"] = str(error)
    return out


def _threaded_pulls(
    store: DistFeatureStore, x_new: torch.Tensor, calls: int = 15
) -> list[str]:
    """A trainer thread and a prefetcher thread pulling at once."""
    wrong: list[str] = []

    def work(seed: int, kind: str, dims: torch.Tensor | None) -> None:
        gen = torch.Generator().manual_seed(seed)
        for i in range(calls):
            nid = torch.randint(0, store.num_nodes, (100,), generator=gen)
            want = x_new[nid] if dims is None else x_new[nid][:, dims]
            if not torch.equal(store.pull(nid, dims, kind=kind), want):
                wrong.append(f"{kind} call {i}")

    threads = [
        threading.Thread(target=work, args=(store.rank, "pull", None)),
        threading.Thread(
            target=work, args=(store.rank + 50, "prefetch", torch.tensor([3, 2]))
        ),
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return wrong


def _embedding_rounds(
    store: DistFeatureStore, transport: Transport, rounds: int
) -> dict[str, Any]:
    """Ranks push in turn (rank 0, 1, ... each round); every rank then pulls."""
    everything = torch.arange(store.num_nodes)
    names = sorted(store.tables)
    initial = {n: store.pull_embedding(n, everything) for n in names}
    transport.barrier()  # no push lands before every rank read the initial rows
    pushes = []
    for round_ in range(rounds):
        for turn in range(transport.world_size):
            if turn == transport.rank:
                gen = torch.Generator().manual_seed(1000 * round_ + turn)
                nid = torch.randint(0, store.num_nodes, (40,), generator=gen)
                nid = torch.cat([nid, nid[:8]])  # repeated IDs
                for name in names:
                    dim = store.tables[name].spec.dim
                    grad = torch.randn(nid.numel(), dim, generator=gen)
                    store.push(name, nid, grad)
                    pushes.append((round_, turn, name, nid, grad))
            transport.barrier()  # the next rank pushes after this one's landed
    final = {n: store.pull_embedding(n, everything) for n in names}
    return {"emb_initial": initial, "emb_final": final, "pushes": pushes}
