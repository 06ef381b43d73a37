"""The label check every reader of stored labels runs before training sees them.

A label is a class ID in ``[0, num_classes)``. A node in no split (train, val or
test) may hold ``-1``: unlabelled, as OGB's ``nan`` labels load; no loss or
metric reads it. A node in a split must hold a class, or training fails inside
torch's loss with an ``IndexError`` instead of naming the file. Classes need
not all be used, but a graph of N nodes has at most N of them: a larger label
is no class index (a raw ID, a value never mapped), and the model's output
layer, sized by the class count, would not fit in memory.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

import numpy as np

from graphwire.graph.errors import DatasetError

__all__ = ["check_class_count", "check_labels"]


def check_labels(
    path: str | os.PathLike[str],
    y: np.ndarray,
    splits: Mapping[str, np.ndarray],
    num_classes: int | None = None,
    *,
    num_nodes: int | None = None,
) -> int:
    """Check that ``y`` holds valid labels; return how many classes they span.

    One pass over ``y`` (min and max); the split rows are gathered only when
    some label is ``-1``, so a fully labelled graph of millions of nodes costs
    two vectorised reductions.

    Args:
        path: The file ``y`` was read from (named in errors).
        y: int [N] labels, possibly memory-mapped.
        splits: Split name (e.g. ``"train_idx"``) to int [*] rows of ``y``,
            already checked to lie in ``[0, N)``.
        num_classes: The class count the folder's ``meta.json`` states, or
            ``None`` when there is none to hold the labels to.
        num_nodes: The graph's node count, which bounds the class count
            (a part's labels are a slice of its graph's); ``None``: the
            rows of ``y``.

    Returns:
        ``max(y) + 1``, or 0 when ``y`` is empty or all ``-1``.

    Raises:
        DatasetError: naming ``path``, the row and the label, when a label is
            ``num_classes`` or more, ``num_nodes`` or more, below ``-1``, or
            ``-1`` on a split node.
    """
    if y.size == 0:
        return 0
    high, low = int(y.max()), int(y.min())
    if num_classes is not None and high >= num_classes:
        raise DatasetError(
            path,
            f"label {high} at row {int(np.argmax(y))} is out of range: meta.json "
            f"says num_classes={num_classes}, so labels must lie in "
            f"[0, {num_classes})",
        )
    _check_span(path, "", y, high, len(y) if num_nodes is None else num_nodes)
    if low < -1:
        raise DatasetError(
            path,
            f"label {low} at row {int(np.argmin(y))}: labels must be >= 0, or -1 "
            "for an unlabelled node in no split",
        )
    if low == -1:
        for name, rows in splits.items():
            labels = y[rows]
            if labels.size and int(labels.min()) < 0:
                row = int(rows[int(np.argmin(labels))])
                raise DatasetError(
                    path,
                    f"row {row} is in {name} but has label -1 (unlabelled); "
                    "nodes in train/val/test need a label in [0, num_classes)",
                )
    return high + 1


def check_class_count(
    path: str | os.PathLike[str], name: str, y: np.ndarray, num_nodes: int
) -> None:
    """Refuse labels ``y`` of a graph of ``num_nodes`` nodes that span more
    classes than it has nodes, before anything is sized by the class count.

    For a reader whose other label checks run elsewhere (an ``.npz``'s, in
    :class:`~graphwire.graph.graph.Graph`); :func:`check_labels` runs it.

    Args:
        path: The file ``y`` was read from (named in errors).
        name: How the error names ``y`` in ``path`` (``"array 'y'"``).
        y: int [N] labels.
        num_nodes: The graph's node count.

    Raises:
        DatasetError: naming ``path``, ``name``, the largest label and its row.
    """
    if y.size:
        _check_span(path, name, y, int(y.max()), num_nodes)


def _check_span(
    path: str | os.PathLike[str], name: str, y: np.ndarray, high: int, num_nodes: int
) -> None:
    """:func:`check_class_count`, with ``high`` (``y``'s largest label) known."""
    if high < num_nodes:
        return
    raise DatasetError(
        path,
        f"{name + ': ' if name else ''}the largest label is {high} (row "
        f"{int(np.argmax(y))}), but a graph of {num_nodes:,} nodes has at most "
        f"{num_nodes:,} classes; labels must be class indices 0..C-1 (-1 for an "
        "unlabelled node)",
    )
