"""Hashed dropout: a mask fixed by (seed, row ID, column) or (seed, edge's source
and destination IDs, head), whoever computes it."""

from __future__ import annotations

import pytest
import torch

from graphwire.nn import dropout
from graphwire.nn.dropout import hashed_dropout, hashed_edge_dropout, hashed_uniform

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


def test_mask_entries_are_independent_across_rows_and_columns() -> None:
    # The cheap per-entry draw (row hash xor column hash, one multiply) must not
    # tie entries together: any two columns, and neighbouring rows, are
    # uncorrelated to within sampling noise (sd 1/sqrt(rows) ~ 0.0035).
    rows, width = 80_000, 64
    kept = hashed_dropout(torch.ones(rows, width), 0.5, torch.arange(rows), 9) != 0
    k = kept.to(torch.float64)
    assert abs(float(k.mean()) - 0.5) < 0.005
    centred = k - k.mean(0)
    corr = (centred.T @ centred) / rows / 0.25
    off_diagonal = corr - torch.diag(torch.diag(corr))
    assert float(off_diagonal.abs().max()) < 0.025  # ~7 sd over 2,016 pairs
    rows_corr = float(((k[0::2] - 0.5) * (k[1::2] - 0.5)).mean() / 0.25)
    assert abs(rows_corr) < 0.01


def test_sparse_and_dense_paths_draw_the_same_mask() -> None:
    gen = torch.Generator().manual_seed(1)
    x = torch.rand(300, 40, generator=gen) + 0.1  # dense: every entry non-zero
    sparse = x * (torch.rand(300, 40, generator=gen) < 0.1)  # sparse path
    ids = torch.arange(1000, 1300)
    dense_out = hashed_dropout(x, 0.4, ids, seed=5)
    sparse_out = hashed_dropout(sparse, 0.4, ids, seed=5)
    kept = sparse != 0
    torch.testing.assert_close(
        sparse_out[kept] != 0, dense_out[kept] != 0, rtol=0, atol=0
    )


