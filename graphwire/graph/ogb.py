"""OGB node-property-prediction folders (ogbn-arxiv, ogbn-products, ...), raw layout.

Reads the files the ``ogb`` package downloads, without needing ``ogb`` or pandas::

    FOLDER/raw/edge.csv.gz            "src,dst" per line            int [E, 2]
    FOLDER/raw/node-feat.csv.gz       F comma-separated floats       [N, F] (optional)
    FOLDER/raw/node-label.csv.gz      one label per line, "nan" for unlabelled
    FOLDER/raw/num-node-list.csv.gz   N (optional; else rows of features/labels)
    FOLDER/split/SCHEME/{train,valid,test}.csv.gz   one node ID per line

OGB stores every edge once as a directed pair; arxiv and products are used as
undirected graphs, so by default both directions are kept (duplicates dropped).

Shapes of the returned :class:`Graph`: x float32 [N, F], y int64 [N] (``-1`` where
the label is nan), train/val/test int64 node IDs as listed.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np

from graphwire.graph.datasets import parse_flag
from graphwire.graph.errors import DatasetError
from graphwire.graph.features import check_finite_features
from graphwire.graph.files import read_table
from graphwire.graph.graph import Graph, GraphError
from graphwire.graph.labels import check_labels

__all__ = ["load_ogb"]

_MAX_EXACT_LABEL = float(2**53)
_SPLITS = (("train", "train_idx"), ("valid", "val_idx"), ("test", "test_idx"))


def load_ogb(
    folder: str | os.PathLike[str],
    scheme: str | None = None,
    symmetrize: bool | str = True,
) -> Graph:
    """Load an OGB node-property-prediction dataset from its raw CSV files.

    Args:
        folder: The dataset folder (the one holding ``raw/`` and ``split/``).
        scheme: The folder under ``split/`` to use (e.g. ``"time"``,
            ``"sales_ranking"``); may be left out when there is only one.
        symmetrize: Add the reverse of every edge and drop duplicates. Strings
            ``true/false``, ``yes/no`` and ``1/0`` are accepted (dataset spec
            options), see :func:`graphwire.graph.datasets.parse_flag`.

    Returns:
        A :class:`Graph` named after ``folder``.

    Raises:
        DatasetError: A file is missing, truncated, not numeric, has the wrong
            number of columns or rows, or names node IDs out of range; a split
            node is unlabelled (``nan``); or the split scheme is missing or
            ambiguous.
    """
    folder = Path(folder)
    raw = folder / "raw"
    symmetric = parse_flag(symmetrize, "symmetrize")
    edge_path = raw / "edge.csv.gz"
    if not raw.is_dir():
        raise DatasetError(
            raw, "missing (expected an OGB node-property-prediction folder)"
        )
    if not edge_path.is_file():
        hint = (
            " (only the raw CSV layout is supported)" if any(raw.glob("*.npz")) else ""
        )
        raise DatasetError(edge_path, f"missing{hint}")
    edges = read_table(edge_path, np.int64, 2)

    x = y = None
    sizes: list[tuple[Path, int]] = []
    count_path = raw / "num-node-list.csv.gz"
    if count_path.is_file():
        counts = read_table(count_path, np.int64, 1)
        if counts.shape != (1, 1) or int(counts[0, 0]) < 0:
            raise DatasetError(
                count_path,
                "expected one non-negative node count, found "
                f"{counts.ravel().tolist()}",
            )
        sizes.append((count_path, int(counts[0, 0])))
    feat_path = raw / "node-feat.csv.gz"
    if feat_path.is_file():
        x = read_table(feat_path, np.float32)
        check_finite_features(x, feat_path, "node features")
        sizes.append((feat_path, x.shape[0]))
    label_path = raw / "node-label.csv.gz"
    if label_path.is_file():
        y = _labels(label_path)
        sizes.append((label_path, y.shape[0]))
    if sizes:
        num_nodes = sizes[0][1]
        for path, rows in sizes[1:]:
            if rows != num_nodes:
                raise DatasetError(
                    path,
                    f"expected {num_nodes} rows (one per node, as {sizes[0][0].name} "
                    f"says), found {rows}",
                )
    else:
        num_nodes = int(edges.max(initial=-1)) + 1
    _check_range(edge_path, edges, num_nodes)

    splits = {}
    split_dir = _split_dir(folder / "split", scheme)
    for file_stem, field in _SPLITS:
        path = split_dir / f"{file_stem}.csv.gz"
        if not path.is_file():
            raise DatasetError(
                path, "missing (each split scheme needs train, valid, test)"
            )
        ids = read_table(path, np.int64, 1)[:, 0]
        _check_range(path, ids, num_nodes)
        splits[field] = ids
    if y is not None:
        # nan (-1) only on nodes in no split
        check_labels(label_path, y, splits, num_nodes=num_nodes)

    try:
        graph = Graph.from_edge_index(
            edges[:, 0],
            edges[:, 1],
            num_nodes=num_nodes,
            x=x,
            y=y,
            name=folder.name,
            **splits,
        )
    except GraphError as error:  # every size is checked above; kept as a backstop
        raise DatasetError(folder, str(error)) from error
    return graph.symmetric if symmetric else graph


def _labels(path: Path) -> np.ndarray:
    """int64 [N] from one float per line; nan (unlabelled) becomes -1."""
    values = read_table(path, np.float64, 1)[:, 0]
    labelled = ~np.isnan(values)
    # inf (and 1e30) pass the round() test, and an int64 cast would make them
    # -9223372036854775808; from 2**53 on a float64 holds no exact integer.
    bad = labelled & (
        ~np.isfinite(values)
        | (values != np.round(values))
        | (values < 0)
        | (values >= _MAX_EXACT_LABEL)
    )
    if bad.any():
        line = int(np.flatnonzero(bad)[0])
        raise DatasetError(
            path,
            f"labels must be non-negative integers below 2**53 or nan, found "
            f"{float(values[line])} on data line {line + 1} (not a finite "
            "integer label)",
        )
    labels = np.full(values.shape, -1, dtype=np.int64)
    labels[labelled] = values[labelled].astype(np.int64)
    return labels


def _split_dir(split_root: Path, scheme: str | None) -> Path:
    if not split_root.is_dir():
        raise DatasetError(split_root, "missing (OGB datasets ship split/<scheme>/)")
    schemes = sorted(p.name for p in split_root.iterdir() if p.is_dir())
    if scheme is not None:
        if scheme not in schemes:
            raise DatasetError(
                split_root / scheme, f"missing split scheme; found {schemes}"
            )
        return split_root / scheme
    if len(schemes) != 1:
        found = "none" if not schemes else f"several: {schemes}"
        raise DatasetError(
            split_root,
            f"expected one split scheme folder, found {found} (pass scheme=)",
        )
    return split_root / schemes[0]


def _check_range(path: Path, ids: np.ndarray, num_nodes: int) -> None:
    if ids.size and (int(ids.min()) < 0 or int(ids.max()) >= num_nodes):
        raise DatasetError(
            path,
            f"node IDs must lie in [0, {num_nodes}), found range "
            f"[{int(ids.min())}, {int(ids.max())}]",
        )
