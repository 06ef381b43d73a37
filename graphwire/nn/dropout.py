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

A dropout mask needs a draw per *entry*, and the full finaliser takes many int64
operations per entry (shifts, XORs, multiplies). So the mask hashes each row ID
and each column once with SplitMix64, keeping the top 32 bits of each (each
column's word made odd), and an entry's draw is the int32 product
``row_word * column_word`` (mod 2^32), rounded to float32 and compared with
the drop probability's quantile of int32 rounded alike: one multiply, one
conversion and one float comparison per entry, in 4-byte words.
For two columns ``j, k`` the draws of a row are ``z`` and ``z * m`` with
``m = c_k / c_j`` (mod 2^32) fixed and ``z`` uniform; the top bits of the two
stay tied only for the rare ``m`` close to a small fraction of 2^32. (An XOR
of the two hashes in int32 would tie pairs of columns whose hashes share their
low bits.)

GAT's attention dropout (:func:`hashed_edge_dropout`) draws per (edge, head):
an edge's "row hash" is SplitMix64 of its source's hash XOR its destination's
(hashed as another key, so ``s -> d`` and ``d -> s`` differ), and the head
plays the part of the column. The mask depends on the edge's global
endpoints only, not on its position in any CSR, so every worker holding an
edge drops it in the same heads.
"""

from __future__ import annotations

import functools
import numbers
from typing import Any

import torch

__all__ = [
    "check_dropout",
    "hashed_dropout",
    "hashed_edge_dropout",
    "hashed_uniform",
    "splitmix64",
]

_LOW24 = (1 << 24) - 1
_GOLDEN = -7046029254386353131  # 0x9E3779B97F4A7C15 as int64
_MUL1 = -4658895280553007687  # 0xBF58476D1CE4E5B9
_MUL2 = -7723592293110705685  # 0x94D049BB133111EB
_COLUMN_SALT = 0x5BD1E995  # column hashes use another seed than row hashes
# An edge's destination d hashes as the source d + 2^62 would: for node IDs
# below 2^62, no source's hash is ever a destination's.
_DST_OFFSET = 1 << 62
_EDGE_SALT = 0x165667B1  # the (source, destination) mix uses another seed
_DENSITY_SAMPLE = 1 << 16  # entries looked at to choose the sparse or dense path
_MASK_BLOCK = 1 << 16  # entries drawn at a time for a dense mask (256 KiB of int32)


def check_dropout(value: Any, name: str) -> float:
    """``value`` as a dropout probability, which must lie in ``[0, 1)``.

    ``p = 1`` is refused although ``F.dropout`` takes it: it drops everything,
    and the kept entries' ``1 / (1 - p)`` scale (here and in torch) divides by
    zero. The one check behind the models' and ``TrainConfig``'s arguments.

    Raises:
        ValueError: naming ``name`` and the value.
    """
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise ValueError(f"{name}: expected a number, got {value!r}")
    p = float(value)
    if not 0.0 <= p < 1.0:  # NaN fails too
        raise ValueError(f"{name}: expected a value in [0, 1), got {value!r}")
    return p


def _to_int64(value: int) -> int:
    value &= (1 << 64) - 1
    return value - (1 << 64) if value >= 1 << 63 else value


def _shr(z: torch.Tensor, bits: int) -> torch.Tensor:
    """Logical right shift of int64 (torch's ``>>`` is arithmetic)."""
    return (z >> bits) & ((1 << (64 - bits)) - 1)


def splitmix64(keys: torch.Tensor, seed: int) -> torch.Tensor:
    """SplitMix64's finaliser of ``key + seed``: int64 [*] -> int64 [*]."""
    z = keys + _to_int64(_to_int64(seed) + _GOLDEN)
    z = (z ^ _shr(z, 30)) * _MUL1
    z = (z ^ _shr(z, 27)) * _MUL2
    return z ^ _shr(z, 31)


def hashed_uniform(keys: torch.Tensor, seed: int) -> torch.Tensor:
    """float32 uniforms in [0, 1), one per int64 key, fixed by ``(seed, key)``.

    Args:
        keys: int64 [*].
        seed: any int (reduced mod 2^64).

    Returns:
        float32 [*], same shape as ``keys``.
    """
    z = splitmix64(keys, seed)
    return ((z >> 40) & _LOW24).to(torch.float32) * (1.0 / (1 << 24))


def _words(keys: torch.Tensor, seed: int) -> torch.Tensor:
    """int32 [*]: the top 32 bits of SplitMix64 of each key (uniform words)."""
    return (splitmix64(keys, seed) >> 32).to(torch.int32)


def _column_hash(width: int, seed: int) -> torch.Tensor:
    """int32 [width]: an odd uniform word per column."""
    return _words(torch.arange(width, dtype=torch.int64), seed ^ _COLUMN_SALT) | 1


@functools.lru_cache(maxsize=64)
def _threshold(p: float) -> float:
    """The float32 value an entry's draw must reach to be kept: the ``p``
    quantile of int32, ``-2^31 + p * 2^32``, rounded to float32."""
    quantile = torch.tensor(-(1 << 31) + int(p * 2.0**32), dtype=torch.int64)
    return float(quantile.to(torch.float32))


def _draw(z: torch.Tensor, out: torch.Tensor, p: float) -> torch.Tensor:
    """``z`` (int32, the entries' products) -> ``out`` (float32, same shape):
    1.0 with probability ``1 - p``, else 0.0.

    Rounds ``z`` to float32 and keeps the entries at or above the ``p``
    quantile rounded alike (:func:`_threshold`). Rounding both sides moves
    the drop rate by at most 2^-24 from ``p``, and for ``p = 0.5`` the mask
    is exactly ``z >= 0``. Float ops throughout: a comparison into a bool
    tensor, and a float times a bool, each cost more than the whole float
    path.
    """
    out.copy_(z)
    return out.ge_(_threshold(p))


def _dense_dropout(
    h: torch.Tensor,
    p: float,
    row_hash: torch.Tensor,
    column_hash: torch.Tensor,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """``h [n, F] * keep / (1 - p)``, entry ``(i, j)`` drawn from
    ``row_hash[i] * column_hash[j]`` (int32 words).

    The draws are made a block of rows at a time: drawn whole, they would be a
    fresh n x F buffer per call, whose page faults slow the call down. An
    ``h`` that needs a gradient gets a float mask of ``0`` and ``1 / (1 - p)``,
    which autograd keeps for the backward. Any other ``h`` is multiplied block
    by block while the block's mask is still in the cache, with no whole mask
    at all. Both give the same values. ``out``, for an ``h`` that
    needs no gradient, receives the result (else a new tensor does).
    """
    rows = max(1, _MASK_BLOCK // max(1, h.shape[1]))
    draws = torch.empty(
        (min(rows, h.shape[0]), h.shape[1]), dtype=torch.int32, device=h.device
    )
    scale = 1.0 / (1.0 - p)
    grad = torch.is_grad_enabled() and h.requires_grad
    if out is None or grad:  # the mask, or h's
        out = torch.empty(h.shape, dtype=h.dtype, device=h.device)
    # The mask is drawn in float32 whatever h's dtype (the same mask for all).
    scratch = None
    if out.dtype != torch.float32:
        scratch = torch.empty(draws.shape, dtype=torch.float32, device=h.device)
    for start in range(0, h.shape[0], rows):
        end = min(start + rows, h.shape[0])
        z = draws[: end - start]
        torch.mul(row_hash[start:end].unsqueeze(1), column_hash, out=z)
        block = out[start:end]
        if scratch is None:
            keep = _draw(z, block, p)
            if grad:
                keep.mul_(scale)
            else:
                keep.mul_(h[start:end]).mul_(scale)
            continue
        keep = _draw(z, scratch[: end - start], p)
        if grad:
            block.copy_(keep).mul_(scale)
        else:
            torch.mul(h[start:end], keep, out=block).mul_(scale)
    return h * out if grad else out


def _mostly_zero(flat: torch.Tensor) -> bool:
    """Whether at most a quarter of a strided sample of ``flat`` is non-zero.

    It only picks the faster of two paths that give the same result (for a
    tensor that needs no gradient), so a sample will do: counting every entry
    of a hidden layer cost as much as the dropout itself.
    """
    sample = flat[:: max(1, flat.numel() // _DENSITY_SAMPLE)]
    return 4 * int(torch.count_nonzero(sample)) <= sample.numel()


def hashed_dropout(
    h: torch.Tensor,
    p: float,
    row_ids: torch.Tensor,
    seed: int,
    *,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """Inverted dropout of ``h`` with a mask fixed by ``(seed, row_ids, column)``.

    Only non-zero entries are hashed when ``h`` is mostly zeros (bag-of-words
    input features), as a zero stays zero either way; not when ``h`` needs a
    gradient, which a zero entry passes on only where it is kept.

    Args:
        h: float [n, F].
        p: drop probability in [0, 1).
        row_ids: int64 [n], the global node ID of each row.
        seed: mask seed (the trainer derives one per epoch and layer).
        out: optional float [n, F] (for an ``h`` that needs no gradient), not
            overlapping ``h``, to write the result into (a slice of a larger
            table, say) instead of a new tensor.

    Returns:
        float [n, F]: ``h * keep / (1 - p)`` (``out`` when given).
    """
    if out is not None:
        if out.shape != h.shape:
            raise ValueError(
                f"out: expected shape {tuple(h.shape)}, found {tuple(out.shape)}"
            )
        if torch.is_grad_enabled() and h.requires_grad:
            raise ValueError("out: only for an h that needs no gradient")
    if p == 0.0:
        return h if out is None else out.copy_(h)
    if row_ids.shape != (h.shape[0],):
        raise ValueError(
            f"row_ids: expected shape ({h.shape[0]},), found {tuple(row_ids.shape)}"
        )
    width = h.shape[1]
    row_hash = _words(row_ids.to(torch.int64), seed)
    column_hash = _column_hash(width, seed)
    flat = h.reshape(-1)
    if h.requires_grad or not _mostly_zero(flat):
        return _dense_dropout(h, p, row_hash, column_hash, out)
    nonzero = flat.detach().nonzero().view(-1)
    z = row_hash[nonzero // width] * column_hash[nonzero % width]
    keep = _draw(z, torch.empty(z.shape, dtype=torch.float32), p)
    mask = torch.full_like(flat, 1.0 / (1.0 - p))
    mask[nonzero[keep == 0]] = 0.0
    dropped = (flat * mask).view_as(h)
    return dropped if out is None else out.copy_(dropped)


def hashed_edge_dropout(
    alpha: torch.Tensor,
    p: float,
    src_ids: torch.Tensor,
    dst_ids: torch.Tensor,
    seed: int,
) -> torch.Tensor:
    """Inverted dropout of per-edge, per-head values (GAT's attention weights).

    Entry ``(e, k)`` is kept or dropped by ``(seed, src_ids[e], dst_ids[e], k)``
    alone: permuting the edges permutes the mask, and a worker that holds only
    some edges draws exactly their entries of the single-process mask. Parallel
    edges (same source and destination) share a mask.

    Args:
        alpha: float [E, H].
        p: drop probability in [0, 1).
        src_ids: int64 [E], global ID of each edge's source node.
        dst_ids: int64 [E], global ID of each edge's destination node.
        seed: mask seed (the model derives one per epoch and layer).

    Returns:
        float [E, H]: ``alpha * keep / (1 - p)``.
    """
    if p == 0.0:
        return alpha
    if alpha.dim() != 2:
        raise ValueError(f"alpha: expected [E, H], found {tuple(alpha.shape)}")
    num_edges = alpha.shape[0]
    for name, ids in (("src_ids", src_ids), ("dst_ids", dst_ids)):
        if ids.shape != (num_edges,):
            raise ValueError(
                f"{name}: expected shape ({num_edges},) (one per edge of alpha), "
                f"found {tuple(ids.shape)}"
            )
    # One full finaliser per edge (cheap next to the E x H entries) so that the
    # per-entry product with the head's word is the same draw as hashed_dropout's.
    mixed = torch.bitwise_xor(
        splitmix64(src_ids.to(torch.int64), seed),
        splitmix64(dst_ids.to(torch.int64), seed + _DST_OFFSET),
    )
    edge_hash = _words(mixed, seed ^ _EDGE_SALT)
    return _dense_dropout(alpha, p, edge_hash, _column_hash(alpha.shape[1], seed))
