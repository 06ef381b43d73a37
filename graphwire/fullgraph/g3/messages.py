"""G3's messages: how each layer's halo rows travel, and their gradients back.

Built once per rank at set-up for
:class:`~graphwire.fullgraph.g3.engine.G3Engine`, from the bins of
:mod:`graphwire.fullgraph.g3.bins`:

- **Bins and messages of every layer** (:func:`plan_layers`).
- **Forward** (:func:`setup_messages`). Layer ``k``'s halo rows arrive as one
  message per (sender bin of layer ``k - 1``, receiver), rows in the sender's
  schedule order, so a bin's rows can leave as soon as it is computed; each
  bin lists the messages its halo rows come in (:func:`with_needs`), for
  eager computation.
- **Backward** (:func:`plan_returns`, :class:`Returns`). The gradients of
  those rows go back along the same messages in reverse, only for the rows
  whose gradients the loss can make nonzero.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

import torch

from graphwire.comm.base import Transport, Work
from graphwire.comm.plan import ExchangePlan
from graphwire.fullgraph.g3.bins import NODE_ORDERS, LayerBins, layer_bins
from graphwire.graph.order import stable_order
from graphwire.nn.base import MessageGraph

__all__ = [
    "Messages",
    "PendingReturns",
    "Returns",
    "plan_layers",
    "plan_returns",
    "send_order",
    "setup_messages",
    "with_needs",
]


@dataclass(frozen=True, eq=False)
class Messages:
    """How one layer's halo rows travel (see the module docstring, 3).

    Attributes:
        send_rows: per peer, sender bin -> ``(owned rows, their positions in
            the bin)`` for every bin with rows that peer needs, in send order.
        recv_pos: per message ``(peer, sender bin)``, the halo positions its
            rows fill, in order.
        keys: every message this rank receives, each peer's in send order.
        bins_sent: the sender bins with rows for some peer.
        halo_message: int64 [num_halo], the index in ``keys`` of each halo row's
            message.
    """

    send_rows: list[dict[int, tuple[torch.Tensor, torch.Tensor]]]
    recv_pos: dict[tuple[int, int], torch.Tensor]
    keys: list[tuple[int, int]]
    bins_sent: frozenset[int]
    halo_message: torch.Tensor


# Per returning message (peer, sender bin): its receive, its buffer, and the
# owned rows its gradients add into.
PendingReturns = dict[tuple[int, int], tuple[Work, torch.Tensor, torch.Tensor]]


@dataclass(eq=False)
class Returns:
    """The gradients of one layer's source rows coming back from the peers
    that read them: one message per (peer, sender bin), the reverse of the
    forward's, added into ``grad`` (the owned source rows' gradient) bin by
    bin as the backward needs them."""

    grad: torch.Tensor
    pending: PendingReturns

    def wait_bin(self, b: int | None) -> None:
        """Wait for the messages of sender bin ``b`` (all when None), peers
        in rank order, and add their rows."""
        for key in sorted(k for k in self.pending if b is None or k[1] == b):
            work, buf, rows = self.pending.pop(key)
            work.wait()
            self.grad.index_add_(0, rows, buf)


def setup_messages(
    senders: LayerBins, plan: ExchangePlan, transport: Transport, halo_first: bool
) -> Messages:
    """Collective: agree with every peer on how rows computed in ``senders``'
    bins travel: one message per sender bin and receiver, sent in the order the
    sender computes its bins (:func:`send_order`), which is the order the
    receiver posts its receives in (messages between a pair keep their order).
    """
    rank, world = transport.rank, transport.world_size
    mine = send_order(len(senders.bins), senders.num_local, halo_first)
    send_rows: list[dict[int, tuple[torch.Tensor, torch.Tensor]]] = []
    perms, counts = [], []
    for peer in range(world):
        idx = plan.send_idx[peer]
        perm = stable_order(senders.position[idx])
        ordered = idx[perm]
        per_bin = torch.bincount(
            senders.bin_of_row[ordered], minlength=len(senders.bins)
        )
        chunks = torch.split(ordered, per_bin.tolist())
        send_rows.append(
            {
                b: (chunks[b], senders.position[chunks[b]] - senders.bin_start[b])
                for b in mine
                if chunks[b].numel()
            }
        )
        perms.append(perm)
        counts.append(per_bin.tolist())
    their_perm = transport.all_to_all(perms, plan.recv_rows, "setup.g3")
    gathered = transport.all_gather_object((counts, senders.num_local), "setup.g3")
    recv_pos: dict[tuple[int, int], torch.Tensor] = {}
    halo_message = torch.full((plan.num_halo,), -1, dtype=torch.int64)
    keys: list[tuple[int, int]] = []
    for peer in range(world):
        if peer == rank:
            continue
        their_counts, their_local = gathered[peer]
        positions = plan.recv_idx[peer][their_perm[peer]]
        split = torch.split(positions, their_counts[rank])
        for b in send_order(len(split), their_local, halo_first):
            if split[b].numel():
                recv_pos[(peer, b)] = split[b]
                halo_message[split[b]] = len(keys)
                keys.append((peer, b))
    return Messages(
        send_rows=send_rows,
        recv_pos=recv_pos,
        keys=keys,
        bins_sent=frozenset(b for chunks in send_rows for b in chunks),
        halo_message=halo_message,
    )


def send_order(num_bins: int, num_local: int, halo_first: bool) -> list[int]:
    """The order a layer computes (and sends) its bins in: those with halo
    inputs first when ``halo_first`` (their rows are the ones peers need),
    else those without first (eager computation while halo rows arrive)."""
    local, halo = list(range(num_local)), list(range(num_local, num_bins))
    return halo + local if halo_first else local + halo


def with_needs(layer: LayerBins, messages: Messages) -> LayerBins:
    """``layer`` with each bin's ``needs``: the messages of ``messages`` its
    halo rows come in."""
    bins = [
        replace(
            b,
            needs=frozenset(
                messages.keys[int(m)]
                for m in torch.unique(messages.halo_message[b.src_halo])
            ),
        )
        for b in layer.bins
    ]
    return replace(layer, bins=bins)


def plan_returns(
    messages: list[Messages],
    grad_plans: list[ExchangePlan],
    plan: ExchangePlan,
    num_owned: int,
) -> tuple[
    list[list[dict[int, torch.Tensor]]], list[dict[tuple[int, int], torch.Tensor]]
]:
    """What each layer's backward returns, message by message: the rows whose
    gradients the loss can make nonzero (a layer's ``grad_plans`` entry; all
    of them where it is ``plan`` itself). Messages left empty are neither
    sent nor received.

    Returns:
        Per layer: per peer, sender bin -> the owned rows whose gradients come
        back from that peer; and message ``(peer, sender bin)`` -> the halo
        positions whose gradients go back in it.
    """
    return_rows = [
        [{b: rows for b, (rows, _) in chunks.items()} for chunks in m.send_rows]
        for m in messages
    ]
    return_pos = [dict(m.recv_pos) for m in messages]
    for index, grad_plan in enumerate(grad_plans):
        if grad_plan is plan:
            continue
        keep = torch.zeros(grad_plan.num_halo, dtype=torch.bool)
        keep[torch.cat(grad_plan.recv_idx)] = True
        pos = {k: p[keep[p]] for k, p in return_pos[index].items()}
        return_pos[index] = {k: p for k, p in pos.items() if p.numel()}
        returns = return_rows[index]
        for peer, chunks in enumerate(returns):
            kept = torch.zeros(num_owned, dtype=torch.bool)
            kept[grad_plan.send_idx[peer]] = True
            rows = {b: r[kept[r]] for b, r in chunks.items()}
            returns[peer] = {b: r for b, r in rows.items() if r.numel()}
    return return_rows, return_pos


def plan_layers(
    mg: MessageGraph,
    plan: ExchangePlan,
    transport: Transport,
    ids: torch.Tensor,
    *,
    widths: Sequence[tuple[int, int]],
    budget_bytes: int,
    bin_rows: int,
    order: str,
    halo_first: list[bool],
) -> tuple[list[LayerBins], list[Messages]]:
    """Collective: every layer's bins, and the messages carrying every layer's
    halo rows (layer ``k``'s grouped by the sender's bins of layer ``k - 1``;
    the input layer's by its own bins).

    Args:
        mg: the part's MessageGraph (owned destinations; owned then halo
            sources).
        plan: the part's exchange plan.
        transport: this rank's transport.
        ids: int64 [num_owned + num_halo], the original ID of each local row
            (each bin's ``src_ids`` is taken from it).
        widths: each layer's ``(input, output)`` row widths.
        budget_bytes: the memory budget of a bin.
        bin_rows: the row cap of a bin in a layer whose output is sent.
        order: the node order's name (:data:`~graphwire.fullgraph.g3.bins.NODE_ORDERS`).
        halo_first: per layer, whether it computes its bins with halo inputs
            first (:func:`send_order`).
    """
    n, num_layers = mg.num_dst, len(widths)
    rows = NODE_ORDERS[order](mg, plan)
    layers = [
        # The last layer's output goes to no peer, so the row cap (which
        # makes sends start early) does not apply to it.
        layer_bins(
            mg,
            rows,
            widths[index],
            budget_bytes,
            None if index == num_layers - 1 else bin_rows,
        )
        for index in range(num_layers)
    ]
    messages = [
        setup_messages(
            layers[max(index - 1, 0)], plan, transport, halo_first[max(index - 1, 0)]
        )
        for index in range(num_layers)
    ]
    planned = []
    for layer, layer_messages in zip(layers, messages, strict=True):
        layer = with_needs(layer, layer_messages)
        bins = [replace(b, src_ids=ids[b.local_sources(n)]) for b in layer.bins]
        planned.append(replace(layer, bins=bins))
    return planned, messages
