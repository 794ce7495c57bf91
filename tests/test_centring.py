"""Centred fixed codes (issue 27): ``center=True`` of sine, sincos2d, axis2d (sinusoidal), normidx2d.

The centred code is the uncentred one minus its mean over each image's valid tokens (padding 0)
when the encoding is mask-aware and given a mask, else minus its grid mean; the finding it fixes
(a constant part larger than the varying one at 8x8) is pinned; batch invariance, sine's ``at``,
float32 math under bf16 autocast and the errors.
"""
from __future__ import annotations

import pytest
import torch

import vispe

DIM = 16
#: mask-aware centred builds: (name, kwargs)
AWARE = [("sine", {}), ("sine", dict(normalize=False)), ("sincos2d", dict(mask_aware=True)),
         ("axis2d", dict(mask_aware=True, coords="normalized", compose="sum")),
         ("normidx2d", dict(mask_aware=True, project=False))]
IDS = [n + "".join(f"-{k}={v}" for k, v in kw.items()) for n, kw in AWARE]


def build(name, center=True, **kw):
    torch.manual_seed(0)
    dim = 2 if kw.get("project") is False else DIM
    return vispe.build(name, dim=dim, center=center, **kw).eval()


def padded_mask():
    mask = torch.zeros(3, 6, 7, dtype=torch.bool)
    mask[0, 4:] = True
    mask[0, :, 5:] = True  # image 0: 4x5 valid at the top left
    mask[1, :2] = True
    mask[1, :, :3] = True  # image 1: 4x4 valid at the bottom right
    return mask  # image 2: no padding


@pytest.mark.parametrize("name, kw", AWARE, ids=IDS)
def test_centred_is_the_code_minus_its_valid_mean_and_padding_is_zero(name, kw):
    mask = padded_mask()
    got = build(name, **kw)((6, 7), mask)  # (3, 42, C)
    raw = build(name, center=False, **kw)((6, 7), mask)
    valid = (~mask).flatten(1)
    for b in range(3):
        v = valid[b]
        want = raw[b, v] - raw[b, v].mean(0)  # reference: written out per image
        torch.testing.assert_close(got[b, v], want, rtol=0, atol=1e-6)
        assert got[b, v].mean(0).abs().max() < 1e-6  # zero mean over the valid area
        assert (got[b, ~v] == 0).all()  # padding tokens: 0
        assert got[b, v].abs().max() > 0.1  # not vacuous
    assert not torch.allclose(got[0, valid[0]], got[2, valid[0]])  # each image its own mean


@pytest.mark.parametrize("name, kw", AWARE, ids=IDS)
def test_an_image_padded_in_a_batch_keeps_its_centred_code(name, kw):
    pe = build(name, **kw)
    mask = padded_mask()
    both = pe((6, 7), mask).reshape(3, 6, 7, -1)
    torch.testing.assert_close(both[0, :4, :5], pe((4, 5))[0].reshape(4, 5, -1), rtol=0, atol=1e-6)
    torch.testing.assert_close(both[1, 2:, 3:], pe((4, 4))[0].reshape(4, 4, -1), rtol=0, atol=1e-6)
    torch.testing.assert_close(both[2], pe((6, 7))[0].reshape(6, 7, -1), rtol=0, atol=1e-6)


@pytest.mark.parametrize("name, kw", [("sincos2d", {}), ("axis2d", {}), ("normidx2d", dict(project=False))])
def test_an_encoding_that_ignores_the_mask_is_centred_over_the_grid(name, kw):
    pe, raw = build(name, **kw), build(name, center=False, **kw)
    mask = padded_mask()
    got = pe((6, 7), mask)
    grid = raw((6, 7))[0]
    torch.testing.assert_close(got, (grid - grid.mean(0)).expand_as(got), rtol=0, atol=1e-6)


def test_no_mask_is_the_grid_mean_and_all_valid_mask_is_the_same():
    for name, kw in AWARE:
        pe = build(name, **kw)
        a = pe((5, 3))
        assert a[0].mean(0).abs().max() < 1e-6
        torch.testing.assert_close(pe((5, 3), torch.zeros(2, 5, 3, dtype=torch.bool)), a.expand(2, -1, -1))


def test_the_finding_constant_part_of_an_8x8_sincos_code():
    """At 8x8 tokens, 64 channels, temperature 10000: a constant part of RMS 0.65 against 0.28 varying;
    the centred code keeps the varying part and drops the constant."""
    raw = vispe.build("sincos2d", dim=64)((8, 8))[0]  # (64, 64)
    const = raw.mean(0)
    assert const.square().mean().sqrt().item() == pytest.approx(0.65, abs=0.005)
    assert (raw - const).square().mean().sqrt().item() == pytest.approx(0.28, abs=0.005)
    assert (raw.std(0) < 0.05).sum() == 40  # 40 of 64 channels barely vary over the grid
    centred = vispe.build("sincos2d", dim=64, center=True)((8, 8))[0]
    torch.testing.assert_close(centred, raw - const, rtol=0, atol=1e-6)
    sine = vispe.build("sine", dim=64)((8, 8))[0]
    assert sine.mean(0).square().mean().sqrt() > 2 * (sine - sine.mean(0)).square().mean().sqrt()


