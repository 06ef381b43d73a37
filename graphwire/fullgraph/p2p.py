"""`P2PEngine` (``--exchange g3``): G3's hybrid-parallel peer-to-peer exchange.

G3 (Wan et al., "Scaling Graph Neural Network Training with Hybrid
Parallelism") sends each boundary row once to each peer that needs it and hides
the transfer behind computation:

- **Bins.** A rank computes its owned rows of a layer in bins, in priority
  order: rows that peers need first (most peers first, then most remote
  neighbours), then the rest. Bins hold at most ``bin_rows`` rows (default from
  a per-layer memory budget, ``bin_mb`` MiB of float32 rows of width 128).
- **Inter-layer pipelining.** As soon as a bin of layer ``l`` is computed, the
  rows of it that peers need at layer ``l + 1`` are finished (activation and
  the layer's hashed dropout, exactly what the model will apply) and sent with
  ``isend``, one message per (bin, peer), while later bins compute. Sends are
  driven by torch.distributed's (gloo's) own communication threads; receives
  for layer ``l + 1`` are posted before layer ``l`` starts.
- **Intra-layer eager computation.** Bins whose inputs are all owned compute
  first, while halo rows are in flight; each bin that needs halo rows waits
  only for the messages carrying its own remote inputs.
- **Backward** sends each halo row's gradient to its owner in one bulk
  exchange per layer (tag ``bwd.L{l}``), as the halo engine does. (G3 also
  pipelines the backward pass in reverse bin order; this engine does not.)

``mode`` switches parts off for G3's ablation: ``full`` (both), ``inter``
(pipelined sends, but a layer waits for all its halo rows before computing),
``intra`` (sends start when a layer starts, eager computation) and
``sequential`` (send everything, wait, compute).

Forward bytes per layer equal ``num_halo * width * 4`` on every rank: each halo
row arrives exactly once.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from graphwire.comm.base import Work
from graphwire.fullgraph.base import Engine, local_message_graph, register
from graphwire.graph.seeds import derive_seed
from graphwire.nn.base import MessageGraph
from graphwire.nn.dropout import hashed_dropout

__all__ = ["MODES", "P2PEngine"]

MODES = ("full", "inter", "intra", "sequential")


@dataclass(frozen=True, eq=False)
class _Bin:
    """One bin of owned destination rows and the sub-graph they aggregate over.

    Attributes:
        rows: int64 [b], owned-local IDs of the bin's destinations.
        mg: MessageGraph with ``b`` destinations; its sources are ``rows`` then
            the other local rows its edges use.
        src_owned: int64 [*], owned-local rows feeding ``mg``'s sources.
        src_halo: int64 [*], halo positions feeding the sources after them.
        needs: the messages ``(peer, bin at peer)`` the halo rows come in.
    """

    rows: torch.Tensor
    mg: MessageGraph
    src_owned: torch.Tensor
    src_halo: torch.Tensor
    needs: frozenset[tuple[int, int]]


@register("g3")
class P2PEngine(Engine):
    """G3 peer-to-peer exchange in bins (see the module docstring).

    Options:
        mode: one of :data:`MODES` (default ``full``).
        bin_rows: rows per bin; default ``bin_mb`` MiB of width-128 float32 rows.
        bin_mb: memory budget per bin in MiB (default 4).
    """

    def __init__(
        self,
        *args: Any,
        mode: str = "full",
        bin_rows: int | None = None,
        bin_mb: float = 4.0,
        **kwargs: Any,
    ) -> None:
        super().__init__(*args, **kwargs)
        if mode not in MODES:
            raise ValueError(f"g3 mode: expected one of {MODES}, got {mode!r}")
        if bin_rows is None:
            bin_rows = max(1, int(bin_mb * 2**20 // (128 * 4)))
        if bin_rows < 1:
            raise ValueError(f"g3 bin_rows: expected >= 1, got {bin_rows}")
        self.mode = mode
        self.bin_rows = bin_rows
        self._mg = local_message_graph(self.part, self.plan, self.transport, self.kind)
        self._mgs = [self._mg] * self.num_layers
        order = self._priority_order()
        self.bins = self._make_bins(order)
        self._setup_messages()
        self.counters = {"bins": len(self.bins)}
        self._pending_recv: dict[int, dict[tuple[int, int], tuple[Work, Any]]] = {}
        self._sends: list[Work] = []
        self._halo: dict[int, torch.Tensor] = {}
        self._begin: tuple[Any, float, int | None, bool] | None = None

    @property
    def mgs(self) -> list[MessageGraph]:
        return self._mgs

    # ------------------------------------------------------------------ setup
    def _priority_order(self) -> torch.Tensor:
        """Owned rows, most-needed first: by peers needing the row, then by
        remote in-neighbours, then by ID (G3's boundary-first order)."""
        n = self.part.num_owned
        peers = torch.zeros(n, dtype=torch.int64)
        for idx in self.plan.send_idx:
            peers[idx] += 1
        dst = self._mg.dst_of_edges
        remote = torch.bincount(dst[self._mg.indices >= n], minlength=n)
        key = (peers * (remote.max() + 1) + remote) * n + (n - 1 - torch.arange(n))
        return torch.argsort(key, descending=True)

    def _make_bins(self, order: torch.Tensor) -> list[_Bin]:
        n = self.part.num_owned
        mg = self._mg
        degrees = mg.in_degrees()
        has_halo = torch.zeros(n, dtype=torch.bool)
        has_halo[mg.dst_of_edges[mg.indices >= n]] = True
        local_first = torch.cat([order[~has_halo[order]], order[has_halo[order]]])
        self._local_count = int((~has_halo).sum())
        groups = [local_first[: self._local_count], local_first[self._local_count :]]
        bins: list[_Bin] = []
        for group in groups:
            for rows in torch.split(group, self.bin_rows):
                bins.append(self._bin(rows, degrees))
        self.schedule = torch.cat([b.rows for b in bins]) if bins else order
        position = torch.empty(n, dtype=torch.int64)
        position[self.schedule] = torch.arange(n)
        self._bin_of_row = torch.empty(n, dtype=torch.int64)
        for index, b in enumerate(bins):
            self._bin_of_row[b.rows] = index
        self._inverse = position
        sizes = torch.tensor([b.rows.numel() for b in bins], dtype=torch.int64)
        self._bin_start = torch.cumsum(sizes, 0) - sizes
        return bins

    def _bin(self, rows: torch.Tensor, degrees: torch.Tensor) -> _Bin:
        """Sub-graph of ``rows``: its own rows first among the sources."""
        mg = self._mg
        n, num_local = self.part.num_owned, self.part.num_local
        counts = degrees[rows]
        indptr = torch.zeros(rows.numel() + 1, dtype=torch.int64)
        torch.cumsum(counts, 0, out=indptr[1:])
        starts = torch.repeat_interleave(mg.indptr[rows], counts)
        offsets = torch.arange(int(indptr[-1])) - torch.repeat_interleave(
            indptr[:-1], counts
        )
        eids = starts + offsets
        sources = mg.indices[eids]
        # Relabel: the bin's rows first, then other sources in first-seen order.
        slot = torch.full((num_local,), -1, dtype=torch.int64)
        slot[rows] = torch.arange(rows.numel())
        others = sources[slot[sources] < 0]
        others = torch.unique(others)  # sorted: owned before halo
        slot[others] = torch.arange(rows.numel(), rows.numel() + others.numel())
        src_rows = torch.cat([rows, others])
        weight = mg.edge_weight[eids] if mg.edge_weight is not None else None
        sub = MessageGraph(
            indptr, slot[sources], src_rows.numel(), rows.numel(), weight
        )
        is_halo = src_rows >= n
        return _Bin(
            rows=rows,
            mg=sub,
            src_owned=src_rows[~is_halo],
            src_halo=src_rows[is_halo] - n,
            needs=frozenset(),
        )

    def _setup_messages(self) -> None:
        """Agree with every peer on the message layout: one message per
        (sender bin, receiver), rows in the sender's schedule order."""
        plan, transport, rank = self.plan, self.transport, self.transport.rank
        world = transport.world_size
        # Sender side: per peer, its rows in schedule order, split by bin.
        self._send_rows: list[list[tuple[int, torch.Tensor, torch.Tensor]]] = []
        perms, counts = [], []
        for peer in range(world):
            idx = plan.send_idx[peer]
            perm = torch.argsort(self._inverse[idx], stable=True)
            bins = self._bin_of_row[idx[perm]]
            per_bin = torch.bincount(bins, minlength=len(self.bins))
            chunks = torch.split(idx[perm], per_bin.tolist())
            self._send_rows.append(
                [
                    (b, rows, self._inverse[rows] - self._bin_start[b])
                    for b, rows in enumerate(chunks)
                    if rows.numel()
                ]
            )
            perms.append(perm)
            counts.append(per_bin.tolist())
        their_perm = transport.all_to_all(perms, plan.recv_rows, "setup.g3")
        their_counts = self._exchange_counts(counts)
        # Receiver side: where each message's rows land in the halo.
        self._recv_pos: dict[tuple[int, int], torch.Tensor] = {}
        halo_message = torch.full((plan.num_halo,), -1, dtype=torch.int64)
        keys: list[tuple[int, int]] = []
        for peer in range(world):
            if peer == rank:
                continue
            positions = plan.recv_idx[peer][their_perm[peer]]
            for b, pos in enumerate(torch.split(positions, their_counts[peer])):
                if pos.numel():
                    self._recv_pos[(peer, b)] = pos
                    halo_message[pos] = len(keys)
                    keys.append((peer, b))
        self._message_keys = keys
        self._bins_sent = {b for chunks in self._send_rows for b, _, _ in chunks}
        self._uses_halo = any(b.src_halo.numel() for b in self.bins)
        self.bins = [
            _Bin(
                b.rows,
                b.mg,
                b.src_owned,
                b.src_halo,
                frozenset(keys[int(m)] for m in torch.unique(halo_message[b.src_halo])),
            )
            for b in self.bins
        ]

    def _exchange_counts(self, counts: list[list[int]]) -> list[list[int]]:
        gathered = self.transport.all_gather_object(counts, "setup.g3")
        return [gathered[peer][self.transport.rank] for peer in range(len(gathered))]

    # ---------------------------------------------------------------- runtime
    def begin(self, model: nn.Module, dropout_seed: int | None) -> None:
        """Before each forward: learn how the model finishes a layer's rows
        (activation, then the next layer's dropout), so that pipelined sends
        carry exactly the rows the model will use."""
        p = float(getattr(model, "dropout", 0.0))
        training = bool(model.training) and p > 0.0
        if training and dropout_seed is None and self.mode in ("full", "inter"):
            raise ValueError(
                "g3: pipelined sends need hashed dropout (a dropout_seed) in training"
            )
        super().begin(model, dropout_seed)
        self._begin = (model.activation, p, dropout_seed, training)
        self._halo.clear()
        self._pending_recv.clear()

    def _post_recvs(self, layer: int, width: int, like: torch.Tensor) -> None:
        """Post the receives of layer ``layer``'s halo rows (once per forward)."""
        if layer in self._halo:
            return
        self._halo[layer] = like.new_empty((self.plan.num_halo, width))
        tag = f"{self.phase}fwd.L{layer}"
        pending = self._pending_recv[layer] = {}
        for key in self._message_keys:
            buf = like.new_empty((self._recv_pos[key].numel(), width))
            pending[key] = (self.transport.irecv(buf, key[0], tag), buf)

    def _wait(self, layer: int, keys: frozenset[tuple[int, int]] | None) -> None:
        """Wait for the messages ``keys`` of ``layer`` (all when None) and put
        their rows in the halo buffer."""
        pending = self._pending_recv.get(layer, {})
        wanted = list(pending) if keys is None else [k for k in keys if k in pending]
        if not wanted:
            return
        # Written past autograd: the buffer is the output of HaloRows, and each
        # row is written once, before any bin reads it.
        halo = self._halo[layer].data

        def wait() -> None:
            for key in wanted:
                work, buf = pending.pop(key)
                work.wait()
                halo[self._recv_pos[key]] = buf

        self.timed(wait)

    def _send_bin(self, layer: int, b: int, values: torch.Tensor, local: bool) -> None:
        """Send every peer the rows of bin ``b`` it needs at ``layer``.

        ``values`` holds either all owned rows (``local=False``) or only bin
        ``b``'s rows in bin order (``local=True``).
        """
        tag = f"{self.phase}fwd.L{layer}"
        for peer, chunks in enumerate(self._send_rows):
            for chunk_bin, rows, in_bin in chunks:
                if chunk_bin == b:
                    payload = values.index_select(0, in_bin if local else rows)
                    self._sends.append(self.transport.isend(payload, peer, tag))

    def _finish_rows(
        self, layer: int, out: torch.Tensor, rows: torch.Tensor
    ) -> torch.Tensor:
        """Layer ``layer``'s output rows as layer ``layer + 1`` consumes them."""
        assert self._begin is not None
        activation, p, seed, training = self._begin
        h = activation(out.detach())
        if training:
            assert seed is not None
            ids = self.part.orig_nid[rows]
            h = hashed_dropout(h, p, ids, derive_seed(seed, layer + 1))
        return h

    def run_layer(
        self, index: int, layer: nn.Module, mg: MessageGraph, h: torch.Tensor
    ) -> torch.Tensor:
        if self._begin is None:
            raise RuntimeError("g3: begin(model, dropout_seed) must precede forward")
        pipelined = self.mode in ("full", "inter")
        eager = self.mode in ("full", "intra")
        if index == 0 and self.cache_input:
            halo = self.cached_input_halo()  # nothing to send or wait for
        else:
            self._post_recvs(index, h.shape[1], h)
            if index == 0 or not pipelined:
                detached = h.detach()
                for b in range(len(self.bins)):
                    self._send_bin(index, b, detached, local=False)
            halo = HaloRows.apply(h, self, index)
        if not eager:
            self._wait(index, None)
        send_next = pipelined and index < self.num_layers - 1
        outputs = []
        for b, bin_ in enumerate(self.bins):
            if eager and bin_.needs:
                self._wait(index, bin_.needs)
            h_src = h.index_select(0, bin_.src_owned)
            if bin_.src_halo.numel():
                h_src = torch.cat([h_src, halo.index_select(0, bin_.src_halo)])
            out = layer(bin_.mg, h_src)
            outputs.append(out)
            if send_next:
                self._post_recvs(index + 1, out.shape[1], out)
                if b in self._bins_sent:
                    rows = self._finish_rows(index, out, bin_.rows)
                    self._send_bin(index + 1, b, rows, local=True)
        self._wait(index, None)
        self.timed(self._drain_sends)
        result = torch.cat(outputs).index_select(0, self._inverse)
        if not self._uses_halo:
            # Every rank must run every backward exchange: keep this rank's
            # (empty) halo in the graph so its backward runs too.
            result = result + halo.sum() * 0.0
        return result

    def _drain_sends(self) -> None:
        for work in self._sends:
            work.wait()
        self._sends.clear()


class HaloRows(torch.autograd.Function):
    """``h_owned -> halo rows`` of one layer, filled as messages land.

    Forward returns the layer's halo buffer (rows arrive later, each before a
    bin reads it). Backward sends the halo rows' gradients to their owners in
    one exchange and returns the owned rows' share of them.
    """

    @staticmethod
    def forward(  # type: ignore[override]
        ctx: Any, h_owned: torch.Tensor, engine: P2PEngine, layer: int
    ) -> torch.Tensor:
        ctx.engine, ctx.layer = engine, layer
        return engine._halo[layer]

    @staticmethod
    def backward(  # type: ignore[override]
        ctx: Any, grad_halo: torch.Tensor
    ) -> tuple[torch.Tensor, None, None]:
        engine: P2PEngine = ctx.engine
        tag = f"{engine.phase}bwd.L{ctx.layer}"
        grad = engine.timed(
            lambda: engine.plan.scatter_grad(
                grad_halo.contiguous(), engine.transport, tag
            )
        )
        return grad, None, None
