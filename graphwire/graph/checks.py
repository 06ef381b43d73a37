"""The checks a :class:`~graphwire.graph.graph.Graph` runs on what it is given.

Lossless conversion to its dtypes, node IDs in range, splits that name each
labelled node once and share none, node data as long as the node count. Each
failure is a :class:`GraphError` naming the argument at fault."""

from __future__ import annotations

import operator
from typing import Any

import numpy as np
import torch

__all__ = [
    "GraphError",
    "as_tensor",
    "check_disjoint",
    "check_inferred_rows",
    "check_split",
    "node_count",
    "node_ids",
]


class GraphError(ValueError):
    """A graph or its node data is malformed (wrong dtype, shape or index range)."""


_INT64_MAX = 2**63 - 1


def as_tensor(
    value: Any, dtype: torch.dtype, name: str, bool_hint: str = ""
) -> torch.Tensor:
    """``value`` as a host tensor of ``dtype``, refusing lossy conversions.

    ``bool_hint`` is added to the error for a boolean array where integers were
    expected.
    """
    if isinstance(value, torch.Tensor):
        tensor = value.cpu()  # a Graph lives in host memory (a no-op there)
    else:
        array = np.asarray(value)
        if not (np.issubdtype(array.dtype, np.number) or array.dtype == np.bool_):
            raise GraphError(
                f"{name}: expected a numeric array, found {type(value).__name__} "
                f"of dtype {array.dtype}"
            )
        if not array.flags.writeable:
            # Read-only (memory-mapped) arrays are shared as they are; torch warns
            # about non-writable memory, but Graph never writes into its arrays.
            import warnings

            with warnings.catch_warnings():
                warnings.simplefilter("ignore", UserWarning)
                tensor = torch.from_numpy(array)
        else:
            tensor = torch.from_numpy(array)
    if tensor.dtype != dtype:
        if tensor.dtype.is_complex:
            raise GraphError(f"{name}: expected real numbers, found {tensor.dtype}")
        if (
            not dtype.is_floating_point
            and tensor.numel() > 0
            and (tensor.dtype.is_floating_point or tensor.dtype == torch.bool)
        ):
            hint = bool_hint if tensor.dtype == torch.bool else ""
            raise GraphError(
                f"{name}: expected an integer dtype, found {tensor.dtype}{hint}"
            )
        if dtype == torch.int64 and tensor.dtype == torch.uint64 and tensor.numel():
            # The cast would wrap values >= 2**63 to negatives (torch has no
            # max for uint64, numpy does).
            peak = int(tensor.numpy().max())
            if peak > _INT64_MAX:
                raise GraphError(
                    f"{name}: holds value {peak}, beyond int64 (at most {_INT64_MAX})"
                )
        converted = tensor.to(dtype)
        if (
            dtype.is_floating_point
            and tensor.dtype.is_floating_point
            and torch.finfo(tensor.dtype).max > torch.finfo(dtype).max
        ):
            _check_no_overflow(tensor, converted, name)
        tensor = converted
    return tensor


def _check_no_overflow(wide: torch.Tensor, narrow: torch.Tensor, name: str) -> None:
    """Refuse a narrowing float cast that turned a finite value into inf."""
    overflowed = torch.isinf(narrow) & torch.isfinite(wide)
    if bool(overflowed.any()):
        where = torch.nonzero(overflowed)[0].tolist()
        position = ", ".join(map(str, where))
        raise GraphError(
            f"{name}: value {float(wide[tuple(where)])} at [{position}] does not fit "
            f"in {narrow.dtype} (largest {torch.finfo(narrow.dtype).max:.4g}); "
            f"{int(overflowed.sum())} such entries"
        )


_MASK_HINT = "; a boolean mask? pass its node indices, mask.nonzero().view(-1)"


def node_ids(value: Any, name: str, num_nodes: int) -> torch.Tensor:
    """int64 [k]: node IDs (a tensor, array or list) checked against the graph."""
    idx = as_tensor(value, torch.int64, name, _MASK_HINT)
    if idx.dim() != 1:
        raise GraphError(
            f"{name}: expected a 1-D index array, found {tuple(idx.shape)}"
        )
    if idx.numel() and (int(idx.min()) < 0 or int(idx.max()) >= num_nodes):
        raise GraphError(
            f"{name}: node IDs must lie in [0, {num_nodes}), found range "
            f"[{int(idx.min())}, {int(idx.max())}]"
        )
    return idx


