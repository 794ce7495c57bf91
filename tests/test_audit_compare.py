"""vispe.audit.compare: transformers' RT-DETR against OmDet-Turbo's 2D sin-cos (their hybrid encoders
built from configs with random weights; the whole OmDet-Turbo needs a CLIP text tower and task
prompts, so its encoder is compared, fed the same feature maps), and a vispe encoding against itself."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
import transformers as T
from transformers.models.omdet_turbo.modeling_omdet_turbo import OmDetTurboHybridEncoder
from transformers.models.rt_detr.modeling_rt_detr import RTDetrHybridEncoder

import vispe
from vispe.models.vit import create_vit

CH = [16, 32, 64]


def feats(x):  # three levels (strides 8, 16, 32) of CH channels from the image
    return [F.avg_pool2d(x, s).repeat(1, c // 3 + 1, 1, 1)[:, :c] for s, c in zip((8, 16, 32), CH, strict=True)]


@pytest.fixture(scope="module")
def encoders():
    torch.manual_seed(0)
    rt = RTDetrHybridEncoder(T.RTDetrConfig(encoder_hidden_dim=32, d_model=32, encoder_in_channels=CH,
                                            encoder_ffn_dim=64, encoder_layers=1)).eval()
    om = OmDetTurboHybridEncoder(T.OmDetTurboConfig(encoder_hidden_dim=32, encoder_in_channels=CH,
                                                    encoder_dim_feedforward=64, encoder_layers=1)).eval()
    return rt, om


def run(encoders, size):
    rt, om = encoders
    return vispe.audit.compare(rt, om, size=size, call=lambda m, x, mask: m(inputs_embeds=feats(x)),
                               call_b=lambda m, x, mask: m(inputs_embeddings=feats(x)))


def reference_sincos(h: int, w: int, dim: int, x_major: bool) -> torch.Tensor:
    """MAE-style 2D sin-cos, [sin y, cos y, sin x, cos x] row-major (RT-DETR after transformers #41380);
    x_major: [sin x, cos x, sin y, cos y] flattened x-major (OmDet-Turbo's meshgrid(w, h, 'ij')).  # (N, dim)"""
    omega = 1.0 / 10000 ** (torch.arange(dim // 4, dtype=torch.float64) / (dim // 4))
    y, x = torch.meshgrid(torch.arange(h, dtype=torch.float64), torch.arange(w, dtype=torch.float64), indexing="ij")
    if x_major:
        y, x = y.T, x.T
        first, second = x.flatten()[:, None] * omega, y.flatten()[:, None] * omega
    else:
        first, second = y.flatten()[:, None] * omega, x.flatten()[:, None] * omega
    return torch.cat([first.sin(), first.cos(), second.sin(), second.cos()], 1)


def test_rt_detr_vs_omdet_turbo_sincos_layout(encoders):
    c = run(encoders, (480, 640))
    assert c.grid == (15, 20)
    ref = (reference_sincos(15, 20, 32, False) - reference_sincos(15, 20, 32, True)).abs().max()
    assert c.max_abs == pytest.approx(float(ref), abs=1e-5) and c.max_abs > 1.9
    assert c.relation == "the other channel half and column-major tokens", c.text()
    assert "spatial_position_embeddings" in c.where[0] and "pos_embed" in c.where[1]
    square = run(encoders, (480, 480))
    assert square.grid == (15, 15) and square.max_abs < 1e-5 and square.relation == "nothing (equal)"


def test_vispe_encodings_compared_at_the_block_input():
    torch.manual_seed(0)
    kw = dict(img_size=32, patch_size=4, num_classes=10, depth=1, embed_dim=32, num_heads=2)
    yx = create_vit("vit_cifar", pe="sincos2d", **kw)
    c = vispe.audit.compare(yx, create_vit("vit_cifar", pe="sincos2d", **kw), size=(32, 64))
    assert c.grid == (8, 16) and c.relation == "nothing (equal)", c.text()
    c = vispe.audit.compare(yx, create_vit("vit_cifar", pe="none", **kw), size=(32, 64))
    assert c.relation == "none found" and c.max_abs > 0.5


def test_compare_refuses_a_bad_size(encoders):
    with pytest.raises(ValueError, match="size="):
        vispe.audit.compare(encoders[0], encoders[1], size=(480,))


def test_a_conversion_against_its_original():
    """convert_vit keeps timm's table and its resampling rule (antialias also when growing); compare
    finds the codes equal at the native size and grown to 8x16, and finds vispe's learned_abs default
    (antialias only when shrinking: torch's antialiased bicubic is another kernel, a=-0.5 against -0.75)
    apart there: the difference compare found before convert_vit took timm's rule."""
    import copy

    import timm

    from vispe.models.vit import convert_vit

    torch.manual_seed(0)
    timm_vit = timm.create_model("vit_tiny_patch16_224", img_size=64, patch_size=8, depth=1, num_classes=0,
                                 dynamic_img_size=True)
    converted = convert_vit(copy.deepcopy(timm_vit))
    for size in ((64, 64), (32, 32), (64, 128)):
        c = vispe.audit.compare(timm_vit, converted, size=size)
        assert c.relation == "nothing (equal)" and c.max_abs < 1e-6, c.text()
    shrink_only = convert_vit(copy.deepcopy(timm_vit), pe="learned_abs")  # vispe's default rule
    grown = vispe.audit.compare(timm_vit, shrink_only, size=(64, 128))
    assert grown.grid == (8, 16) and grown.relation == "none found" and grown.max_abs > 1e-3, grown.text()
