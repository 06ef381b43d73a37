"""The one error type every graph file reader raises.

A :class:`DatasetError` always names the file it could not use and says what was
wrong with it, so a user can fix the input without reading graphwire's code::

    graphwire.graph.errors.DatasetError: /data/ind.cora.y: expected 140 rows
    (as many as ind.cora.x), found 139
"""

from __future__ import annotations

import os
from typing import Any

from graphwire.graph.graph import GraphError

__all__ = ["DatasetError"]


class DatasetError(GraphError):
    """A graph file is missing, unreadable or holds data of the wrong shape.

    Subclasses :class:`~graphwire.graph.graph.GraphError` (and so ``ValueError``).

    Attributes:
        path: The file (or folder) that is at fault.
        problem: What is wrong with it, in words.
    """

    def __init__(self, path: str | os.PathLike[str], problem: str) -> None:
        self.path = str(path)
        self.problem = problem
        super().__init__(f"{self.path}: {problem}")

    def __reduce__(self) -> tuple[Any, ...]:
        # Keeps the error picklable, so a worker process can send it back.
        return (type(self), (self.path, self.problem))
