"""ComRoPE on a grid: its rotations come from the grid's rows and columns (h + w exponentials, not
h w), in eager mode and while torch.compile / torch.export record, where ``torch.unique`` cannot
find the distinct coordinates (per token there before: 1.10x eager's step time compiled, 0.78x
now, results/bench_compile.md). The same numbers as the per-token evaluation, and the per-token
evaluation wherever the coordinates are not separable (a padding mask, per-token jitter)."""
from __future__ import annotations

from unittest import mock

import pytest
import torch

from vispe import lie
from vispe.image.comrope import ComRoPE

GRID = (3, 5)  # non-square: a y/x swap cannot cancel


def _exponentials(pe, *args, tracing=False, **kw):
    """The output, and the number of matrices per head and block each ``lie.expm`` call took."""
    sizes, expm = [], lie.expm

    def counting(a):
        sizes.append(a.shape[0])
        return expm(a)

    with mock.patch.object(lie, "expm", counting), mock.patch("vispe._tracing.is_tracing", return_value=tracing):
        out = pe(*args, **kw)
    return out, sizes


@pytest.mark.parametrize("variant", ["ld", "ap"])
@pytest.mark.parametrize("tracing", [False, True])
def test_grid_rotations_come_from_rows_and_columns_and_equal_the_per_token_ones(variant, tracing):
    torch.manual_seed(0)
    pe = ComRoPE(16, 2, variant=variant, block_size=4)
    got, sizes = _exponentials(pe, GRID, tracing=tracing)  # (1, H, N, nb, b, b)
    assert sorted(sizes) == [3, 5]  # one exponential per row and per column
    coords, _ = pe.token_coords(GRID, None, torch.device("cpu"))  # (1, N, 2)
    per_token, token_sizes = _exponentials(pe.angles, coords * pe.scale, tracing=True)
    assert token_sizes == [15, 15]  # what tracing computed before
    # the same matrices; eager vispe.lie.expm scales a whole batch by one power of two (its largest
    # norm's), so the 3 rows, the 5 columns and the 15 tokens may round differently (issue 52)
    torch.testing.assert_close(got, per_token, rtol=0, atol=0 if tracing else 2e-6)


def test_a_padding_mask_or_jitter_keeps_the_per_token_rotations():
    torch.manual_seed(0)
    pe = ComRoPE(16, 2, block_size=4)
    mask = torch.zeros(2, *GRID, dtype=torch.bool)
    mask[1, :, 3:] = True  # a padded column counts y from 0: not separable
    got, sizes = _exponentials(pe, GRID, mask, tracing=True)
    assert sizes == [30, 30]
    alone = pe((GRID[0], 3))  # image 1's valid part alone
    torch.testing.assert_close(got[1:].unflatten(2, GRID)[:, :, :, :3], alone.unflatten(2, (GRID[0], 3)),
                               rtol=0, atol=1e-6)
    jittered = ComRoPE(16, 2, block_size=4, jitter=0.1).train()
    _, sizes = _exponentials(jittered, GRID, tracing=True)
    assert sizes == [15, 15]
