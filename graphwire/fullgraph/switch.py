"""`SwitchEngine` (``--exchange switch``): SwitchGNN's in-network aggregation.

Every boundary row goes once to a switch process
(:mod:`graphwire.comm.switch`), which multicasts it into the aggregators of
the rows that read it and returns each finished sum to its owner. A layer
``finish(A m, h)`` (GCN: ``Â(hW) + b``; GraphSAGE: the neighbour mean, then
the root term) splits its weighted sum: the edges inside the part on the
host, the inter-worker edges through the switch. The switch only sums, so
each inter-worker weight is split into a source scale and a destination
scale, ``w_uv = pre(u) * post(v)``: GCN's ``1/sqrt(out_deg(u)) *
1/sqrt(in_deg(v))``, GraphSAGE's ``1 * 1/deg(v)``. The owner of ``u`` sends
``pre(u) m_u``; the owner of ``v`` adds ``post(v)`` times the switch's sum
(one or more partial sums, one per block ``v`` is in, plus any raw rows it
summed itself) to its local sum. Layers whose weights do not split (GAT's
attention) are refused.

Backward runs the same path reversed: the gradient of each destination's
sum goes up once and the switch sums, into each source, the gradients of
the destinations that read it. A layer that narrows (``projects_first``)
exchanges projected rows; one that widens exchanges its input rows and
projects the sum (``project`` is linear and row-wise, so the two agree).
The input layer reads the halo's input rows fetched once at set-up, as every
engine does, so the switch carries layers ``1..L-1``.

Set-up (collective): rank 0 starts the switch (``graphwire switch``) unless
``--switch-addr`` names a running one, gathers the inter-worker edges,
builds one :class:`~graphwire.comm.switch.plan.SwitchPlan` per exchanged row
width (blocks that fit the aggregator pool for that width, send orders)
and sends the switch its match tables; every worker takes its part of each
block. Per epoch the record's ``extra["switch"]`` holds each worker's link
bytes, the switch's counters (occupancy, rows aggregated and raw, bypasses,
drops, ECN marks) and each worker's retransmissions and fetches.
"""

from __future__ import annotations

import subprocess
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch import nn

from graphwire.comm.switch.exchange import PassCounters, block_views, run_pass
from graphwire.comm.switch.frames import Frame, Kind
from graphwire.comm.switch.link import SwitchLink
from graphwire.comm.switch.plan import BLOCKINGS, ORDERS, SwitchPlan, build_plan
from graphwire.comm.switch.server import parse_address, start_switch
from graphwire.fullgraph.base import Engine
from graphwire.nn.aggregate import spmm_sum
from graphwire.nn.base import MessageGraph
from graphwire.nn.models import projects_first
from graphwire.options import OptionError, check_options, option
from graphwire.run.local_graph import global_out_degrees, local_message_graph

__all__ = ["SwitchConfig", "SwitchEngine", "SwitchSum"]

MIB = 1 << 20


@dataclass(frozen=True, kw_only=True, slots=True)
class SwitchConfig:
    """The switch engine's settings (see :mod:`graphwire.fullgraph.switch`).

    Attributes:
        switch_mb: the switch's aggregator memory in MiB (0: unlimited).
        switch_order: send order within a block (``gamr`` or ``random``).
        switch_blocks: ``multilevel`` (blocks that fit the memory) or
            ``none`` (one block; what does not fit overflows to the hosts).
        switch_loss: probability that the switch drops a DATA frame.
        switch_timeout: seconds without progress before a worker fetches
            (twice that: resends).
        switch_addr: ``HOST:PORT`` of a running ``graphwire switch`` (None:
            rank 0 starts one on loopback).
        switch_seed: seeds the drops, random orders and METIS.
    """

    switch_mb: float = option(
        10.0,
        least=0,
        help="aggregator memory of the switch in MiB (0: unlimited, Straw-UL)",
    )
    switch_order: str = option(
        "gamr", choices=ORDERS, help="send order in a block: GAMR or random (Straw)"
    )
    switch_blocks: str = option(
        "multilevel",
        choices=BLOCKINGS,
        help="multi-level blocks that fit the memory, or none (Straw: overflow)",
    )
    switch_loss: float = option(
        0.0, least=0, most=0.5, help="probability the switch drops a data frame"
    )
    switch_timeout: float = option(
        1.0,
        least=0,
        strict=True,
        help="seconds without progress before a worker fetches (2x: resends); "
        "doubled at each timeout within a block",
    )
    switch_addr: str | None = option(
        None,
        help="HOST:PORT of a running `graphwire switch` (unset: rank 0 starts "
        "one on 127.0.0.1)",
    )
    switch_seed: int = option(0, least=0, help="seeds drops, random orders, METIS")

    def __post_init__(self) -> None:
        check_options(self)
        if self.switch_addr is not None:
            try:
                parse_address(self.switch_addr)
            except ValueError as error:
                raise OptionError("switch_addr", str(error)) from None

    @property
    def mem_bytes(self) -> int:
        return int(self.switch_mb * MIB)