def test_a_dense_mask_drawn_in_blocks_is_the_per_entry_mask(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The dense path draws a block of rows at a time; with blocks of 7 rows
    (the last one short), every entry is still the one the sparse path draws
    for it alone."""
    monkeypatch.setattr(dropout, "_MASK_BLOCK", 7 * 40 + 5)
    gen = torch.Generator().manual_seed(2)
    x = torch.rand(301, 40, generator=gen) + 0.1
    ids = torch.randperm(5000, generator=gen)[:301]
    dense_out = hashed_dropout(x, 0.4, ids, seed=8)
    kept = torch.zeros_like(x)
    for row in range(x.shape[0]):  # one non-zero entry per row: the sparse path
        for col in range(0, 40, 13):
            single = torch.zeros(1, 40)
            single[0, col] = 1.0
            kept[row, col] = hashed_dropout(single, 0.4, ids[row : row + 1], 8)[0, col]
    picked = kept != 0
    checked = torch.zeros_like(picked)
    checked[:, ::13] = True
    assert torch.equal(picked[checked], dense_out[checked] != 0)
    torch.testing.assert_close(dense_out[checked & picked], x[checked & picked] / 0.6)


def test_with_and_without_a_gradient_the_dense_path_gives_the_same_values(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Without a gradient the dense path multiplies block by block and keeps
    no mask; with one it keeps a float mask for autograd. Over blocks of 7
    rows (the last one short) and a transposed input, both give bitwise the
    same output, the gradient is that mask, and non-finite entries come out
    as the product with the mask would make them."""
    monkeypatch.setattr(dropout, "_MASK_BLOCK", 7 * 40 + 5)
    gen = torch.Generator().manual_seed(3)
    x = torch.randn(40, 101, generator=gen).T  # [101, 40], not contiguous
    x[0, :3] = torch.tensor([float("inf"), float("nan"), -0.0])
    ids = torch.randperm(9000, generator=gen)[:101]
    plain = hashed_dropout(x, 0.4, ids, seed=2)
    leaf = x.detach().clone().requires_grad_(True)
    tracked = hashed_dropout(leaf, 0.4, ids, seed=2)
    assert tracked.requires_grad and not plain.requires_grad
    assert torch.equal(plain.isnan(), tracked.isnan())
    finite = ~plain.isnan()
    assert torch.equal(plain[finite], tracked.detach()[finite])
    assert torch.equal(plain[finite].signbit(), tracked.detach()[finite].signbit())
    tracked.sum().backward()
    mask = hashed_dropout(torch.ones(101, 40), 0.4, ids, seed=2)
    assert leaf.grad is not None and torch.equal(leaf.grad, mask)


@pytest.mark.parametrize("rows", [1, 300])
def test_a_zero_entry_that_needs_a_gradient_gets_the_mask(rows: int) -> None:
    """A mostly-zero tensor that needs a gradient takes the dense path: a zero
    entry stays zero either way, but its gradient is the mask, 0 where the
    entry is dropped. (A G3 bin of one GAT row whose attention edges were all
    dropped is such a tensor; the whole layer, in one process, is not.)"""
    ids = torch.arange(7, 7 + rows)
    h = torch.zeros(rows, 64, requires_grad=True)
    hashed_dropout(h, 0.6, ids, seed=3).sum().backward()
    mask = hashed_dropout(torch.ones(rows, 64), 0.6, ids, seed=3)
    assert h.grad is not None and bool((mask == 0).any())
    assert torch.equal(h.grad, mask)


def _edges(num_edges: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    src = torch.randint(0, 10**9, (num_edges,), generator=gen)
    dst = torch.randint(0, 10**9, (num_edges,), generator=gen)
    return src, dst


def test_edge_dropout_rate_and_scale() -> None:
    src, dst = _edges(20_000, 0)
    p, heads = 0.6, 8
    out = hashed_edge_dropout(torch.ones(20_000, heads), p, src, dst, seed=2)
    kept = out != 0
    # Binomial: the kept fraction of n draws has sd sqrt(p (1 - p) / n), 0.0012
    # over all entries and 0.0035 per head; allow 5 sd.
    sd = (p * (1 - p) / kept.numel()) ** 0.5
    assert abs(float(kept.float().mean()) - (1 - p)) < 5 * sd
    sd_head = (p * (1 - p) / kept.shape[0]) ** 0.5
    for k in range(heads):  # every head on its own as well
        assert abs(float(kept[:, k].float().mean()) - (1 - p)) < 5 * sd_head
    torch.testing.assert_close(out[kept], torch.full_like(out[kept], 1 / (1 - p)))
    assert hashed_edge_dropout(out, 0.0, src, dst, seed=2) is out


def test_edge_mask_follows_the_edge_not_its_position() -> None:
    src, dst = _edges(3_000, 1)
    alpha = torch.rand(3_000, 4, generator=torch.Generator().manual_seed(1)) + 0.1
    full = hashed_edge_dropout(alpha, 0.5, src, dst, seed=7)
    perm = torch.randperm(3_000, generator=torch.Generator().manual_seed(2))
    permuted = hashed_edge_dropout(alpha[perm], 0.5, src[perm], dst[perm], seed=7)
    torch.testing.assert_close(permuted, full[perm], rtol=0, atol=0)
    # A worker holding a subset of the edges draws their entries of the mask.
    some = perm[:500]
    part = hashed_edge_dropout(alpha[some], 0.5, src[some], dst[some], seed=7)
    torch.testing.assert_close(part, full[some], rtol=0, atol=0)
    again = hashed_edge_dropout(alpha, 0.5, src, dst, seed=7)
    torch.testing.assert_close(again, full, rtol=0, atol=0)


def test_edge_mask_differs_by_seed_head_and_direction() -> None:
    src, dst = _edges(4_000, 3)
    ones = torch.ones(4_000, 2)
    kept = hashed_edge_dropout(ones, 0.5, src, dst, seed=1) != 0
    other_seed = hashed_edge_dropout(ones, 0.5, src, dst, seed=2) != 0
    reversed_ = hashed_edge_dropout(ones, 0.5, dst, src, seed=1) != 0
    # Unrelated masks agree on half the entries (sd 0.0056 over 8,000).
    for other in (other_seed, reversed_):
        assert abs(float((kept == other).float().mean()) - 0.5) < 0.03
    assert abs(float((kept[:, 0] == kept[:, 1]).float().mean()) - 0.5) < 0.03


def test_edge_ids_must_match_edges() -> None:
    with pytest.raises(ValueError, match="dst_ids"):
        hashed_edge_dropout(torch.ones(3, 2), 0.5, torch.arange(3), torch.arange(4), 0)
    with pytest.raises(ValueError, match=r"alpha: expected \[E, H\]"):
        hashed_edge_dropout(torch.ones(3), 0.5, torch.arange(3), torch.arange(3), 0)


@pytest.mark.parametrize("p", [0.5, 0.3, 0.1])
def test_the_mask_is_the_entry_draw_against_the_quantile(p: float) -> None:
    """An entry is kept when the int32 product of its row's and its column's
    words (the top 32 bits of their SplitMix64 hashes, the column's made odd)
    reaches the ``p`` quantile of int32, compared in float32 (both sides
    rounded): for ``p = 0.5`` exactly the int32 comparison, for any ``p``
    different from it only where the draw rounds to the threshold itself."""
    rows, width, seed = 3000, 70, 4
    ids = torch.arange(rows) * 7 + 3
    out = hashed_dropout(torch.ones(rows, width), p, ids, seed)
    row = dropout.splitmix64(ids, seed) >> 32
    column = dropout.splitmix64(torch.arange(width), seed ^ dropout._COLUMN_SALT)
    draw = row.unsqueeze(1) * ((column >> 32) | 1)  # in int64: no wrap yet
    draw = (draw + (1 << 31)) % (1 << 32) - (1 << 31)  # mod 2^32, as int32
    quantile = -(1 << 31) + int(p * 2.0**32)
    exact = draw >= quantile
    ties = draw.to(torch.float32) == torch.tensor(quantile).to(torch.float32)
    assert torch.equal((out != 0)[~ties], exact[~ties])
    if p == 0.5:
        assert torch.equal(out != 0, draw >= 0)


@pytest.mark.parametrize("density", [1.0, 0.05])
@pytest.mark.parametrize("p", [0.0, 0.4])
def test_out_receives_the_same_values(density: float, p: float) -> None:
    """``out=`` (a slice of a larger table) gets bitwise what a new tensor
    would, on the dense and the sparse path and with ``p = 0``; the rest of
    the table is left alone."""
    gen = torch.Generator().manual_seed(4)
    x = torch.rand(90, 30, generator=gen) * (
        torch.rand(90, 30, generator=gen) < density
    )
    ids = torch.arange(500, 590)
    table = torch.full((100, 30), 7.0)
    got = hashed_dropout(x, p, ids, 6, out=table[5:95])
    assert got.data_ptr() == table[5:95].data_ptr()
    assert torch.equal(table[5:95], hashed_dropout(x, p, ids, 6))
    assert bool((table[:5] == 7.0).all()) and bool((table[95:] == 7.0).all())


def test_out_is_refused_for_a_wrong_shape_or_a_gradient() -> None:
    ids = torch.arange(4)
    with pytest.raises(ValueError, match="out: expected shape"):
        hashed_dropout(torch.ones(4, 3), 0.5, ids, 0, out=torch.empty(4, 2))
    leaf = torch.ones(4, 3, requires_grad=True)
    with pytest.raises(ValueError, match="no gradient"):
        hashed_dropout(leaf, 0.5, ids, 0, out=torch.empty(4, 3))


@pytest.mark.parametrize("dtype", [torch.float64, torch.bfloat16])
def test_the_mask_does_not_depend_on_the_dtype(dtype: torch.dtype) -> None:
    """The mask is drawn in float32 for any input: a float64 or bfloat16 row
    keeps the same entries as its float32 copy, with and without a gradient."""
    gen = torch.Generator().manual_seed(5)
    x = torch.rand(120, 33, generator=gen) + 0.5
    ids = torch.arange(120) * 11
    reference = hashed_dropout(x, 0.3, ids, 2) != 0
    plain = hashed_dropout(x.to(dtype), 0.3, ids, 2)
    leaf = x.to(dtype).requires_grad_(True)
    tracked = hashed_dropout(leaf, 0.3, ids, 2)
    assert plain.dtype == dtype and tracked.dtype == dtype
    assert torch.equal(plain != 0, reference)
    assert torch.equal(tracked.detach() != 0, reference)
