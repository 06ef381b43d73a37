"""Multi-constraint METIS, called in the METIS library that pymetis ships.

Why this file exists: ``pymetis.part_graph`` (checked on 2025.2.2, whose wrapper
takes buffers zero-copy) always passes ``ncon = 1`` to METIS and does not check
the length of ``vweights``. An interleaved ``[N * ncon]`` weight array is
therefore *not* multi-constraint balancing: METIS reads its first ``N`` entries
as one weight per vertex, which mixes the constraints up (on a 100x100 grid
whose left quarter is "train", the result kept the train nodes in two of four
parts). The extension module does export ``METIS_PartGraphKway`` and
``METIS_PartGraphRecursive`` (METIS 5 API), so we call those with ``ctypes`` and
the real ``ncon``. ``available()`` says whether that works here; callers fall
back to single-constraint ``pymetis.part_graph`` when it does not.

Shapes (N vertices, C constraints, M = 2 x undirected edges):
    xadj     idx_t [N + 1]
    adjncy   idx_t [M]       symmetric, no self-loops
    vweights idx_t [N, C]    row-major, as METIS's ``vwgt[i * ncon + j]``
"""

from __future__ import annotations

import ctypes
import importlib
from functools import cache
from typing import Any

import numpy as np

__all__ = ["MetisError", "available", "idx_dtype", "part_graph"]

_METIS_OK = 1
_METIS_ERRORS = {-2: "input error", -3: "out of memory", -4: "error"}
# METIS_NOPTIONS is 40 in METIS 5.1 and 5.2; extra room costs nothing.
_NUM_OPTIONS = 64


class MetisError(RuntimeError):
    """METIS returned an error code."""


def idx_dtype() -> np.dtype[Any]:
    """The integer type (``idx_t``) pymetis's METIS was built with."""
    import pymetis

    return np.dtype(pymetis.zero_copy_dtype())


@cache
def _library() -> Any:
    import pymetis._internal as internal

    lib = ctypes.CDLL(internal.__file__)
    for name in (
        "METIS_SetDefaultOptions",
        "METIS_PartGraphKway",
        "METIS_PartGraphRecursive",
    ):
        getattr(lib, name).restype = ctypes.c_int
    return lib


def available() -> bool:
    """True when the METIS C API can be called through pymetis's library."""
    try:
        _library()
    except (OSError, AttributeError, ImportError):
        return False
    return True


def _option_index(name: str) -> int:
    # The stub of pymetis._internal does not list options_indices.
    internal: Any = importlib.import_module("pymetis._internal")
    return int(getattr(internal.options_indices, name))


def part_graph(
    num_parts: int,
    xadj: np.ndarray,
    adjncy: np.ndarray,
    vweights: np.ndarray,
    *,
    seed: int,
    ufactor: int | None = None,
    recursive: bool = False,
) -> tuple[int, np.ndarray]:
    """Partition with ``C = vweights.shape[1]`` balance constraints.

    Args:
        num_parts: P >= 2.
        xadj, adjncy: Symmetric CSR adjacency without self-loops.
        vweights: [N, C] non-negative vertex weights; every column must have a
            positive total (METIS divides by it).
        seed: METIS's ``METIS_OPTION_SEED`` (>= 0).
        ufactor: Allowed imbalance in thousandths (METIS default when None).
        recursive: Recursive bisection instead of k-way.

    Returns:
        ``(edge_cut, part)``: METIS's cut (undirected edges) and int64 [N] part IDs.

    Raises:
        MetisError: METIS returned an error code.
    """
    dtype = idx_dtype()
    num_nodes = xadj.shape[0] - 1
    assert vweights.ndim == 2 and vweights.shape[0] == num_nodes
    assert bool((vweights.sum(axis=0) > 0).all()), "zero-total constraint"
    limit = np.iinfo(dtype).max
    if adjncy.shape[0] > limit or int(vweights.sum(axis=0).max()) > limit:
        raise MetisError(f"graph too large for METIS built with {dtype} indices")

    lib = _library()
    options = np.zeros(_NUM_OPTIONS, dtype=dtype)
    lib.METIS_SetDefaultOptions(_ptr(options))
    options[_option_index("SEED")] = seed
    options[_option_index("NUMBERING")] = 0
    if ufactor is not None:
        options[_option_index("UFACTOR")] = ufactor

    def scalar(value: int) -> np.ndarray:
        return np.array([value], dtype=dtype)

    xadj_c = np.ascontiguousarray(xadj, dtype=dtype)
    adjncy_c = np.ascontiguousarray(adjncy, dtype=dtype)
    vwgt_c = np.ascontiguousarray(vweights, dtype=dtype)
    nvtxs, ncon, nparts = (
        scalar(num_nodes),
        scalar(vweights.shape[1]),
        scalar(num_parts),
    )
    edge_cut = scalar(0)
    part = np.zeros(num_nodes, dtype=dtype)
    call = lib.METIS_PartGraphRecursive if recursive else lib.METIS_PartGraphKway
    status = call(
        _ptr(nvtxs),
        _ptr(ncon),
        _ptr(xadj_c),
        _ptr(adjncy_c),
        _ptr(vwgt_c),
        None,  # vsize: communication volume objective, unused
        None,  # adjwgt: unit edge weights
        _ptr(nparts),
        None,  # tpwgts: equal target weights for every part and constraint
        None,  # ubvec: imbalance from ufactor
        _ptr(options),
        _ptr(edge_cut),
        _ptr(part),
    )
    if status != _METIS_OK:
        what = _METIS_ERRORS.get(status, f"status {status}")
        raise MetisError(
            f"METIS_PartGraph{'Recursive' if recursive else 'Kway'}: {what}"
        )
    return int(edge_cut[0]), part.astype(np.int64, copy=False)


def _ptr(array: np.ndarray) -> ctypes.c_void_p:
    assert array.flags.c_contiguous
    return ctypes.c_void_p(array.ctypes.data)