class SwitchSum(torch.autograd.Function):
    """``m [n, F] -> s [n, F]``: each owned row's sum of its remote sources'
    rows, through the switch; backward: the reversed sums."""

    @staticmethod
    def forward(  # type: ignore[override]
        ctx: Any, m: torch.Tensor, engine: SwitchEngine, layer: int
    ) -> torch.Tensor:
        ctx.engine, ctx.layer = engine, layer
        return engine.switch_pass(layer, m.detach(), backward=False)

    @staticmethod
    def backward(  # type: ignore[override]
        ctx: Any, grad: torch.Tensor
    ) -> tuple[torch.Tensor, None, None]:
        return ctx.engine.switch_pass(ctx.layer, grad, backward=True), None, None


class SwitchEngine(Engine):
    """In-network aggregation through an emulated switch (module docstring).

    Attributes:
        plans: the plan of each exchanged row width (rank 0's only: the
            other ranks keep their views of the blocks).
        link: this worker's connection to the switch.
    """

    config_type = SwitchConfig
    models = ("gcn", "sage")  # sums the switch can do; GAT's attention is not one

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        part, transport = self.part, self.transport
        config: SwitchConfig = self.config
        n = part.num_owned
        self.offsets = part.offsets.to(torch.int64).numpy()
        self._mg = local_message_graph(part, self.plan, transport, self.kind)
        assert self.local_orig_nid is not None
        self._src_ids = self.local_orig_nid
        self.first = 1 if self.cache_input else 0
        mg = self._mg
        dst = torch.repeat_interleave(torch.arange(n), mg.in_degrees())
        self._remote = mg.indices >= n
        local = ~self._remote
        indptr = torch.zeros(n + 1, dtype=torch.int64)
        torch.cumsum(torch.bincount(dst[local], minlength=n), 0, out=indptr[1:])
        self._local_mg = MessageGraph(indptr, mg.indices[local], n, n)
        gid = part.local_to_global(torch.arange(part.num_local)).to(torch.int64)
        self._edge_src = gid[mg.indices[self._remote]].numpy()
        self._edge_dst = gid[dst[self._remote]].numpy()
        self._remote_dst = dst[self._remote]
        self._dst_of_edge = dst
        self._remote_src = mg.indices[self._remote]
        # Source scales: GCN's 1/sqrt(out_deg), owned rows then halo rows.
        if self.kind.gcn_weights:
            out_deg = global_out_degrees(part, self.plan, transport, mg.indices)
            self._pre = out_deg.clamp(min=1).to(torch.float32).rsqrt()
        else:
            self._pre = torch.ones(part.num_local, dtype=torch.float32)
        self._process: subprocess.Popen[str] | None = None
        # How long rank 0's close waits for the switch it started to end
        # (the simulator's capture waits longer: its switch writes a trace).
        self.close_timeout_s = 10.0
        address = config.switch_addr
        if address is None and transport.rank == 0:
            self._process, address = start_switch()
        address = transport.all_gather_object(address, "setup.switch")[0]
        switch_config = None
        if transport.rank == 0:
            switch_config = {
                "offsets": self.offsets.tolist(),
                "mem_bytes": config.mem_bytes,
                "loss": config.switch_loss,
                "seed": config.switch_seed,
            }
        self.link = SwitchLink(
            address,
            transport.rank,
            transport.world_size,
            transport.ledger,
            transport.timeout_s,
            switch_config,
        )
        self.plans: dict[int, SwitchPlan] = {}
        self._fwd_plan: dict[int, int] = {}  # layer -> plan ID
        self._bwd_plan: dict[int, int] = {}
        self._views: dict[tuple[int, bool], list[Any]] = {}
        self._weights: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}
        self._seq = 0
        self._epoch_seq = 0
        self.passes = PassCounters()
        self._epoch_ledger = (0, 0)

    @property
    def mgs(self) -> list[MessageGraph]:
        return [self._mg] * self.num_layers

    # ---------------------------------------------------------------- set-up
    def prepare(self, model: nn.Module) -> None:
        """Check the layers, split their weights, plan every exchanged width."""
        layers = list(model.layers)  # type: ignore[arg-type]
        widths: dict[int, int] = {}
        for index in range(self.first, self.num_layers):
            layer = layers[index]
            if not getattr(layer, "sums_sources", False):
                raise ValueError(
                    f"exchange 'switch': layer {index} ({type(layer).__name__}) "
                    "does not aggregate by a fixed weighted sum, which is all a "
                    "switch can do; use GCN or GraphSAGE"
                )
            self._weights[index] = self._split_weights(index, layer)
            narrow = projects_first(layer)
            widths[index] = int(layer.message_width if narrow else layer.in_dim)
        self._plan_all(widths)

    def _split_weights(
        self, index: int, layer: nn.Module
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """``(local edge weights, post scale per owned row)`` of layer ``index``.

        Raises:
            ValueError: the layer's inter-worker weights are not ``pre(u) *
                post(v)``."""
        weight = layer.edge_weights(self._mg).detach()  # type: ignore[operator]
        n = self.part.num_owned
        post = torch.zeros(n, dtype=torch.float32)
        remote_w = weight[self._remote]
        ratio = remote_w / self._pre[self._remote_src]
        post[self._remote_dst] = ratio  # any edge's; checked below
        if not torch.allclose(post[self._remote_dst], ratio, rtol=1e-5, atol=1e-7):
            raise ValueError(
                f"exchange 'switch': layer {index}'s edge weights do not split "
                "into a source scale and a destination scale"
            )
        return weight[~self._remote].contiguous(), post

    def _plan_all(self, widths: dict[int, int]) -> None:
        """Collective: the plans of every exchanged layer, forward and back.

        One forward plan per row width; backward, the layer's edges whose
        destination's gradient can be nonzero (:meth:`_gradient_edges`),
        one plan per layer unless that is every edge. Rank 0 builds them
        and sends the switch their tables."""
        plans = self.transport.all_gather_object(
            self._build_plans(widths), "setup.switch"
        )[0]
        assert plans is not None
        self._keep_views(plans)
        del plans  # (see _keep_views)
        self.transport.barrier()  # the switch has every table before any row

    def _build_plans(self, widths: dict[int, int]) -> list[SwitchPlan] | None:
        """Rank 0: the plans (their tables sent to the switch); others: None.

        Collective: every rank's inter-worker edges are gathered."""
        transport, config = self.transport, self.config
        edges = transport.all_gather_object(
            (self._edge_src, self._edge_dst), "setup.switch"
        )
        src = np.concatenate([e[0] for e in edges])
        dst = np.concatenate([e[1] for e in edges])
        keeps = self._gradient_edges(src, dst)
        jobs: list[tuple[int, np.ndarray | None]] = []  # (width, edges kept)
        forward: dict[int, int] = {}
        for width in sorted(set(widths.values())):
            forward[width] = len(jobs)
            jobs.append((width, None))
        for index, width in widths.items():
            self._fwd_plan[index] = forward[width]
            keep = keeps.get(index)
            if keep is None or bool(keep.all()):
                self._bwd_plan[index] = forward[width]
            else:
                self._bwd_plan[index] = len(jobs)
                jobs.append((width, keep))
        plans: list[SwitchPlan] | None = None
        if transport.rank == 0:
            plans = [
                build_plan(
                    src if keep is None else src[keep],
                    dst if keep is None else dst[keep],
                    width,
                    config.mem_bytes,
                    blocking=config.switch_blocks,
                    order=config.switch_order,
                    seed=config.switch_seed,
                )
                for width, keep in jobs
            ]
            self.link.tags("setup.switch", "setup.switch")
            for plan_id, plan in enumerate(plans):
                self._send_tables(plan_id, plan)
        return plans

    def _keep_views(self, plans: list[SwitchPlan]) -> None:
        """This rank's views of every plan's blocks; rank 0 keeps the plans.

        The other ranks keep only their views: a plan holds every
        inter-worker edge, and a hundred in-process ranks (the simulator's)
        each keeping their copy would not fit in memory."""
        rank = self.transport.rank
        for plan_id, plan in enumerate(plans):
            if rank == 0:
                self.plans[plan_id] = plan
            self.counters[f"blocks.plan{plan_id}"] = len(plan.blocks)
            for backward in (False, True):
                self._views[(plan_id, backward)] = block_views(
                    plan.src,
                    plan.dst,
                    plan.blocks,
                    plan.orders,
                    self.offsets,
                    rank,
                    backward=backward,
                )

    def _gradient_edges(
        self, src: np.ndarray, dst: np.ndarray
    ) -> dict[int, np.ndarray | None]:
        """Collective: per exchanged layer, the inter-worker edges ``src ->
        dst`` (global, every rank's) whose destination's gradient can be
        nonzero (None: every edge, without ``loss_rows``).

        As :meth:`~graphwire.fullgraph.base.Engine.grad_plans` for the halo:
        at the output layer the loss rows; a layer below, those rows, the
        rows they read inside the part, and the rows whose gradients come
        back through the switch (one all-gather of the rows per layer, tag
        ``setup.plan.loss``)."""
        layers = range(self.num_layers - 1, self.first - 1, -1)
        if self._outside_loss is None:
            return dict.fromkeys(layers)
        n, base = self.part.num_owned, int(self.offsets[self.transport.rank])
        indices = self._mg.indices
        needed = ~self._outside_loss
        keeps: dict[int, np.ndarray | None] = {}
        for index in layers:
            mine = np.flatnonzero(needed.numpy()) + base
            rows = self.transport.all_gather_object(mine, "setup.plan.loss")
            keep = np.isin(dst, np.concatenate(rows))
            keeps[index] = keep
            below = needed.clone()
            read = indices[needed[self._dst_of_edge] & (indices < n)]
            below[read] = True
            sent = src[keep]
            below[torch.from_numpy(sent[(sent >= base) & (sent < base + n)] - base)] = (
                True
            )
            needed = below
        return keeps

    def plan_of(self, index: int, *, backward: bool) -> SwitchPlan:
        """The plan of layer ``index``'s forward or backward passes (rank 0)."""
        return self.plans[(self._bwd_plan if backward else self._fwd_plan)[index]]

    def _send_tables(self, plan_id: int, plan: SwitchPlan) -> None:
        if not plan.blocks:
            return
        for block, edges in enumerate(plan.blocks):
            self.link.send(
                Frame(
                    Kind.TABLE,
                    plan=plan_id,
                    seq=len(plan.blocks),
                    block=block,
                    ids1=plan.src[edges],
                    ids2=plan.dst[edges],
                    rows=np.zeros((0, plan.width), dtype=np.float32),
                )
            )
        self.link.wait_for(Kind.READY)

    # ----------------------------------------------------------------- layers
    def switch_pass(
        self, index: int, m: torch.Tensor, *, backward: bool
    ) -> torch.Tensor:
        """Layer ``index``'s remote sums of ``m`` [n, F] (or its reverse)."""
        plan = (self._bwd_plan if backward else self._fwd_plan)[index]
        views = self._views[(plan, backward)]
        way = "bwd" if backward else "fwd"
        seq = self._seq
        self._seq += 1
        self.link.tags(
            f"{self.phase}{way}.L{index}", f"{self.phase}switch.L{index}", seq
        )
        x = m.detach().to(torch.float32).contiguous().numpy()
        if not views:
            return torch.zeros_like(m)
        out = self.timed(
            lambda: run_pass(
                self.link,
                views,
                x,
                plan=plan,
                seq=seq,
                backward=backward,
                timeout_s=self.config.switch_timeout,
                counters=self.passes,
            )
        )
        key = f"L{index}"
        self.passes.blocks[key] = len(views)
        return torch.from_numpy(out)

    def run_layer(
        self, index: int, layer: nn.Module, mg: MessageGraph, h: torch.Tensor
    ) -> torch.Tensor:
        if index < self.first:  # the input layer: cached halo rows
            return self.call_layer(
                index, layer, self._mg, self.with_input_halo(h), self._src_ids
            )
        lay: Any = layer
        narrow = projects_first(layer)
        m = lay.project(h) if narrow else h
        local_w, post = self._weights[index]
        agg = spmm_sum(self._local_mg, m, local_w)
        n = self.part.num_owned
        scaled = m * self._pre[:n, None]
        remote: torch.Tensor = SwitchSum.apply(scaled, self, index)
        agg = agg + remote * post[:, None]
        if not narrow:
            agg = lay.project(agg)
        out: torch.Tensor = lay.finish(agg, h)
        if index == self.num_layers - 1 and out.requires_grad:
            out.register_hook(self.check_output_grad)  # (zeros stay home)
        return out

    # ----------------------------------------------------------------- epochs
    def begin_epoch(self, epoch: int) -> None:
        """Zero the epoch's counters; its passes start at ``_seq``."""
        del epoch
        self.passes = PassCounters()
        self._epoch_seq = self._seq
        ledger, peer = self.transport.ledger, self.transport.world_size
        self._epoch_ledger = (
            ledger.bytes_sent(peer=peer),
            ledger.bytes_recv(peer=peer),
        )

    def end_epoch(self) -> dict[str, Any]:
        """The epoch's switch report (collective): ``{"switch": {"up": [bytes
        per rank], "down": [...], "workers": [counters per rank], "core":
        the switch's counters}}``."""
        ledger, peer = self.transport.ledger, self.transport.world_size
        up = ledger.bytes_sent(peer=peer) - self._epoch_ledger[0]
        down = ledger.bytes_recv(peer=peer) - self._epoch_ledger[1]
        core = None
        if self.transport.rank == 0:
            core = self._switch_stats(self._epoch_seq, self._seq)
        mine = {"up": up, "down": down} | self.passes.as_dict()
        gathered = self.transport.all_gather_object((mine, core), "sync.metrics")
        workers = [g[0] for g in gathered]
        return {
            "switch": {
                "up": [w["up"] for w in workers],
                "down": [w["down"] for w in workers],
                "workers": workers,
                "core": gathered[0][1],
            }
        }

    def _switch_stats(self, first: int, end: int) -> dict[str, Any]:
        """The switch's counters of passes ``first..end-1`` (the epoch's
        training); it forgets every pass before ``end``."""
        self.link.tags("switch.stats", "switch.stats")
        self.link.send(Frame(Kind.STATS, seq=first, block=end))
        body: dict[str, Any] = self.link.wait_for(Kind.STATS).body
        return body

    def close(self) -> None:
        """Leave the switch; rank 0 waits for the switch it started to end."""
        self.link.close()
        if self._process is not None:
            try:
                self._process.wait(timeout=self.close_timeout_s)
            except subprocess.TimeoutExpired:
                self._process.kill()
                self._process.wait()
            self._process = None
