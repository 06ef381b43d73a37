"""`TorchWork`: a pending ``isend`` or ``irecv`` of a TorchTransport.

It is the :class:`~graphwire.comm.base.Work` of a
:class:`~graphwire.comm.dist.TorchTransport`."""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager
from datetime import timedelta
from typing import Any, NoReturn

import torch

__all__ = ["TorchWork"]


class TorchWork:
    """A pending ``isend``/``irecv`` of a ``TorchTransport``.

    ``wait()`` is bounded by the group timeout, raises through ``fail``, and
    copies a staged receive back.

    Args:
        work: the ``torch.distributed`` work handle.
        op: what it is, for errors (``"isend to rank 2"``).
        tag: the message's tag, for errors.
        timeout: the longest ``wait()`` waits.
        fail: raises the transport's error for ``(op, tag, error)``.
        waiting: makes what is held while ``wait()`` blocks (the transport's
            stall watch notes the wait).
        staged: the tensor a receive lands in, when not ``target`` itself.
        target: the caller's tensor ``staged`` is copied into on completion.
    """

    def __init__(
        self,
        work: Any,
        op: str,
        tag: str,
        timeout: timedelta,
        fail: Callable[[str, str, BaseException], NoReturn],
        waiting: Callable[[], AbstractContextManager[None]],
        staged: torch.Tensor | None = None,
        target: torch.Tensor | None = None,
    ) -> None:
        self._work, self._op, self._tag = work, op, tag
        self._timeout, self._fail, self._waiting = timeout, fail, waiting
        self._staged, self._target = staged, target
        self._done = False

    def wait(self) -> None:
        if self._done:
            return
        try:
            with self._waiting():
                completed = self._work.wait(timeout=self._timeout)
        except RuntimeError as error:
            self._fail(self._op, self._tag, error)
        if completed is False:
            self._fail(
                self._op,
                self._tag,
                TimeoutError(f"no completion within {self._timeout}"),
            )
        if self._target is not None and self._staged is not None:
            self._target.copy_(self._staged)
        self._done = True
