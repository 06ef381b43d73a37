"""`G3Backward`: G3's backward, bins in reverse, pipelined across layers.

The engine owns one (:class:`~graphwire.fullgraph.g3.engine.G3Engine`
``backward``); :class:`~graphwire.fullgraph.g3.stack.G3Stack` runs it on the
graphs a forward kept. Per rank, for layer ``l`` (top down): the gradients of
the halo rows it read leave for their owners (``isend``, tag ``bwd.L{l}``,
one message per forward message, each peer's in reverse order) as soon as
the bins (or the sum) that read them are done; only rows whose gradients the
loss can make nonzero (``Engine.grad_plans``). The gradients of the rows it
sent at layer ``l`` come back the same way
(:class:`~graphwire.fullgraph.g3.messages.Returns`), and the layer below's
bins wait only for their own: its bins whose rows no peer read run at once,
each other bin as soon as the messages carrying its rows' gradients are in.
Parameter gradients accumulate bin by bin; once a layer's are complete, the
engine's gradient sync hears of it (:mod:`graphwire.fullgraph.g3.sync`).
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from typing import TYPE_CHECKING, cast

import torch

from graphwire.comm.plan import ExchangePlan
from graphwire.fullgraph.g3.messages import PendingReturns, Returns, plan_returns
from graphwire.fullgraph.g3.stack import StackGraph, SumGraph
from graphwire.fullgraph.g3.sums import MessageSums

if TYPE_CHECKING:
    from graphwire.fullgraph.g3.engine import G3Engine

__all__ = ["G3Backward"]


class G3Backward:
    """G3's backward through the graphs of one forward (module docstring).

    Args:
        engine: the engine whose forwards it runs back (its part, messages,
            wire, the model's layers, summed layers and gradient sync).
        grad_plans: per layer, the plan its halo rows' gradients return
            along (:meth:`~graphwire.fullgraph.base.Engine.grad_plans`).

    Attributes:
        return_rows: per layer, per peer, sender bin -> int64 owned rows whose
            gradients come back from that peer.
        return_pos: per layer, message ``(peer, sender bin)`` -> int64 halo
            positions whose gradients go back in it.
        returning: per layer ``k`` below the last, the bins that hand on rows
            peers read at layer ``k + 1``: their backward waits for those
            rows' gradients to come back.
    """

    def __init__(self, engine: G3Engine, grad_plans: list[ExchangePlan]) -> None:
        self._engine = engine
        self.return_rows, self.return_pos = plan_returns(
            engine.messages, grad_plans, engine.plan, engine.part.num_owned
        )
        self.returning = [
            {b for rows in self.return_rows[k + 1] for b in rows}
            for k in range(engine.num_layers - 1)
        ]

    def run(
        self, graph: StackGraph, grad_out: torch.Tensor, needs_input_grad: bool
    ) -> torch.Tensor | None:
        """The backward of the whole stack, layers top down, bins in reverse.

        Layer by layer (:meth:`walk_layer`): a layer's halo rows' gradients
        leave for their owners as soon as the bins that read halo rows are
        done; the layer below then runs its bins' backward at once where no
        peer read their rows, and the others as their rows' gradients come
        back (:class:`Returns`), so the layers overlap the transfers. Returns
        the input rows' gradient, or None when they need none.
        """
        engine = self._engine
        grads: tuple[torch.Tensor, ...] = (grad_out,)
        returns: Returns | None = None
        for index in reversed(range(engine.num_layers)):
            grads, returns = self.walk_layer(index, graph, grads, returns)
        if returns is not None:
            engine.timed(partial(returns.wait_bin, None))
        grad = grads[0] if grads else None
        if graph.projection is not None:
            assert grad is not None
            torch.autograd.backward(graph.projection, grad)
            self._layer_done(0)
            grad = graph.h0.grad
        engine.wire.drain()
        if not needs_input_grad or grad is None:
            return None
        if len(grads) > 1:
            grad = grad + grads[1]  # the destinations' own rows (SAGE)
        return grad

    def walk_layer(
        self,
        index: int,
        graph: StackGraph,
        out_grads: tuple[torch.Tensor, ...],
        returns: Returns | None,
    ) -> tuple[tuple[torch.Tensor, ...], Returns | None]:
        """Backward of layer ``index``'s bins: G3's backward pipeline.

        ``out_grads`` are the gradients of what the bins handed on (the
        loss's for the last layer; the next layer's source and destination
        rows otherwise, complete for a bin once ``returns`` has its messages).
        Bins that need no returning gradient go first, those that read halo
        rows before the others; then the rest in reverse forward order, each
        after its messages. Once every bin that reads halo rows is done, the
        halo rows' gradients leave (tag ``bwd.L{index}``, one message per
        forward message, in reverse order). Parameter gradients accumulate in
        ``.grad`` bin by bin.

        Returns the gradients of this layer's source rows (and destination
        rows, when a projected layer read them) and their returning messages.
        """
        bins = graph.layers[index]
        if isinstance(bins, SumGraph):
            return self.walk_sums(index, bins, out_grads[0])
        engine = self._engine
        n = engine.part.num_owned
        sends = self._returns(index, graph)
        grad_src = grad_dst = grad_halo = grad_table = None
        if index == 0 and graph.projects_halo:
            # The bins read rows of one projected table: their gradients add
            # up in one, for the projection's backward (run).
            assert graph.projection is not None
            grad_table = graph.projection.new_zeros(graph.projection.shape)
            grad_src, grad_halo = grad_table[:n], grad_table[n:]
        elif bins and bins[0].src.requires_grad:
            grad_src = bins[0].src.new_zeros((n, bins[0].src.shape[1]))
        if bins and bins[0].dst is not None:
            grad_dst = bins[0].dst.new_zeros((n, bins[0].dst.shape[1]))
        mine = None
        if sends:
            width = bins[0].src.shape[1] if bins else self._source_width(index, graph)
            if grad_src is None:
                grad_src = graph.h0.new_zeros((n, width))
            grad_halo = grad_src.new_zeros((engine.plan.num_halo, width))
            mine = Returns(grad_src, self._post_returns(index, grad_src))
        waiting = self.returning[index] if returns is not None else set()
        early = [g for g in reversed(bins) if g.index not in waiting]
        late = [g for g in reversed(bins) if g.index in waiting]
        order = (
            [g for g in early if g.bin.src_halo.numel()]
            + [g for g in early if not g.bin.src_halo.numel()]
            + late
        )
        halo_left = sum(1 for g in bins if g.bin.src_halo.numel())
        if grad_halo is not None and sends and not halo_left:
            self._send_returns(index, grad_halo)
        # Each bin's rows and their gradient are let go of as soon as its
        # backward has run: ``order`` holds the only references left.
        del early, late
        bins.clear()
        order.reverse()
        while order:
            g = order.pop()
            if returns is not None and g.index in waiting:
                engine.timed(partial(returns.wait_bin, g.index))
            rows = g.bin.rows
            torch.autograd.backward(
                list(g.outs), [grad.index_select(0, rows) for grad in out_grads]
            )
            if grad_dst is not None and g.dst is not None and g.dst.grad is not None:
                grad_dst.index_add_(0, rows, g.dst.grad)
            if grad_src is not None and g.src.grad is not None:
                num_owned = g.bin.src_owned.numel()
                grad_src.index_add_(0, g.bin.src_owned, g.src.grad[:num_owned])
                if grad_halo is not None and g.bin.src_halo.numel():
                    grad_halo.index_add_(0, g.bin.src_halo, g.src.grad[num_owned:])
            if g.bin.src_halo.numel():
                halo_left -= 1
                if grad_halo is not None and sends and not halo_left:
                    self._send_returns(index, grad_halo)
            del g
        self._bins_done(index, graph)
        grad_rows = grad_table if grad_table is not None else grad_src
        grads = tuple(t for t in (grad_rows, grad_dst) if t is not None)
        return grads, mine

    def walk_sums(
        self, index: int, summed: SumGraph, grad_out: torch.Tensor
    ) -> tuple[tuple[torch.Tensor, ...], Returns]:
        """Backward of a layer summed message by message: ``finish``'s graph
        gives the sum's gradient, each message's returned rows' gradients
        leave as soon as they are computed (one product each, in reverse send
        order, tag ``bwd.L{index}``), then the rest of ``finish``'s backward
        (SAGE's root term and the parameters) runs while they are in flight,
        then the owned source rows' gradient. Returns that gradient (and the
        destinations' input rows', when ``finish`` read them) and its
        returning messages."""
        # The sum's gradient alone first: the returns need nothing else. As
        # a result, not accumulated into agg.grad (a copy of grad_out for GCN).
        (grad_agg,) = torch.autograd.grad(
            summed.out, summed.agg, grad_out, retain_graph=True
        )
        planned = self._engine.sums[index]
        assert planned is not None
        sums = cast(MessageSums, planned).matrices(grad_agg.dtype)
        pending = self._post_returns(index, grad_agg)
        self._send_each_return(index, partial(sums.returned_grad, grad_agg=grad_agg))
        layer = self._engine.model_layers[index]
        rest: list[torch.Tensor] = [p for p in layer.parameters() if p.requires_grad]
        if summed.dst is not None:
            rest.append(summed.dst)
        if rest:
            torch.autograd.backward(summed.out, grad_out, inputs=rest)
        grad_src = sums.owned_grad(grad_agg)
        # The returned rows' gradients are added into it as they are waited for.
        mine = Returns(grad_src, pending)
        if summed.dst is None:
            return (grad_src,), mine
        assert summed.dst.grad is not None
        return (grad_src, summed.dst.grad), mine

    def _returns(self, index: int, graph: StackGraph) -> bool:
        """Whether the backward sends layer ``index``'s halo rows' gradients
        to their owners: rows computed by a layer below always, the input
        layer's when they were projected or the input needs a gradient."""
        if index > 0:
            return True
        return not self._engine.cache_input and (
            graph.projection is not None or graph.h0.requires_grad
        )

    def _bins_done(self, index: int, graph: StackGraph) -> None:
        """Layer ``index``'s bins have run their backward: its gradients are
        complete unless its projection's backward is still to run (the layer
        below's bins, or :meth:`run`'s for the input layer), and so are those
        of the layer above when its projection ran in these bins."""
        engine = self._engine
        if index == 0:
            projected = graph.projection is not None
        else:
            layer = engine.model_layers[index]
            projected = engine.exchanged_projection(index, layer) is not None
        if not projected:
            self._layer_done(index)
        following = index + 1
        if following < engine.num_layers and engine.exchanged_projection(
            following, engine.model_layers[following]
        ):
            self._layer_done(following)

    def _layer_done(self, index: int) -> None:
        """Layer ``index``'s gradients are complete."""
        engine = self._engine
        engine.grad_sync.layer_done(index, engine.model_layers[index], engine.phase)

    def _source_width(self, index: int, graph: StackGraph) -> int:
        """Width of layer ``index``'s source rows on a rank without rows."""
        if index == 0:
            projection = graph.projection
            return int((projection if projection is not None else graph.h0).shape[1])
        halo = self._engine.wire.halo
        return halo[index].shape[1] if index in halo else 0

    def _post_returns(self, index: int, like: torch.Tensor) -> PendingReturns:
        """Post the receives of the gradients of the rows this rank sent at
        layer ``index`` (each peer's in reverse send order), into buffers of
        ``like``'s width and dtype; :class:`Returns` adds them into the owned
        source rows' gradient."""
        engine = self._engine
        tag = f"{engine.phase}bwd.L{index}"
        pending: PendingReturns = {}
        for peer, chunks in enumerate(self.return_rows[index]):
            for b in reversed(list(chunks)):
                rows = chunks[b]
                buf = like.new_empty((rows.numel(), like.shape[1]))
                work = engine.transport.irecv(buf, peer, tag)
                pending[(peer, b)] = (work, buf, rows)
        return pending

    def _send_returns(self, index: int, grad_halo: torch.Tensor) -> None:
        """Send the halo rows' gradients of layer ``index`` (``grad_halo``,
        in halo positions) to their owners."""
        returned = self.return_pos[index]

        def payload(key: tuple[int, int]) -> torch.Tensor | None:
            rows = returned.get(key)
            return None if rows is None else grad_halo.index_select(0, rows)

        self._send_each_return(index, payload)

    def _send_each_return(
        self,
        index: int,
        payload: Callable[[tuple[int, int]], torch.Tensor | None],
    ) -> None:
        """Send ``payload(key)``, the gradients of the rows forward message
        ``key`` of layer ``index`` brought (None: it returns none), to their
        owner: one message per forward message, each peer's in reverse send
        order, as :meth:`_post_returns` posts the owner's receives."""
        engine = self._engine
        tag = f"{engine.phase}bwd.L{index}"
        for key in reversed(engine.messages[index].keys):
            grad = payload(key)
            if grad is not None:
                engine.wire.send(grad, key[0], tag)
