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
- **Backward in reverse bins.** Each layer is one autograd node
  (:class:`BinnedLayer`) that keeps every bin's graph. Its backward walks the
  bins in reverse: the bins that read halo rows first, after which each halo
  row's gradient is complete and goes to its owner (``isend``, tag
  ``bwd.L{l}``), then the bins that read only owned rows while those
  gradients are in flight. Parameter gradients accumulate bin by bin.
- **Last layer.** Its output goes to no peer, so it runs in two bins (rows
  without and with halo inputs): smaller bins would only repeat work, since a
  bin transforms all of its source rows.

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
        local_bins, halo_bins = (
            [
                self._bin(rows, degrees)
                for rows in torch.split(group, self.bin_rows)
                if rows.numel()
            ]
            for group in groups
        )
        self._num_local_bins = len(local_bins)  # bins of rows with no halo input
        # The last layer's output goes to no peer, so small bins there would
        # only repeat work (each bin transforms all its source rows): it runs
        # in two, the rows without halo inputs and the rows with them.
        self._last_bins = [
            self._bin(group, degrees) for group in groups if group.numel()
        ]
        bins = local_bins + halo_bins
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
        self._last_bins = [
            _Bin(b.rows, b.mg, b.src_owned, b.src_halo, frozenset(keys))
            if b.src_halo.numel()
            else b
            for b in self._last_bins
        ]
        self._bins_sent = {b for chunks in self._send_rows for b, _, _ in chunks}
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
        # Each row is written once, before any bin reads it; the buffer is
        # outside autograd (each bin's graph starts from its gathered rows).
        halo = self._halo[layer]

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
        params = tuple(p for p in layer.parameters() if p.requires_grad)
        track = torch.is_grad_enabled()
        needs_grad = track and h.requires_grad
        out: torch.Tensor = BinnedLayer.apply(
            h, self, index, layer, (track, needs_grad), *params
        )
        return out

    def _bin_order(self, index: int) -> list[tuple[int, _Bin]]:
        """The bins of layer ``index`` in forward order, with their indices.

        A layer whose halo rows are already here (the cached input layer)
        computes the rows peers need first, so their sends start early; any
        other layer computes the bins that need no halo rows first, while the
        halo rows are in flight (eager computation). The last layer runs in
        two bins (see ``_make_bins``).
        """
        if index == self.num_layers - 1:
            return list(enumerate(self._last_bins))
        bins = list(enumerate(self.bins))
        local, halo = bins[: self._num_local_bins], bins[self._num_local_bins :]
        return halo + local if index == 0 and self.cache_input else local + halo

    def _forward_bins(
        self,
        index: int,
        layer: nn.Module,
        h: torch.Tensor,
        track: bool,
        needs_grad: bool,
    ) -> tuple[torch.Tensor, list[tuple[_Bin, torch.Tensor, torch.Tensor]]]:
        """Layer ``index`` in bins; the sends of the next layer's rows overlap.

        Returns the owned output rows and, when ``track``, each bin's
        ``(bin, source leaf, output)`` autograd graph for :meth:`_backward_bins`
        (the source leaf requires grad when ``needs_grad``).
        """
        pipelined = self.mode in ("full", "inter")
        eager = self.mode in ("full", "intra")
        if index == 0 and self.cache_input:
            halo = self.cached_input_halo()  # nothing to send or wait for
        else:
            self._post_recvs(index, h.shape[1], h)
            if index == 0 or not pipelined:
                for b in range(len(self.bins)):
                    self._send_bin(index, b, h, local=False)
            halo = self._halo[index]
        if not eager:
            self._wait(index, None)
        send_next = pipelined and index < self.num_layers - 1
        graphs: list[tuple[_Bin, torch.Tensor, torch.Tensor]] = []
        out: torch.Tensor | None = None
        for b, bin_ in self._bin_order(index):
            if eager and bin_.needs:
                self._wait(index, bin_.needs)
            h_src = h.index_select(0, bin_.src_owned)
            if bin_.src_halo.numel():
                h_src = torch.cat([h_src, halo.index_select(0, bin_.src_halo)])
            with torch.set_grad_enabled(track):
                h_src = h_src.requires_grad_(needs_grad)
                out_b = layer(bin_.mg, h_src)
            if track:
                graphs.append((bin_, h_src, out_b))
            if out is None:
                out = out_b.new_empty((self.part.num_owned, out_b.shape[1]))
            out[bin_.rows] = out_b.detach()
            if send_next:
                self._post_recvs(index + 1, out_b.shape[1], out_b)
                if b in self._bins_sent:
                    rows = self._finish_rows(index, out_b, bin_.rows)
                    self._send_bin(index + 1, b, rows, local=True)
        self._wait(index, None)
        if index == self.num_layers - 1 or not pipelined:
            # Pipelined sends of the next layer's rows stay in flight while it
            # computes; every send is complete before the forward returns.
            self.timed(self._drain_sends)
        assert out is not None
        return out, graphs

    def _backward_bins(
        self,
        index: int,
        graphs: list[tuple[_Bin, torch.Tensor, torch.Tensor]],
        grad_out: torch.Tensor,
        needs_input_grad: bool,
    ) -> torch.Tensor | None:
        """Backward of layer ``index``, bins in reverse: G3's backward pipeline.

        Bins that read halo rows go first; once they are done every halo row's
        gradient is complete and goes to its owner (``isend``, tag
        ``bwd.L{index}``) while the bins that read only owned rows run their
        backward. Parameter gradients accumulate in ``.grad`` as each bin's
        graph is walked. Returns the owned rows' gradient (own bins' share plus
        what peers returned, summed in rank order), or None for the input layer.
        """
        halo_bins = [g for g in graphs if g[0].src_halo.numel()]
        local_bins = [g for g in graphs if not g[0].src_halo.numel()]
        if not needs_input_grad:  # parameter gradients only, nothing to send
            for bin_, _, out_b in [*reversed(halo_bins), *reversed(local_bins)]:
                torch.autograd.backward(out_b, grad_out.index_select(0, bin_.rows))
            return None
        width = graphs[0][1].shape[1]
        grad_owned = grad_out.new_zeros((self.part.num_owned, width))
        grad_halo = grad_out.new_zeros((self.plan.num_halo, width))
        tag = f"{self.phase}bwd.L{index}"

        def walk(group: list[tuple[_Bin, torch.Tensor, torch.Tensor]]) -> None:
            for bin_, h_src, out_b in reversed(group):
                torch.autograd.backward(out_b, grad_out.index_select(0, bin_.rows))
                if h_src.grad is None:
                    continue
                num_owned = bin_.src_owned.numel()
                grad_owned.index_add_(0, bin_.src_owned, h_src.grad[:num_owned])
                if bin_.src_halo.numel():
                    grad_halo.index_add_(0, bin_.src_halo, h_src.grad[num_owned:])

        walk(halo_bins)
        plan, transport = self.plan, self.transport
        sends = [
            transport.isend(grad_halo.index_select(0, idx).contiguous(), peer, tag)
            for peer, idx in enumerate(plan.recv_idx)
            if peer != transport.rank and idx.numel()
        ]
        received: list[tuple[int, Work, torch.Tensor]] = []
        for peer, idx in enumerate(plan.send_idx):
            if peer != transport.rank and idx.numel():
                buf = grad_out.new_empty((idx.numel(), width))
                received.append((peer, transport.irecv(buf, peer, tag), buf))
        walk(local_bins)  # overlaps the gradients in flight

        def collect() -> None:
            for peer, work, buf in received:  # rank order: deterministic sums
                work.wait()
                grad_owned.index_add_(0, plan.send_idx[peer], buf)
            for work in sends:
                work.wait()

        self.timed(collect)
        return grad_owned

    def _drain_sends(self) -> None:
        for work in self._sends:
            work.wait()
        self._sends.clear()


