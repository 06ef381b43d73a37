"""`BroadcastEngine` (``--exchange broadcast``): SANCUS's block-row training.

Rank ``i`` of ``P`` owns the block of rows ``H_i`` of its part's global ID
range (any partitioner: parts own consecutive global IDs). Per layer, the
ranks broadcast their blocks in turn, root ``0`` to ``P - 1`` (CAGNET's 1D
algorithm, ``torch.distributed.broadcast``), and each computes
``T_i = sum_j A_ij H_j`` for its own rows. A receiver keeps of each block
only the rows its edges read (its halo rows), so a layer runs on the part's
usual local rows (float [n_i + num_halo, F]: its own block, then the halo
rows of every other, as received or cached). With
``--staleness`` (:mod:`graphwire.fullgraph.staleness`) an owner whose block is
within the bound skips its broadcast and every rank uses the copy it cached
when the block was last sent (SANCUS's Skip-Broadcast); the flags and caches
are kept per (layer, root).

Backward is the broadcast's adjoint: each rank's gradient of every other
block (zeros but its halo rows) is summed block by block at the block's owner,
one ``torch.distributed.reduce`` per root in the same order, every epoch,
never skipped. (SANCUS broadcasts the gradient blocks ``G_i`` and lets every
rank multiply by the transposed adjacency it holds, which works for GCN's
fixed ``A``; the reduce moves blocks of the same shape and also serves GAT,
whose attention makes ``A`` depend on ``H``.) Optionally each rank clips the
gradient it sends to the norm ``th_i = sqrt(P) * th`` (``--grad-clip``;
``--grad-clip-scale`` picks the scaling). Weight gradients are all-reduced
(``sync.grad``); ``--grad-staleness K`` is SANCUS's SkipG baseline: the
all-reduced gradient is reused for ``K`` epochs after each sum, and those
epochs send no gradients at all (neither blocks nor weights).

Tags: ``fwd.L{l}`` (broadcasts), ``bwd.L{l}`` (reduces), ``flags.L{l}``
(``gap``'s decisions: one byte from each owner to each peer), ``sync.grad``.
The input layer's rows never change: with ``cache_input`` (the default) it
reads its halo rows fetched once at set-up, as every engine does, and the
broadcasts start at layer 1. Layers that project first exchange projected
rows, as :class:`~graphwire.fullgraph.halo.HaloEngine` does.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from graphwire.fullgraph.base import Engine
from graphwire.fullgraph.staleness import (
    Staleness,
    StalenessSpec,
    check_staleness,
    staleness_norm_option,
    staleness_option,
)
from graphwire.nn.base import MessageGraph
from graphwire.options import check_options, option
from graphwire.run.collective import sync_gradients
from graphwire.run.local_graph import local_message_graph

__all__ = ["BlockBroadcast", "BroadcastConfig", "BroadcastEngine"]

CLIP_SCALES = ("sqrt", "inv-sqrt", "none")


@dataclass(frozen=True, kw_only=True, slots=True)
class BroadcastConfig:
    """The broadcast engine's settings (see :mod:`graphwire.fullgraph.broadcast`).

    Attributes:
        staleness: the embedding staleness bound (``none``, ``epoch:K``,
            ``adaptive:K``, ``gap:X``).
        staleness_norm: how ``gap`` measures a block's move.
        grad_staleness: SkipG: epochs an all-reduced gradient is reused (None:
            summed every epoch).
        grad_clip: the clipping threshold ``th`` of the gradient each rank
            sends back (None: no clipping).
        grad_clip_scale: ``th_i`` from ``th``: ``sqrt`` (``sqrt(P) * th``, as
            SANCUS), ``inv-sqrt`` (``th / sqrt(P)``) or ``none`` (``th``).
    """

    staleness: str = staleness_option()
    staleness_norm: str = staleness_norm_option()
    grad_staleness: int | None = option(
        None,
        flag="--grad-staleness",
        least=0,
        help="SkipG baseline: reuse the summed gradient for K epochs, sending no "
        "gradients in them (unset: sum every epoch)",
    )
    grad_clip: float | None = option(
        None,
        least=0,
        strict=True,
        help="clip the gradient block each rank sends back to norm th_i "
        "(unset: no clipping)",
    )
    grad_clip_scale: str = option(
        "sqrt",
        choices=CLIP_SCALES,
        help="th_i from --grad-clip th: sqrt(P)*th (SANCUS), th/sqrt(P), or th",
    )

    def __post_init__(self) -> None:
        check_options(self)
        check_staleness(self.staleness)

    @property
    def spec(self) -> StalenessSpec:
        return StalenessSpec.parse(self.staleness)


class BlockBroadcast(torch.autograd.Function):
    """``h_own [n_i, *S] -> h_local [n_i + num_halo, *S]``: owned rows, then
    the halo rows of every other rank's block of one layer.

    Forward: the blocks broadcast (or cached) by :meth:`BroadcastEngine.gather`.
    Backward: each block's gradient summed at its owner
    (:meth:`BroadcastEngine.scatter_grad`)."""

    @staticmethod
    def forward(  # type: ignore[override]
        ctx: Any, h_own: torch.Tensor, engine: BroadcastEngine, layer: int
    ) -> torch.Tensor:
        ctx.engine, ctx.layer = engine, layer
        return engine.gather(layer, h_own.detach())

    @staticmethod
    def backward(  # type: ignore[override]
        ctx: Any, grad: torch.Tensor
    ) -> tuple[torch.Tensor, None, None]:
        return ctx.engine.scatter_grad(ctx.layer, grad), None, None


class BroadcastEngine(Engine):
    """Block-row broadcasts per layer, with Skip-Broadcast (module docstring).

    Attributes:
        staleness: the stamps and decisions of the blocks (keys ``(layer,
            root)``).
        cache: ``(layer, root) -> float [rows, *S]``, the rows this rank reads
            of each other rank's block as last broadcast (with ``--staleness``
            other than none).
    """

    config_type = BroadcastConfig

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        part, transport = self.part, self.transport
        config: BroadcastConfig = self.config
        self.offsets = part.offsets.to(torch.int64).tolist()
        self._mg = local_message_graph(part, self.plan, transport, self.kind)
        # Where each root's block lands: the halo positions its rows fill and
        # their rows within the block (a rank keeps only the rows it reads).
        n = part.num_owned
        halo_gid = part.local_to_global(torch.arange(n, part.num_local))
        owner = part.book.owner(halo_gid) if halo_gid.numel() else halo_gid
        self._halo_pos: list[torch.Tensor] = []
        self._block_row: list[torch.Tensor] = []
        for root in range(transport.world_size):
            pos = (owner == root).nonzero().flatten()
            self._halo_pos.append(pos)
            self._block_row.append(halo_gid[pos] - self.offsets[root])
        # Every rank's halo size, for the cache each rank holds (printed).
        self._halo_sizes = transport.all_gather_object(part.num_halo, "setup.plan")
        # The input layer reads its halo rows fetched once (cache_input).
        self.first = 1 if self.cache_input else 0
        self.staleness = Staleness(
            config.spec, config.staleness_norm, world_size=transport.world_size
        )
        self.cache: dict[tuple[int, int], torch.Tensor] = {}
        self._sent: dict[int, torch.Tensor] = {}  # gap: this rank's last-sent blocks
        self.epoch = 0
        self._skip_grads = False
        self._grads: list[torch.Tensor] | None = None  # SkipG: the last sum
        self._grad_epoch = -1
        self._used: dict[tuple[int, int], tuple[bool, int]] = {}

    @property
    def mgs(self) -> list[MessageGraph]:
        return [self._mg] * self.num_layers

    # ----------------------------------------------------------------- epochs
    def begin_epoch(self, epoch: int) -> None:
        """Called before the epoch's training forward (not before evaluation)."""
        self.epoch = epoch
        self._used = {}
        skip = self.config.grad_staleness
        self._skip_grads = (
            skip is not None
            and self._grad_epoch >= 0
            and epoch - self._grad_epoch <= skip
        )

    def end_epoch(self) -> dict[str, Any]:
        """After the epoch: ``adaptive``'s checks; the epoch's staleness report.

        Returns ``{"staleness": {"skipped": [[rank, layer], ...], "age":
        [[age per root] per exchanged layer], "cache_bytes": [per rank],
        "first_layer": the first exchanged layer}, "grad_skipped": bool}``.
        """
        world = self.transport.world_size
        used = self._used
        self.staleness.end_epoch(self.epoch, [(key, key[1]) for key in used])
        skipped = [
            [root, layer] for (layer, root), (sent, _) in used.items() if not sent
        ]
        age = [
            [used[(layer, r)][1] if (layer, r) in used else 0 for r in range(world)]
            for layer in range(self.first, self.num_layers)
        ]
        return {
            "staleness": {
                "skipped": sorted(skipped, key=lambda rl: (rl[1], rl[0])),
                "age": age,
                "cache_bytes": self.cache_bytes(),
                "first_layer": self.first,
            },
            "grad_skipped": self._skip_grads,
        }

    def cache_bytes(self) -> list[int]:
        """Bytes each rank's cache holds: per cached layer, the halo rows it
        reads of the other blocks."""
        row_bytes = {
            layer: math.prod(rows.shape[1:]) * rows.element_size()
            for (layer, _), rows in self.cache.items()
        }
        per_row = sum(row_bytes.values())
        return [per_row * num_halo for num_halo in self._halo_sizes]

    # -------------------------------------------------------------- exchange
    def gather(self, layer: int, own: torch.Tensor) -> torch.Tensor:
        """``float [n + num_halo, *S]``: ``own``, then the halo rows of layer
        ``layer`` from every root's broadcast block (or from the cache)."""
        transport, n = self.transport, own.shape[0]
        training = self.phase == "" and self._training
        active = self._active(layer, own) if training else None
        local = own.new_empty((n + self.plan.num_halo, *own.shape[1:]))
        local[:n] = own
        halo = local[n:]
        for root in range(transport.world_size):
            key, mine = (layer, root), root == transport.rank
            if active is not None and not active[root]:  # Skip-Broadcast
                self._used[key] = (False, self.staleness.age(key, self.epoch))
                if not mine:
                    halo[self._halo_pos[root]] = self.cache[key]
                continue
            rows = self.offsets[root + 1] - self.offsets[root]
            block = own.contiguous() if mine else own.new_empty((rows, *own.shape[1:]))
            start = time.perf_counter()
            transport.broadcast(block, root, self._tag("fwd", layer))
            self.comm_s += time.perf_counter() - start
            read = block if mine else block.index_select(0, self._block_row[root])
            if not mine:
                halo[self._halo_pos[root]] = read
            if training:
                self._mark_sent(key, read)
        return local

    def _mark_sent(self, key: tuple[int, int], rows: torch.Tensor) -> None:
        """Stamp a broadcast block and keep the copy staleness needs: the rows
        of a peer's block this rank reads (the cache), or this rank's own
        block (``gap`` measures its moves from it)."""
        self.staleness.sent(key, self.epoch)
        self._used[key] = (True, 0)
        layer, root = key
        if root != self.transport.rank and self.staleness.spec.skips:
            self.cache[key] = rows
        elif root == self.transport.rank and self.staleness.spec.kind == "gap":
            self._sent[layer] = rows.clone()

    def _active(self, layer: int, own: torch.Tensor) -> list[bool]:
        """Which roots broadcast layer ``layer`` this epoch; the same on every rank.

        ``gap`` is the owner's call: each rank's flag goes to every peer (one
        byte each, tag ``flags.L{layer}``)."""
        world, rank = self.transport.world_size, self.transport.rank
        rule = self.staleness
        active = [rule.must_send((layer, r), self.epoch, r) for r in range(world)]
        if rule.spec.kind != "gap" or all(active):  # (all: epoch 0, no copies yet)
            return active
        mine = active[rank] or rule.moved(own, self._sent[layer])
        flag = torch.tensor([mine], dtype=torch.uint8)
        tag = f"flags.L{layer}"
        flags = self.timed(
            lambda: self.transport.all_to_all([flag] * world, [1] * world, tag)
        )
        return [bool(f[0]) for f in flags]

    def scatter_grad(self, layer: int, grad: torch.Tensor) -> torch.Tensor:
        """``float [n, *S]``: the gradient of this rank's block, summed over ranks.

        ``grad`` is ``[n + num_halo, *S]``; each root's block of it (zeros but
        the rows this rank read) is summed at the root."""
        transport, n = self.transport, self.part.num_owned
        if self._skip_grads:  # SkipG: no gradient leaves this rank
            return grad[:n]
        grad = self._clipped(grad)
        mine = grad[:n].contiguous()
        start = time.perf_counter()
        for root in range(transport.world_size):
            if root == transport.rank:
                block = mine
            else:
                rows = self.offsets[root + 1] - self.offsets[root]
                block = grad.new_zeros((rows, *grad.shape[1:]))
                block[self._block_row[root]] = grad[n + self._halo_pos[root]]
            summed = transport.reduce_sum(block, root, self._tag("bwd", layer))
            if summed is not None:
                mine = summed
        self.comm_s += time.perf_counter() - start
        return mine

    def _clipped(self, grad: torch.Tensor) -> torch.Tensor:
        """``grad`` scaled to norm ``th_i`` if above it (``--grad-clip``)."""
        th = self.config.grad_clip
        if th is None:
            return grad
        world = self.transport.world_size
        scale = {
            "sqrt": math.sqrt(world),
            "inv-sqrt": 1 / math.sqrt(world),
            "none": 1.0,
        }
        limit = th * scale[self.config.grad_clip_scale]
        norm = float(torch.linalg.vector_norm(grad))
        return grad * (limit / norm) if norm > limit else grad

    def _tag(self, way: str, layer: int) -> str:
        return f"{self.phase}{way}.L{layer}"

    # ----------------------------------------------------------------- layers
    def fetch(self, index: int, h: torch.Tensor) -> torch.Tensor:
        """``[n + num_halo, *S]``: the layer's source rows, owned then halo."""
        if index < self.first:
            return self.with_input_halo(h)
        out: torch.Tensor = BlockBroadcast.apply(h, self, index)
        return out

    def run_layer(
        self, index: int, layer: nn.Module, mg: MessageGraph, h: torch.Tensor
    ) -> torch.Tensor:
        ids = self.local_orig_nid
        assert ids is not None
        projected = self.exchanged_projection(index, layer)
        if projected is None:
            return self.call_layer(index, layer, mg, self.fetch(index, h), ids)
        m_src = self.fetch(index, projected.project(h))
        return self.call_propagate(index, projected, mg, m_src, h, ids)

    # -------------------------------------------------------------- gradients
    def sync_gradients(self, model: nn.Module) -> None:
        """The weight gradients' sum (``sync.grad``); under SkipG, the last sum
        reused while it is within ``--grad-staleness`` epochs."""
        params = [p for p in model.parameters() if p.requires_grad]
        if self._skip_grads and self._grads is not None:
            for p, g in zip(params, self._grads, strict=True):
                p.grad = g.clone()
            return
        sync_gradients(model, self.transport)
        if self.config.grad_staleness is not None:
            self._grads = [
                torch.zeros_like(p) if p.grad is None else p.grad.clone()
                for p in params
            ]
            self._grad_epoch = self.epoch

    # ------------------------------------------------------------- checkpoint
    def state_dict(self) -> dict[str, Any]:
        return {
            "staleness": self.staleness.state_dict(),
            "cache": dict(self.cache),
            "sent": dict(self._sent),
            "grads": self._grads,
            "grad_epoch": self._grad_epoch,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.staleness.load_state_dict(state["staleness"])
        self.cache = dict(state["cache"])
        self._sent = dict(state["sent"])
        self._grads = state["grads"]
        self._grad_epoch = int(state["grad_epoch"])
