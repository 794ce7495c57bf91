"""Attention inside index sets (vispe.kernels.grouped): the windows of a frame as index sets equal SDPA
with the same-window mask (outputs and gradients), the flex document mask equals it too (forward, CPU),
the windows tile the grid as ``y // size, x // size`` does, and bad partitions are refused by name."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from vispe.attention import Attention, PosContext
from vispe.kernels.grouped import TokenGroups, windows
from vispe.registry import build


def same_window(shape, size):
    """The reference relation: cells (y, x) and (y', x') share a window when y // size and x // size agree."""
    h, w = shape
    y, x = torch.meshgrid(torch.arange(h), torch.arange(w), indexing="ij")
    win = ((y // size) * w + x // size).flatten()  # (h*w,)
    return win[:, None] == win[None, :]  # (L, L)


@pytest.mark.parametrize("shape, size", [((10, 6), 4), ((8, 8), 4), ((3, 9), 4), ((1, 7), 3), ((5, 1), 2), ((2, 2), 4)])
def test_windows_tile_the_grid_as_integer_division_does(shape, size):
    sets = windows(shape, size)
    groups = TokenGroups(sets, shape[0] * shape[1])
    gid = groups.group_id()
    torch.testing.assert_close(gid[:, None] == gid[None, :], same_window(shape, size), rtol=0, atol=0)
    for s in sets:  # cells row-major inside each window (the order does not change attention, it is documented)
        assert (s.diff(dim=1) > 0).all()


@pytest.mark.parametrize("shape, size", [((10, 6), 4), ((7, 5), 3)])
def test_gathered_windows_equal_sdpa_with_the_window_mask_and_their_gradients(shape, size):
    g = torch.Generator().manual_seed(0)
    L = shape[0] * shape[1]
    q, k, v = (torch.randn(3, 2, L, 8, generator=g, dtype=torch.float64, requires_grad=True) for _ in range(3))
    groups = TokenGroups(windows(shape, size), L)
    assert not groups.identity
    got = groups.attend(q, k, v)
    want = F.scaled_dot_product_attention(q, k, v, attn_mask=same_window(shape, size))
    torch.testing.assert_close(got, want, rtol=0, atol=1e-12)
    w = torch.randn(got.shape, generator=g, dtype=torch.float64)
    ga = torch.autograd.grad((got * w).sum(), (q, k, v))
    gb = torch.autograd.grad((want * w).sum(), (q, k, v))
    for a, b in zip(ga, gb, strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-12)


def test_flex_document_mask_equals_the_window_mask_forward_on_the_cpu():
    shape, size = (6, 10), 4
    L = shape[0] * shape[1]
    g = torch.Generator().manual_seed(1)
    q, k, v = (torch.randn(2, 2, L, 8, generator=g) for _ in range(3))
    with torch.no_grad():
        got = TokenGroups(windows(shape, size), L, impl="flex").attend(q, k, v)
    want = F.scaled_dot_product_attention(q, k, v, attn_mask=same_window(shape, size))
    torch.testing.assert_close(got, want, rtol=0, atol=1e-5)
    with pytest.raises(ValueError, match="impl='flex' on the CPU needs torch.no_grad"):
        TokenGroups(windows(shape, size), L, impl="flex").attend(q.requires_grad_(True), k, v)


def test_attention_takes_groups_after_the_rotary_encoding():
    """Through vispe's Attention with rope_axial: the windows see each token's own cell's angles."""
    torch.manual_seed(0)
    attn = Attention(16, 2, qkv_bias=True, pe=build("rope_axial", head_dim=8, num_heads=2)).eval()
    shape = (6, 5)
    x = torch.randn(2, 30, 16)
    ctx = PosContext(shape)
    with torch.no_grad():
        got = attn(x, attn_mask=TokenGroups(windows(shape, 4), 30), ctx=ctx)
        want = attn(x, attn_mask=same_window(shape, 4), ctx=ctx)
    torch.testing.assert_close(got, want, rtol=0, atol=1e-6)
    with pytest.raises(ValueError, match="attn_mask is a TokenGroups"):
        attn(x, attn_mask=TokenGroups(windows(shape, 4), 30), ctx=PosContext(shape, mask=torch.zeros(2, 6, 5).bool()))


def test_a_set_that_is_not_a_partition_is_refused():
    with pytest.raises(ValueError, match=r"expected every index in \[0, 6\) exactly once"):
        TokenGroups([torch.tensor([[0, 1, 2], [2, 3, 4]])], 6)
    with pytest.raises(ValueError, match=r"expected every index in \[0, 4\) exactly once"):
        TokenGroups([torch.tensor([[0, 1], [2, 4]])], 4)
    with pytest.raises(ValueError, match="sets: expected a non-empty list"):
        TokenGroups([], 4)
    with pytest.raises(ValueError, match="impl='fast'"):
        TokenGroups([torch.tensor([[0, 1]])], 2, impl="fast")
    with pytest.raises(ValueError, match="expected 6"):
        TokenGroups(windows((2, 3), 2), 6).attend(*(torch.randn(1, 1, 5, 4) for _ in range(3)))
