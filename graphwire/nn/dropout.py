"""Dropout whose mask depends on (seed, node, feature), not on who computes it.

``F.dropout`` draws from the process's generator, so the same node's row gets a
different mask on a worker than in a single process, and distributed training
can only match single-process training statistically. A *hashed* mask is a
function of ``(seed, global node ID, column)``: every process that drops a
given node's row drops the same entries, so distributed full-graph training
with dropout equals single-process training (the parity tests rely on it).

The hash is SplitMix64's finaliser on int64 tensors (arithmetic wraps mod 2^64;
the logical right shifts are emulated with a mask). The top 24 bits give a
uniform in ``[0, 1)`` at float32 resolution.
"""

from __future__ import annotations

import torch

__all__ = ["hashed_dropout", "hashed_uniform"]

_LOW24 = (1 << 24) - 1
_GOLDEN = -7046029254386353131  # 0x9E3779B97F4A7C15 as int64
_MUL1 = -4658895280553007687  # 0xBF58476D1CE4E5B9
_MUL2 = -7723592293110705685  # 0x94D049BB133111EB


def _to_int64(value: int) -> int:
    value &= (1 << 64) - 1
    return value - (1 << 64) if value >= 1 << 63 else value


def _shr(z: torch.Tensor, bits: int) -> torch.Tensor:
    """Logical right shift of int64 (torch's ``>>`` is arithmetic)."""
    return (z >> bits) & ((1 << (64 - bits)) - 1)


def hashed_uniform(keys: torch.Tensor, seed: int) -> torch.Tensor:
    """float32 uniforms in [0, 1), one per int64 key, fixed by ``(seed, key)``.

    Args:
        keys: int64 [*].
        seed: any int (reduced mod 2^64).

    Returns:
        float32 [*], same shape as ``keys``.
    """
    z = keys + _to_int64(_to_int64(seed) + _GOLDEN)
    z = (z ^ _shr(z, 30)) * _MUL1
    z = (z ^ _shr(z, 27)) * _MUL2
    z = z ^ _shr(z, 31)
    return ((z >> 40) & _LOW24).to(torch.float32) * (1.0 / (1 << 24))


def hashed_dropout(
    h: torch.Tensor, p: float, row_ids: torch.Tensor, seed: int
) -> torch.Tensor:
    """Inverted dropout of ``h`` with a mask fixed by ``(seed, row_ids, column)``.

    Only non-zero entries are hashed when ``h`` is mostly zeros (bag-of-words
    input features), as a zero stays zero either way.

    Args:
        h: float [n, F].
        p: drop probability in [0, 1).
        row_ids: int64 [n], the global node ID of each row.
        seed: mask seed (the trainer derives one per epoch and layer).

    Returns:
        float [n, F]: ``h * keep / (1 - p)``.
    """
    if p == 0.0:
        return h
    if row_ids.shape != (h.shape[0],):
        raise ValueError(
            f"row_ids: expected shape ({h.shape[0]},), found {tuple(row_ids.shape)}"
        )
    width = h.shape[1]
    flat = h.reshape(-1)
    nonzero = flat.detach().nonzero().view(-1)
    if 4 * nonzero.numel() > flat.numel():
        keys = row_ids.unsqueeze(1) * width + torch.arange(width)
        keep = hashed_uniform(keys, seed) >= p
        return h * keep.to(h.dtype) * (1.0 / (1.0 - p))
    keys = row_ids[nonzero // width] * width + nonzero % width
    dropped = nonzero[hashed_uniform(keys, seed) < p]
    mask = torch.full_like(flat, 1.0 / (1.0 - p))
    mask[dropped] = 0.0
    return (flat * mask).view_as(h)
