"""Every vispe model refuses the same bad input with the same words (issue 28, item 6).

The rules live in one place (``vispe._checks.images``): the ViT, timm's Eva converted by vispe and
DETR call it, each under its own argument name (``x``, ``images``). Before, DETR accepted an
all-padding mask silently, had no ``check_finite`` (an inf pixel gave non-finite outputs), and a
uint8 image reached torch's convolution in the ViT (a raw dtype error).
"""
from __future__ import annotations

import pytest
import torch

from vispe.models.detr import create_detr
from vispe.models.vit import create_vit

DETR_SMALL = dict(backbone="small_cnn", backbone_widths=(8, 16, 16, 32), d_model=32, nheads=4, enc_layers=1,
                  dec_layers=1, dim_feedforward=64, num_queries=4, dropout=0.0)


def vit():
    torch.manual_seed(0)
    return create_vit("vit_pico", pe="rope_axial", embed_dim=32, depth=1, num_heads=2, img_size=16, patch_size=4,
                      num_classes=3).eval()


def eva():
    timm = pytest.importorskip("timm")
    from vispe.models.eva import convert_eva

    torch.manual_seed(0)
    m = timm.create_model("eva02_tiny_patch14_224", pretrained=False, img_size=16, patch_size=4, embed_dim=32,
                          depth=1, num_heads=2, num_classes=3, dynamic_img_size=True)
    return convert_eva(m, "rope_axial").eval()


def detr():
    torch.manual_seed(0)
    return create_detr(3, pe="sine", **DETR_SMALL).eval()


MODELS = {"vit": (vit, "x"), "eva": (eva, "x"), "detr": (detr, "images")}


@pytest.fixture(params=list(MODELS), scope="module")
def model(request):
    build, name = MODELS[request.param]
    return build(), name


def _mask(b=2, h=16, w=16):
    return torch.zeros(b, h, w, dtype=torch.bool)


@pytest.mark.parametrize("case", ["uint8", "all_padding", "mask_batch", "empty", "channels", "3d"])
def test_bad_input_is_refused_with_the_same_words_by_every_model(model, case):
    m, name = model
    x = torch.randn(2, 3, 16, 16)
    all_padding = _mask()
    all_padding[1] = True
    x_in, mask, match = {
        "uint8": ((x * 40 + 128).clamp(0, 255).to(torch.uint8), None,
                  rf"{name} has dtype torch.uint8: expected a floating-point tensor .*{name}.float\(\) / 255"),
        "all_padding": (x, all_padding, r"mask\[1\] is all padding: expected at least one valid \(False\) pixel"),
        "mask_batch": (x, _mask(3), rf"mask has shape \(3, 16, 16\): expected \(2, 16, 16\), one mask per image of {name}"),
        "empty": (x[:0], None, rf"{name} has shape \(0, 3, 16, 16\): expected B, H and W of at least 1"),
        "channels": (x[:, :1], None, rf"{name} has 1 channels \(shape \(2, 1, 16, 16\)\): expected in_chans=3"),
        "3d": (x[0], None, rf"{name} has shape \(3, 16, 16\): expected \(B, C, H, W\)"),
    }[case]
    with pytest.raises(ValueError, match=match):
        m(x_in, mask)


def test_non_finite_pixels_are_refused_when_asked_by_every_model(model):
    m, name = model
    x = torch.randn(3, 3, 16, 16)
    x[2, 0, 5, 5] = float("inf")
    x[0, 1, 0, 0] = float("nan")
    with torch.no_grad():
        out = m(x)
    out = out["pred_boxes"] if isinstance(out, dict) else out
    assert not torch.isfinite(out).all()  # off by default (one pass over the input per call): it flows through
    m.check_finite = True
    try:
        with pytest.raises(ValueError, match=rf"{name} holds NaN or inf in image\(s\) \[0, 2\]"):
            m(x)
        with torch.no_grad():
            clean = m(torch.randn(3, 3, 16, 16), _mask(3))
        clean = clean["pred_boxes"] if isinstance(clean, dict) else clean
        assert torch.isfinite(clean).all()
    finally:
        m.check_finite = False