def check_permutation(order: torch.Tensor, name: str, num_nodes: int) -> None:
    """Refuse an ``order`` that is not a permutation of ``[0, num_nodes)``.

    Refused: another shape, float or bool values, or IDs repeated, missing or
    out of range."""
    dtype = order.dtype
    bad = order.shape != (num_nodes,) or (
        dtype.is_floating_point or dtype.is_complex or dtype == torch.bool
    )
    if not bad and num_nodes:
        bad = int(order.min()) < 0 or bool(
            (torch.bincount(order, minlength=num_nodes) != 1).any()
        )
    if bad:
        raise GraphError(
            f"{name}: expected a permutation of the {num_nodes} nodes' IDs, "
            f"found {order.numel()} IDs with repeats or gaps"
        )


def check_split(name: str, idx: torch.Tensor, y: torch.Tensor | None) -> None:
    """Refuse a split that names a node twice or holds an unlabelled node.

    A repeated node would count twice in the loss and the accuracy (a mask, as
    PyG and DGL store splits, cannot repeat one); an unlabelled node (``y == -1``)
    would fail inside torch's loss with an ``IndexError``.
    """
    if idx.numel() == 0:
        return
    ordered = torch.sort(idx).values
    repeated = ordered[1:] == ordered[:-1]
    if bool(repeated.any()):
        node = int(ordered[1:][repeated][0])
        count = int(repeated.sum())
        raise GraphError(
            f"{name}: node {node} is listed more than once ({count} repeated "
            "entries); a split names each node once"
        )
    if y is not None:
        labels = y[idx]
        if bool((labels < 0).any()):
            node = int(idx[labels < 0][0])
            raise GraphError(
                f"{name}: node {node} has label -1 (unlabelled); nodes in "
                "train/val/test need a label in [0, num_classes)"
            )


def check_disjoint(splits: dict[str, torch.Tensor]) -> None:
    """Refuse a node in two splits (each already names a node at most once).

    A node in train and test is evaluated on what it was trained on, and the
    test accuracy says nothing. One sort of all the split IDs together.
    """
    if sum(idx.numel() for idx in splits.values()) < 2 or len(splits) < 2:
        return
    nodes = torch.cat(list(splits.values()))
    which = torch.cat(
        [torch.full_like(idx, k) for k, idx in enumerate(splits.values())]
    )
    nodes, order = torch.sort(nodes, stable=True)
    which = which[order]
    shared = nodes[1:] == nodes[:-1]
    if bool(shared.any()):
        at = int(torch.nonzero(shared)[0])
        names = list(splits)
        first, second = names[int(which[at])], names[int(which[at + 1])]
        count = int(shared.sum())
        raise GraphError(
            f"{second}: node {int(nodes[at])} is also in {first} ({count} "
            f"{'node' if count == 1 else 'nodes'} in two splits); train, val and "
            "test must be disjoint"
        )


def node_count(value: Any, name: str) -> int:
    """``value`` as a node count: an int (not a bool, not a float) >= 0."""
    if isinstance(value, bool) or not hasattr(value, "__index__"):
        raise GraphError(f"{name}: expected an int, found {value!r}")
    count = operator.index(value)
    if count < 0:
        raise GraphError(f"{name}: must be >= 0, found {count}")
    return count


def check_inferred_rows(num_nodes: int, node_data: dict[str, Any]) -> None:
    """Refuse node data longer than the inferred node count, naming the cause.

    Longer node data means trailing nodes without edges: say so, instead of a
    bare shape mismatch."""
    for name, value in node_data.items():
        shape = np.shape(value) if value is not None else ()
        if shape and shape[0] > num_nodes:
            raise GraphError(
                f"{name}: has {shape[0]} rows, but the edges name only {num_nodes} "
                f"nodes (num_nodes is inferred as the largest edge ID + 1); pass "
                f"num_nodes={shape[0]} if the last nodes have no edges"
            )