def test_normidx2d_centres_the_index_before_the_projection():
    pe = build("normidx2d", mask_aware=True)
    mask = padded_mask()
    got = pe((6, 7), mask)
    bias = pe.proj.bias.detach()
    valid = (~mask).flatten(1)
    for b in range(3):
        torch.testing.assert_close(got[b, valid[b]].mean(0), bias, rtol=0, atol=1e-6)  # the learned mean stays
        torch.testing.assert_close(got[b, ~valid[b]], bias.expand(int((~valid[b]).sum()), -1))  # padding: index 0


def test_sine_at_is_consistent_with_the_centred_grid():
    pe = vispe.build("sine", dim=DIM, center=True, offset=-0.5, eps=0.0)
    for h, w in ((3, 5), (4, 4)):
        u = torch.stack(torch.meshgrid((torch.arange(h) + 0.5) / h, (torch.arange(w) + 0.5) / w, indexing="ij"), -1)
        torch.testing.assert_close(pe.at(u.reshape(1, -1, 2), torch.tensor([[h, w]])), pe((h, w)), rtol=0, atol=1e-6)
    # per image: two extents in one call, each minus its own grid's mean
    u = torch.rand(2, 6, 2)
    got = pe.at(u, torch.tensor([[3.0, 5.0], [4.0, 4.0]]))
    raw = vispe.build("sine", dim=DIM, offset=-0.5, eps=0.0)
    for b, (h, w) in enumerate(((3, 5), (4, 4))):
        torch.testing.assert_close(got[b], raw.at(u[b:b + 1])[0] - raw((h, w))[0].mean(0), rtol=0, atol=1e-6)
    # DETR's offset 0: at and the grid share the mean (at's code at the grid's positions)
    detr = vispe.build("sine", dim=DIM, center=True)
    h, w = 3, 5
    pos = torch.stack(torch.meshgrid((torch.arange(h) + 1) / (h + 1e-6), (torch.arange(w) + 1) / (w + 1e-6),
                                     indexing="ij"), -1)
    torch.testing.assert_close(detr.at(pos.reshape(1, -1, 2), torch.tensor([[h, w]])), detr((h, w)), rtol=0, atol=1e-5)


def test_sine_at_needs_a_whole_extent_when_centred():
    pe = vispe.build("sine", dim=DIM, center=True)
    with pytest.raises(ValueError, match="extent=None with center=True"):
        pe.at(torch.rand(1, 3, 2))
    with pytest.raises(ValueError, match=r"extent \(3.5, 4\)"):
        pe.at(torch.rand(1, 3, 2), torch.tensor([[3.5, 4.0]]))
    vispe.build("sine", dim=DIM).at(torch.rand(1, 3, 2))  # uncentred: no extent needed, as before


@pytest.mark.parametrize("name, kw", AWARE, ids=IDS)
def test_float32_math_under_bf16_autocast(name, kw):
    pe = build(name, **kw)
    mask = padded_mask()
    for m in (None, mask):
        ref = pe((6, 7), m)
        pe._cache.clear()
        with torch.autocast("cpu", dtype=torch.bfloat16):
            low = pe((6, 7), m, dtype=torch.bfloat16)
        assert low.dtype == torch.bfloat16 and torch.equal(low, ref.to(torch.bfloat16))


def test_center_off_is_unchanged():
    """The default (no ``center`` given) is the uncentred code, as before issue 27."""
    mask = padded_mask()
    for name, kw in AWARE:
        torch.manual_seed(0)
        default = vispe.build(name, dim=2 if kw.get("project") is False else DIM, **kw)
        off = build(name, center=False, **kw)
        assert default.center is False
        assert torch.equal(default((6, 7), mask), off((6, 7), mask))
        assert not torch.allclose(default((6, 7), mask), build(name, **kw)((6, 7), mask))


BAD = [("sine", dict(center="yes"), "center='yes'"), ("sincos2d", dict(center=1), "center=1"),
       ("normidx2d", dict(center=None), "center=None"),
       ("axis2d", dict(axis="learned", grid=(4, 4), center=True), "center=True: only applies to axis='sinusoidal'")]


@pytest.mark.parametrize("name, kw, needle", BAD, ids=[b[0] + "-" + b[2] for b in BAD])
def test_bad_center_names_the_argument(name, kw, needle):
    with pytest.raises(ValueError, match=needle):
        vispe.build(name, dim=DIM, **kw)


def test_the_docs_state_normidx2d_centring_as_the_code_does():
    """issue 41, item 10: the README (now docs/conventions.md) said center=True of normidx2d subtracts the code's mean; the code
    centres the index before the learned projection, whose bias stays the mean (decided: a learned
    constant is the model's to keep; subtracting it would leave the bias without a gradient)."""
    from pathlib import Path

    readme = " ".join((Path(__file__).resolve().parents[1] / "docs" / "conventions.md").read_text().split())
    assert "`center=True` of `sine`, `sincos2d` and `axis2d` (sinusoidal) subtracts the code's mean" in readme
    assert ("`normidx2d` centres its index the same way, before its learned projection, whose bias stays: the "
            "code's mean is that learned constant (0 with `project=False`)") in readme
    torch.manual_seed(0)
    pe = vispe.build("normidx2d", dim=8, center=True)
    torch.nn.init.normal_(pe.proj.bias)
    code = pe((5, 7))[0]  # (35, 8)
    torch.testing.assert_close(code.mean(0), pe.proj.bias.detach(), rtol=0, atol=1e-6)
    assert pe.proj.bias.abs().min() > 0.01  # so the mean is not 0
    raw = vispe.build("normidx2d", dim=2, project=False, center=True)((5, 7))[0]
    torch.testing.assert_close(raw.mean(0), torch.zeros(2), rtol=0, atol=1e-6)
