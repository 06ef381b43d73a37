"""Gradients summed over ranks while the backward still runs, as DDP does.

:class:`BackwardSync` cuts the parameters into buckets, one per GNN layer from
the last (whose gradients the backward finishes first) to the input layer,
then one for any other parameter. A hook on each parameter
(``register_post_accumulate_grad_hook``) notes when its gradient is complete;
a bucket whose gradients are all complete is flattened and handed to a
communication thread, which sums it over ranks with
:meth:`~graphwire.comm.base.Transport.all_reduce_sum` (tag ``sync.grad``)
while the backward goes on with the layers below. :meth:`BackwardSync.finish`,
after the backward, hands over the buckets no hook completed (a parameter
without a gradient counts as zeros), waits for the sums and sets the
gradients from them.

The thread sums the buckets in bucket order, each one only after every
bucket before it, on every rank: the collectives of all ranks line up
whatever order the hooks fire in. Each element's sum is the rank-order sum
of :meth:`all_reduce_sum`, so the gradients are bitwise those of one flat
all-reduce after the backward (:func:`~graphwire.run.collective.sync_gradients`).
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Sequence

import torch
from torch import nn

from graphwire.comm.base import Transport
from graphwire.nn.models import GNN
from graphwire.run.collective import assign_gradients, flat_gradients

__all__ = ["BackwardSync", "layer_buckets"]

_TAG = "sync.grad"


def layer_buckets(model: nn.Module) -> list[list[torch.Tensor]]:
    """``model``'s trainable parameters in buckets: a GNN's layers last layer
    first, then the parameters of no layer; one bucket for any other model."""
    trainable: list[torch.Tensor] = [p for p in model.parameters() if p.requires_grad]
    if not isinstance(model, GNN):
        return [trainable] if trainable else []
    buckets: list[list[torch.Tensor]] = []
    for layer in reversed(model.layers):
        params: list[torch.Tensor] = [p for p in layer.parameters() if p.requires_grad]
        if params:
            buckets.append(params)
    seen = {id(p) for bucket in buckets for p in bucket}
    rest = [p for p in trainable if id(p) not in seen]
    return buckets + ([rest] if rest else [])


class BackwardSync:
    """Sums each bucket of gradients over ranks as soon as it is complete.

    Use: :meth:`arm` before ``loss.backward()``, :meth:`finish` after it.

    Args:
        buckets: the parameters, in the order their sums run
            (:func:`layer_buckets`); no parameter in two.
        transport: this rank's transport.

    Attributes:
        busy_s: seconds the thread has spent summing, since the last
            :meth:`take_busy` (overlapped with the backward or not).
    """

    def __init__(
        self, buckets: Sequence[Sequence[torch.Tensor]], transport: Transport
    ) -> None:
        self.buckets = [list(b) for b in buckets]
        self.transport = transport
        self.busy_s = 0.0
        self._bucket_of: dict[int, int] = {}
        for index, bucket in enumerate(self.buckets):
            for p in bucket:
                if id(p) in self._bucket_of:
                    raise ValueError("BackwardSync: a parameter is in two buckets")
                self._bucket_of[id(p)] = index
        self._left: list[int] = []
        self._next = 0  # the next bucket to hand over
        self._armed = False
        self._todo: queue.Queue[tuple[int, torch.Tensor] | None] = queue.Queue()
        self._done: queue.Queue[tuple[int, torch.Tensor] | BaseException] = (
            queue.Queue()
        )
        self._thread: threading.Thread | None = None
        self._hooks = [
            p.register_post_accumulate_grad_hook(self._accumulated)
            for bucket in self.buckets
            for p in bucket
        ]

    @classmethod
    def for_model(cls, model: nn.Module, transport: Transport) -> BackwardSync:
        """One bucket per layer of ``model`` (:func:`layer_buckets`)."""
        return cls(layer_buckets(model), transport)

    def arm(self) -> None:
        """The next backward's gradients are to be summed."""
        if self._armed:
            raise RuntimeError("BackwardSync.arm: the last backward was not finished")
        self._left = [len(bucket) for bucket in self.buckets]
        self._next = 0
        self._armed = True
        if self._thread is None and self.transport.world_size > 1:
            self._thread = threading.Thread(
                target=self._run, name="grad-sync", daemon=True
            )
            self._thread.start()

    def _accumulated(self, param: torch.Tensor) -> None:
        """A parameter's gradient is complete (the backward's hook)."""
        if not self._armed:
            return  # a backward outside training: nothing to sum
        self._left[self._bucket_of[id(param)]] -= 1
        while self._next < len(self.buckets) and self._left[self._next] <= 0:
            self._hand_over()

    def _hand_over(self) -> None:
        index = self._next
        self._next += 1
        self._todo.put((index, flat_gradients(self.buckets[index])))

    def finish(self) -> None:
        """After the backward: every bucket's gradients are their sums over
        ranks (zeros summed where a parameter got no gradient).

        Raises:
            TransportError: a sum failed (a peer died, the timeout passed).
        """
        if not self._armed:
            raise RuntimeError("BackwardSync.finish: arm() was not called")
        self._armed = False
        if self.transport.world_size == 1:
            for bucket in self.buckets:
                assign_gradients(bucket, flat_gradients(bucket))
            return
        while self._next < len(self.buckets):
            self._hand_over()
        for _ in self.buckets:
            item = self._done.get()
            if isinstance(item, BaseException):
                raise item
            index, total = item
            assign_gradients(self.buckets[index], total)

    def take_busy(self) -> float:
        """The thread's summing time since the last call."""
        busy, self.busy_s = self.busy_s, 0.0
        return busy

    def _run(self) -> None:
        while (item := self._todo.get()) is not None:
            index, flat = item
            began = time.perf_counter()
            try:
                total = self.transport.all_reduce_sum(flat, _TAG)
            except BaseException as error:  # raised again by finish()
                self._done.put(error)
                return
            self.busy_s += time.perf_counter() - began
            self._done.put((index, total))

    def close(self, join: bool = True) -> None:
        """Remove the hooks and stop the thread; ``join``: wait for it (not
        after an error, when a sum may wait on a dead peer until the timeout:
        the thread is a daemon and goes with the process)."""
        for hook in self._hooks:
            hook.remove()
        self._hooks.clear()
        if self._thread is not None:
            self._todo.put(None)
            if join:
                self._thread.join()
            self._thread = None
