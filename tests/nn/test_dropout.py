"""Hashed dropout: a mask fixed by (seed, row ID, column), whoever computes it."""

from __future__ import annotations

import pytest
import torch

from graphwire.nn.dropout import hashed_dropout, hashed_uniform

_M = (1 << 64) - 1


def _splitmix(key: int, seed: int) -> float:
    z = (key + seed + 0x9E3779B97F4A7C15) & _M
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _M
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _M
    z ^= z >> 31
    return (z >> 40) / (1 << 24)


def test_uniform_is_splitmix64_with_logical_shifts() -> None:
    keys = [0, 1, 2, 7, 12_345_678_901, 2**62, 2**63 - 1]
    got = hashed_uniform(torch.tensor(keys), 5).tolist()
    assert got == [_splitmix(k, 5) for k in keys]


def test_uniform_statistics() -> None:
    u = hashed_uniform(torch.arange(200_000), 11)
    assert 0.0 <= float(u.min()) and float(u.max()) < 1.0
    counts = torch.histc(u, bins=10, min=0.0, max=1.0)
    expected = 20_000
    chi2 = float(((counts - expected) ** 2 / expected).sum())
    assert chi2 < 27.9  # 9 degrees of freedom, p = 0.001


@pytest.mark.parametrize("density", [1.0, 0.05])
def test_mask_depends_on_row_id_not_position(density: float) -> None:
    gen = torch.Generator().manual_seed(0)
    x = torch.rand(50, 12, generator=gen)
    x = x * (torch.rand(50, 12, generator=gen) < density)
    ids = torch.arange(100, 150)
    full = hashed_dropout(x, 0.5, ids, seed=3)
    perm = torch.randperm(50, generator=gen)
    part = hashed_dropout(x[perm[:20]], 0.5, ids[perm[:20]], seed=3)
    torch.testing.assert_close(part, full[perm[:20]], rtol=0, atol=0)
    other = hashed_dropout(x, 0.5, ids, seed=4)
    assert not torch.equal(full, other)


def test_dropout_rate_and_scale() -> None:
    x = torch.ones(400, 250)
    out = hashed_dropout(x, 0.3, torch.arange(400), seed=1)
    kept = out != 0
    assert abs(float(kept.float().mean()) - 0.7) < 0.01
    torch.testing.assert_close(out[kept], torch.full_like(out[kept], 1 / 0.7))


def test_row_ids_must_match_rows() -> None:
    with pytest.raises(ValueError, match="row_ids"):
        hashed_dropout(torch.ones(3, 2), 0.5, torch.arange(4), seed=0)
