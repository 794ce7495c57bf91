"""What a ViT does with padding masks and bad input (issue 19, items 4, 5, 6).

* Every pooling ignores padded tokens or refuses the mask (item 4).
* Bad input is a ValueError naming the argument, the value and what was expected; an image that is
  all padding is refused (item 5).
* Non-finite pixels are refused when ``model.check_finite`` is set (opt-in, item 6).
"""
import pytest
import torch

from vispe.models.vit import create_vit

TINY = dict(embed_dim=32, depth=2, num_heads=2, img_size=16, patch_size=4, num_classes=5)


def tiny(pe="sine", **kw):
    torch.manual_seed(0)
    m = create_vit("vit_pico", pe=pe, **{**TINY, **kw}).eval()
    with torch.no_grad():  # non-trivial weights everywhere (zero-initialised heads, latents...)
        for p in m.parameters():
            p.add_(torch.randn_like(p) * 0.05)
    return m


def _padded_pair():
    """An image on a 16x24 canvas, valid 12x16 at the top left; two different paddings."""
    img = torch.randn(1, 3, 12, 16)
    a, b = torch.zeros(1, 3, 16, 24), torch.randn(1, 3, 16, 24) * 5
    a[..., :12, :16] = img
    b[..., :12, :16] = img
    mask = torch.ones(1, 16, 24, dtype=torch.bool)
    mask[:, :12, :16] = False
    return a, b, mask


POOLS = [dict(global_pool="avg", class_token=False), dict(global_pool="avg", class_token=True),
         dict(global_pool="max", class_token=False), dict(global_pool="avgmax", class_token=False),
         dict(global_pool="map", class_token=False), dict(global_pool="map", class_token=True, reg_tokens=2),
         dict(global_pool="token", class_token=True, reg_tokens=1),
         dict(global_pool="avg", class_token=True, pool_include_prefix=True),
         dict(global_pool="max", class_token=True, reg_tokens=2, pool_include_prefix=True)]


@pytest.mark.parametrize("kw", POOLS, ids=lambda kw: "-".join(f"{k}={v}" for k, v in kw.items()))
def test_every_pooling_ignores_padded_pixels(kw):
    m = tiny(**kw)
    a, b, mask = _padded_pair()
    with torch.no_grad():
        la, lb = m(a, mask), m(b, mask)
        alone = m(a[..., :12, :16], torch.zeros(1, 12, 16, dtype=torch.bool))
    torch.testing.assert_close(la, lb, rtol=1e-4, atol=1e-5)  # only the padding changed
    torch.testing.assert_close(la, alone, rtol=1e-4, atol=1e-5)  # and it equals the image alone
    with torch.no_grad():  # a mask without padding changes nothing: timm's own pooling, options included
        torch.testing.assert_close(alone, m(a[..., :12, :16]), rtol=1e-5, atol=1e-6)
    assert (m(a) - la).abs().max() > 1e-4  # without the mask the padding is seen


def test_no_pooling_returns_every_token_and_valid_ones_ignore_the_padding():
    m = tiny(global_pool="", class_token=True)
    a, b, mask = _padded_pair()
    with torch.no_grad():
        ta, tb = m(a, mask), m(b, mask)  # (1, 1 + 4*6, classes)
    keep = torch.cat([torch.ones(1, 1, dtype=torch.bool), ~mask[:, ::4, ::4].flatten(1)], 1)[0]
    assert ta.shape == (1, 25, 5)
    torch.testing.assert_close(ta[:, keep], tb[:, keep], rtol=1e-4, atol=1e-5)


def test_a_pooling_that_cannot_honour_a_mask_refuses_it():
    m = tiny(global_pool="prr", class_token=False)
    a, _, mask = _padded_pair()
    with pytest.raises(ValueError, match="global_pool='prr'.*mask"):
        m(a, mask)
    assert torch.isfinite(m(a, torch.zeros_like(mask))).all()  # a mask with no padding is fine


def test_an_all_padding_image_is_refused():
    m = tiny()
    x = torch.randn(2, 3, 16, 16)
    mask = torch.zeros(2, 16, 16, dtype=torch.bool)
    mask[1] = True
    with pytest.raises(ValueError, match=r"mask\[1\] is all padding"):
        m(x, mask)


@pytest.mark.parametrize("x, mask, match", [
    (torch.randn(3, 16, 16), None, r"x has shape \(3, 16, 16\): expected \(B, C, H, W\)"),
    (torch.randn(1, 3, 0, 0), None, r"x has shape \(1, 3, 0, 0\): expected B, H and W of at least 1"),
    (torch.randn(1, 1, 16, 16), None, r"x has 1 channels.*expected in_chans=3"),
    (torch.randn(2, 3, 16, 16), torch.zeros(3, 16, 16, dtype=torch.bool), r"mask has shape \(3, 16, 16\): expected \(2, 16, 16\), one mask per image of x"),
    (torch.randn(2, 3, 16, 16), torch.zeros(2, 16, 12, dtype=torch.bool), r"mask has shape \(2, 16, 12\)"),
    ([[1.0]], None, r"x is a list: expected a torch.Tensor"),
], ids=["3d", "empty", "channels", "mask-batch", "mask-shape", "not-a-tensor"])
def test_bad_input_is_a_value_error_naming_it(x, mask, match):
    m = tiny("rope_axial")
    with pytest.raises(ValueError, match=match):
        m(x, mask)
    with pytest.raises(ValueError, match=match):  # the same checks on every entry point
        m.forward_intermediates(x, mask=mask)


def test_non_finite_pixels_are_refused_when_asked():
    m = tiny()
    x = torch.randn(3, 3, 16, 16)
    x[2, 0, 5, 5] = float("nan")
    x[0, 1, 0, 0] = float("inf")
    assert not torch.isfinite(m(x)).all()  # off by default (a cost per call): NaN flows through
    m.check_finite = True
    with pytest.raises(ValueError, match=r"x holds NaN or inf in image\(s\) \[0, 2\]"):
        m(x)
    mask = torch.zeros(3, 16, 16, dtype=torch.bool)
    mask[:, 4:] = True
    x = torch.randn(3, 3, 16, 16)
    x[:, :, 8:] = float("nan")  # NaN only in the padding: still refused (padded pixels go through the patch embedding)
    with pytest.raises(ValueError, match="NaN or inf"):
        m(x, mask)
    assert torch.isfinite(m(torch.randn(3, 3, 16, 16))).all()