class BinnedLayer(torch.autograd.Function):
    """``h_owned -> layer output of the owned rows``, computed in G3's bins.

    Forward runs :meth:`P2PEngine._forward_bins` (halo rows arrive through the
    engine's messages; each bin's autograd graph starts from its own source
    rows). Backward runs :meth:`P2PEngine._backward_bins`: the bins' graphs in
    reverse order, sending halo gradients to their owners as soon as they are
    complete. The layer's parameters are inputs only so that the output
    requires grad; their gradients accumulate through the bins' graphs.
    """

    @staticmethod
    def forward(  # type: ignore[override]
        ctx: Any,
        h: torch.Tensor,
        engine: P2PEngine,
        index: int,
        layer: nn.Module,
        flags: tuple[bool, bool],
        *params: torch.Tensor,
    ) -> torch.Tensor:
        out, graphs = engine._forward_bins(index, layer, h.detach(), *flags)
        ctx.engine, ctx.index, ctx.graphs = engine, index, graphs
        ctx.num_params = len(params)
        return out

    @staticmethod
    def backward(  # type: ignore[override]
        ctx: Any, grad_out: torch.Tensor
    ) -> tuple[torch.Tensor | None, ...]:
        engine: P2PEngine = ctx.engine
        graphs, ctx.graphs = ctx.graphs, None  # free the bins' graphs after use
        if not graphs:
            raise RuntimeError("g3: backward through a layer run without grad")
        grad = engine._backward_bins(
            ctx.index, graphs, grad_out.contiguous(), ctx.needs_input_grad[0]
        )
        return (grad, None, None, None, None, *([None] * ctx.num_params))
