"""Freed memory kept for reuse: glibc malloc's two thresholds, set for training.

glibc serves an allocation above its *mmap threshold* with a fresh mapping
that ``free`` unmaps, and gives the heap's free top back to the system once it
passes the *trim threshold*. The mmap threshold starts at 128 KiB and rises as
large blocks are freed, but never above 32 MiB. A training epoch allocates and
frees tensors of the same large sizes at every layer (features, messages,
G3's bins, dropout masks), so above the threshold each allocation's pages are
faulted in and zeroed again. Raising both thresholds keeps those blocks for
reuse instead, with little change to peak memory. PyTorch's CPU tuning advice
(jemalloc or tcmalloc) is for the same reuse; this needs no other library.

Kept apart from :mod:`graphwire.comm.launch` so that the command line can call
it without importing torch.
"""

from __future__ import annotations

import ctypes
import os
import platform
import sys

__all__ = [
    "MAX_KEEP_FREED_MB",
    "check_keep_freed_mb",
    "keep_freed_memory",
    "return_freed_memory",
    "user_set_allocator",
]

MAX_KEEP_FREED_MB = 2047  # mallopt takes a C int of bytes
_M_TRIM_THRESHOLD = -1
_M_MMAP_THRESHOLD = -3
_USER_VARIABLES = ("MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_")


def user_set_allocator() -> str | None:
    """What says the user chose the allocator's behaviour themselves, if anything.

    glibc's own variables or tunables, or another allocator preloaded
    (jemalloc, tcmalloc, mimalloc)."""
    for name in _USER_VARIABLES:
        if name in os.environ:
            return name
    if "glibc.malloc." in os.environ.get("GLIBC_TUNABLES", ""):
        return "GLIBC_TUNABLES"
    if "malloc" in os.environ.get("LD_PRELOAD", ""):
        return "LD_PRELOAD"
    return None


def check_keep_freed_mb(mb: int) -> None:
    """Raises ValueError unless ``mb`` is an int from 0 to :data:`MAX_KEEP_FREED_MB`."""
    if isinstance(mb, bool) or not isinstance(mb, int):
        raise ValueError(f"keep_freed_mb: expected an int, got {mb!r}")
    if not 0 <= mb <= MAX_KEEP_FREED_MB:
        raise ValueError(f"keep_freed_mb: expected 0 to {MAX_KEEP_FREED_MB}, got {mb}")


def keep_freed_memory(mb: int) -> bool:
    """Have this process's glibc malloc keep freed blocks of up to ``mb`` MiB.

    Sets ``M_MMAP_THRESHOLD`` (blocks below it come from the heap and are
    reused) and ``M_TRIM_THRESHOLD`` (up to that much free heap top is kept)
    to ``mb`` MiB. Nothing is changed for ``mb == 0``, off glibc, or where
    :func:`user_set_allocator` finds the user's own choice.

    Args:
        mb: MiB, 0 to :data:`MAX_KEEP_FREED_MB`.

    Returns:
        Whether the thresholds were set.

    Raises:
        ValueError: ``mb`` out of range.
    """
    check_keep_freed_mb(mb)
    if mb == 0 or not sys.platform.startswith("linux"):
        return False
    if platform.libc_ver()[0] != "glibc" or user_set_allocator() is not None:
        return False
    libc = ctypes.CDLL(None)
    size = mb << 20
    # The mmap threshold first: a trim threshold set alone stops the mmap
    # one rising, and more blocks than before would be mapped and unmapped.
    if not libc.mallopt(_M_MMAP_THRESHOLD, size):
        return False
    return bool(libc.mallopt(_M_TRIM_THRESHOLD, size))


def return_freed_memory() -> bool:
    """Give the freed memory that :func:`keep_freed_memory` keeps back to the
    system (glibc's ``malloc_trim(0)``: every arena, the threads' too), when
    a phase whose blocks will not come back is over. Returns whether it ran
    (glibc only)."""
    if not sys.platform.startswith("linux") or platform.libc_ver()[0] != "glibc":
        return False
    ctypes.CDLL(None).malloc_trim(0)
    return True
