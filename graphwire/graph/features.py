"""The feature check every loader runs: node features must be finite numbers.

A ``nan`` or ``inf`` feature is accepted by torch and spreads: one ``nan`` in a
row makes its GCN aggregate ``nan`` at every neighbour, and training reports a
``nan`` loss epochs later with nothing to say where it came from. Loaders call
:func:`check_finite_features` on the array they read, so the error names the
file, the row and the column. (Graph's constructor does not: internal code
builds graphs from features already checked.)
"""

from __future__ import annotations

import os
from typing import Any, NoReturn

import numpy as np
import torch

from graphwire.graph.errors import DatasetError
from graphwire.graph.graph import GraphError

__all__ = ["check_finite_features"]

# Rows are checked in blocks of about this many entries, so the boolean mask
# stays small (a few MiB) for a feature matrix of any size.
_BLOCK_ENTRIES = 1 << 22


def check_finite_features(
    x: Any, path: str | os.PathLike[str] | None, name: str = "x"
) -> None:
    """Refuse ``x`` if it holds ``nan``, ``inf`` or ``-inf``.

    Args:
        x: Features, float [N, F] (an ndarray, a memory map or a tensor); integer
            and boolean arrays are finite by type and pass without a read. Arrays
            of another rank pass too (the graph's shape check names them).
        path: The file ``x`` was read from, or ``None`` (an in-memory source).
        name: What ``x`` is called there (``"x"``, ``"dgl ndata: feat"``).

    Raises:
        DatasetError: naming ``path``, when it is given; else GraphError. The
            message gives the first non-finite entry's row, column and value.
    """
    if isinstance(x, torch.Tensor):
        if not x.dtype.is_floating_point or x.dim() != 2:
            return
        x = x.detach().cpu()
        # numpy has no bfloat16; float32 holds each of its values (inf too)
        x = (x.float() if x.dtype == torch.bfloat16 else x).numpy()
    array = np.asarray(x) if not isinstance(x, np.ndarray) else x
    if not np.issubdtype(array.dtype, np.floating) or array.ndim != 2:
        return
    step = max(1, _BLOCK_ENTRIES // max(1, array.shape[1]))
    for start in range(0, array.shape[0], step):  # blocks of rows, not nodes
        bad = ~np.isfinite(array[start : start + step])
        if bad.any():
            rows, cols = np.nonzero(bad)
            row, col = start + int(rows[0]), int(cols[0])
            later = sum(
                int(np.count_nonzero(~np.isfinite(array[rest : rest + step])))
                for rest in range(start + step, array.shape[0], step)
            )
            _refuse(path, name, row, col, float(array[row, col]), rows.size + later)


def _refuse(
    path: str | os.PathLike[str] | None,
    name: str,
    row: int,
    col: int,
    value: float,
    count: int,
) -> NoReturn:
    problem = (
        f"{name}: expected finite numbers, found {value} at row {row}, column "
        f"{col} ({count} non-finite {'entry' if count == 1 else 'entries'} in all)"
    )
    if path is None:
        raise GraphError(problem)
    raise DatasetError(path, problem)
