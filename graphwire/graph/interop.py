"""Reading PyG and DGL graphs: what `Graph.from_pyg` and `Graph.from_dgl` build from.

Neither library is imported: a ``Data`` or ``DGLGraph`` is read through its
attributes, so graphwire needs PyG or DGL only where the caller already has one.
The tests build real PyG ``Data`` objects (PyG is a test dependency). DGL's
newest release on PyPI (2.1.0) needs torchdata, which pins an older torch, and
does not import beside torch 2.13, so its reader is tested with an object that
has the ``DGLGraph`` attributes it reads.
Each reader returns ``(src, dst, num_nodes, node_data)`` for
`Graph.from_edge_index`, with labels as a vector [N] and boolean masks turned
into the node-index splits ``train_idx`` / ``val_idx`` / ``test_idx``.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from graphwire.graph.features import check_finite_features
from graphwire.graph.graph import GraphError, check_inferred_rows, node_count

__all__ = ["dgl_parts", "pyg_parts"]

Parts = tuple[Any, Any, "int | None", dict[str, Any]]

_MASKS = (
    ("train_mask", "train_idx"),
    ("val_mask", "val_idx"),
    ("test_mask", "test_idx"),
)


def pyg_parts(data: Any) -> Parts:
    """The edges, node count and node data of a ``torch_geometric.data.Data``."""
    edge_index = getattr(data, "edge_index", None)
    if (
        not isinstance(edge_index, torch.Tensor)
        or edge_index.dim() != 2
        or edge_index.shape[0] != 2
    ):
        found = (
            f"shape {tuple(edge_index.shape)}"
            if isinstance(edge_index, torch.Tensor)
            else repr(edge_index)
        )
        hint = (
            " (adj_t, a SparseTensor, is not read: build the Graph before "
            "ToSparseTensor)"
            if getattr(data, "adj_t", None) is not None
            else ""
        )
        raise GraphError(
            f"pyg data: expected edge_index, a tensor of shape [2, E], found "
            f"{found}{hint}"
        )
    num_nodes = _given_num_nodes(data)
    if num_nodes is not None:
        num_nodes = node_count(num_nodes, "pyg data: num_nodes")
    elif getattr(data, "x", None) is not None and np.ndim(data.x) >= 1:
        num_nodes = int(np.shape(data.x)[0])  # as PyG counts a Data's nodes
    node_data: dict[str, Any] = {}
    if getattr(data, "x", None) is not None:
        check_finite_features(data.x, None, "pyg data: x")
        node_data["x"] = data.x
    if getattr(data, "y", None) is not None:
        node_data["y"] = _label_vector(data.y, "pyg data: y")
    masks = {
        (mask_name, split): getattr(data, mask_name)
        for mask_name, split in _MASKS
        if getattr(data, mask_name, None) is not None
    }
    mask_rows = num_nodes
    if masks and num_nodes is None:
        # Masks are read before the graph exists: check their length against
        # the node count from_edge_index will infer.
        ids = edge_index.cpu().numpy()
        mask_rows = int(ids.max(initial=-1)) + 1
        check_inferred_rows(
            mask_rows, {f"pyg data: {name}": m for (name, _), m in masks.items()}
        )
    for (mask_name, split), mask in masks.items():
        node_data[split] = _mask_nodes(mask, f"pyg data: {mask_name}", mask_rows)
    return edge_index[0], edge_index[1], num_nodes, node_data


def _given_num_nodes(data: Any) -> Any:
    """``data.num_nodes`` if the caller set it, else None. A PyG ``Data``
    answers ``num_nodes`` even when it was never set, guessing from its node
    attributes or edge_index (with a warning); that guess is not taken: the
    node count is then x's rows, as PyG counts them, or without x the
    largest edge ID + 1, with a check that names trailing nodes."""
    if not any(
        kind.__module__.startswith("torch_geometric.") for kind in type(data).__mro__
    ):  # not a PyG Data, nor a subclass of one: as it says
        return getattr(data, "num_nodes", None)
    return data.num_nodes if "num_nodes" in data else None  # what was stored


def dgl_parts(graph: Any) -> Parts:
    """The edges, node count and node data of a homogeneous ``dgl.DGLGraph``."""
    src, dst = graph.edges()
    num_nodes = node_count(graph.num_nodes(), "dgl graph: num_nodes()")
    ndata = graph.ndata
    node_data: dict[str, Any] = {}
    if "feat" in ndata:
        check_finite_features(ndata["feat"], None, "dgl ndata: feat")
        node_data["x"] = ndata["feat"]
    if "label" in ndata:
        node_data["y"] = _label_vector(ndata["label"], "dgl ndata: label")
    for key, split in _MASKS:
        if key in ndata:
            node_data[split] = _mask_nodes(ndata[key], f"dgl ndata: {key}", num_nodes)
    return src, dst, num_nodes, node_data


def _label_vector(y: Any, name: str) -> Any:
    """Labels [N] from ``y`` [N] or [N, 1] (a tensor or array); other shapes,
    such as multi-label targets [N, k], are refused."""
    shape = tuple(np.shape(y))
    if len(shape) == 2 and shape[1] == 1:
        return y.reshape(-1) if hasattr(y, "reshape") else np.reshape(y, -1)
    if len(shape) != 1:
        raise GraphError(
            f"{name}: expected class labels of shape [N] or [N, 1], found "
            f"{shape} (multi-label or multi-task targets are not supported)"
        )
    return y


def _mask_nodes(mask: Any, name: str, num_nodes: int | None) -> torch.Tensor:
    """int64 [*]: the nodes a mask [num_nodes] of booleans (or 0s and 1s) selects."""
    mask = torch.as_tensor(mask)
    is_flags = mask.dtype == torch.bool or (
        not mask.dtype.is_floating_point
        and not mask.dtype.is_complex
        and bool(((mask == 0) | (mask == 1)).all())
    )
    length_ok = num_nodes is None or mask.shape[:1] == (num_nodes,)
    if mask.dim() != 1 or not is_flags or not length_ok:
        hint = (
            "; a mask of shape [N, k] holds k alternative splits: pick one "
            "column first, e.g. mask[:, 0]"
            if mask.dim() == 2
            else ""
        )
        raise GraphError(
            f"{name}: expected a boolean mask of shape [num_nodes={num_nodes}], "
            f"found {mask.dtype} of shape {tuple(mask.shape)}{hint}"
        )
    return mask.nonzero().view(-1)
