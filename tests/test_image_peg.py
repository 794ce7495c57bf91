"""CPVT's PEG: padding modes, the valid ("none") mode, the padding mask, numerics, bad input."""
import pytest
import torch
import torch.nn.functional as F

import vispe

MODES = ["zeros", "reflect", "replicate", "circular", "none"]


def make(**kw):
    torch.manual_seed(0)
    return vispe.build("peg", **{"dim": 4, **kw})


def test_is_a_depthwise_convolution_returning_the_term_to_add():
    pe = make()
    assert pe.family == "conditional"
    x = torch.randn(2, 4, 3, 5)
    ref = F.conv2d(x, pe.proj.weight, pe.proj.bias, padding=1, groups=4)  # CPVT's PosCNN minus "+ x"
    torch.testing.assert_close(pe(x), ref)
    assert set(pe.state_dict()) == {"proj.weight", "proj.bias"}


@pytest.mark.parametrize("mode", ["circular", "reflect", "replicate"])
def test_border_free_padding_gives_a_constant_output_for_a_constant_input(mode):
    out = make(padding_mode=mode, kernel_size=3)(torch.ones(1, 4, 5, 6))
    assert torch.allclose(out, out[..., :1, :1].expand_as(out), atol=1e-6)


def test_zero_padding_reveals_the_border():
    out = make(padding_mode="zeros")(torch.ones(1, 4, 5, 6))
    inner = out[..., 1:-1, 1:-1]
    assert torch.allclose(inner, inner[..., :1, :1].expand_as(inner), atol=1e-6)  # interior constant
    assert not torch.allclose(out[..., 0, :], out[..., 2, :])  # the top row differs from the interior
    assert not torch.allclose(out[..., :, 0], out[..., :, 2])  # so does the left column


def test_none_mode_is_a_valid_convolution_zero_padded_back():
    pe = make(padding_mode="none", kernel_size=3)
    x = torch.randn(2, 4, 5, 6)
    out = pe(x)
    valid = F.conv2d(x, pe.proj.weight, pe.proj.bias, groups=4)  # (2, 4, 3, 4)
    torch.testing.assert_close(out[..., 1:-1, 1:-1], valid)
    assert out.shape == x.shape and out[..., 0, :].eq(0).all() and out[..., :, -1].eq(0).all()
    assert make(padding_mode="none", kernel_size=5)(torch.randn(1, 4, 3, 7)).eq(0).all()  # no window fits


def test_mask_zeroes_padding_and_zero_padding_is_batch_invariant():
    pe = make(padding_mode="zeros")
    assert pe.mask_aware and not make(padding_mode="reflect").mask_aware
    small = torch.randn(1, 4, 3, 4)
    big = torch.randn(2, 4, 5, 6)
    big[1, :, :3, :4] = small[0]
    mask = torch.zeros(2, 5, 6, dtype=torch.bool)
    mask[1, 3:] = True
    mask[1, :, 4:] = True
    out = pe(big, mask)
    torch.testing.assert_close(out[1, :, :3, :4], pe(small)[0])
    assert out[1][:, mask[1]].eq(0).all()  # zero on padding
    torch.testing.assert_close(out[0], pe(big[:1])[0])  # the unpadded image is untouched


@pytest.mark.parametrize("mode", MODES)
def test_forward_backward_finite_on_every_grid(mode):
    pe = make(padding_mode=mode)
    for h, w in [(1, 1), (1, 7), (7, 1), (2, 3), (32, 32)]:
        x = torch.randn(2, 4, h, w, requires_grad=True)
        mask = torch.zeros(2, h, w, dtype=torch.bool)
        mask[1, h // 2:] = True  # all-padding rows
        if mode == "reflect" and min(h, w) < 2:  # torch cannot reflect-pad a single cell
            with pytest.raises(ValueError, match="padding_mode='reflect' needs more than"):
                pe(x, mask)
            continue
        out = pe(x, mask)
        assert out.shape == x.shape and torch.isfinite(out).all()
        out.square().sum().backward()
        assert torch.isfinite(pe.proj.weight.grad).all()
        assert (x.grad is None and mode == "none") or torch.isfinite(x.grad).all()  # none: no window fits
        pe.zero_grad()


@pytest.mark.parametrize("mode", MODES)
def test_float32_and_bfloat16_agree(mode):
    pe = make(padding_mode=mode)
    x = torch.randn(1, 4, 6, 7)
    ref = pe(x)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        low = pe(x)
    torch.testing.assert_close(low.float(), ref, rtol=2e-2, atol=2e-2)


def test_bad_input_is_refused_naming_the_argument():
    with pytest.raises(ValueError, match="padding_mode='valid'"):
        make(padding_mode="valid")
    with pytest.raises(ValueError, match="kernel_size=4"):
        make(kernel_size=4)
    with pytest.raises(ValueError, match=r"x has shape \(1, 3, 5, 5\): expected \(B, 4, h, w\)"):
        make()(torch.randn(1, 3, 5, 5))
    with pytest.raises(ValueError, match=r"mask has shape \(1, 5, 4\)"):
        make()(torch.randn(1, 4, 5, 5), torch.zeros(1, 5, 4, dtype=torch.bool))
    with pytest.raises(ValueError, match="mask has batch 2"):
        make()(torch.randn(1, 4, 5, 5), torch.zeros(2, 5, 5, dtype=torch.bool))
