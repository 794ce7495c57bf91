"""Deformable DETR's decoder layer and two-stage helpers (vispe.models.detr.transformer.deformable_decoder) against
transformers' DeformableDetrDecoderLayer, gen_encoder_output_proposals and get_proposal_pos_embed."""
from types import SimpleNamespace

import pytest
import torch
from torch import nn
from transformers import DeformableDetrConfig
from transformers.models.deformable_detr.modeling_deformable_detr import DeformableDetrDecoderLayer, DeformableDetrModel

from vispe.coords import points_at_levels, resize_mask, valid_ratios
from vispe.kernels.deformable import Levels, swap_xy
from vispe.models.detr.load.deformable_keys import deformable_keys
from vispe.models.detr.transformer.deformable_decoder import DeformableDecoderLayer, encoder_proposals, proposal_sine
from vispe.models.detr.transformer.deformable_encoder import DeformableEncoderLayer

D, HEADS, STRIDES = 64, 4, (8, 16, 32, 64)


def level_masks(valid=((128, 192), (72, 104)), H=128, W=192):
    pix = torch.ones(len(valid), H, W, dtype=torch.bool)
    for b, (h, w) in enumerate(valid):
        pix[b, :h, :w] = False
    return [resize_mask(pix, (H // s, W // s)) for s in STRIDES]


@pytest.mark.parametrize("coords", [2, 4])
def test_decoder_layer_equals_transformers(coords):
    cfg = DeformableDetrConfig(d_model=D, decoder_attention_heads=HEADS, decoder_ffn_dim=128, num_feature_levels=4,
                               decoder_n_points=3, use_timm_backbone=False, backbone_config={"model_type": "resnet"})
    torch.manual_seed(0)
    hf = DeformableDetrDecoderLayer(cfg).eval()
    with torch.no_grad():
        for name, p in hf.named_parameters():  # every parameter perturbed
            p.normal_(0, 1.0 / p.shape[-1] ** 0.5 if p.dim() > 1 else 0.3)
            if name.endswith("norm.weight"):
                p.uniform_(0.5, 1.5)
    ours = DeformableDecoderLayer(D, HEADS, 128, num_levels=4, num_points=3).eval()
    renamed, rest = deformable_keys({"model.decoder.layers.0." + k: v for k, v in hf.state_dict().items()},
                                    "transformers", decoder="")
    assert not rest
    ours.load_state_dict({k.removeprefix("0."): v for k, v in renamed.items()})
    masks = level_masks()
    levels, ratios, pad = Levels.of(masks), valid_ratios(masks), None
    pad = levels.flatten(masks)
    g = torch.Generator().manual_seed(1)
    B, Q = 2, 10
    t, pos = torch.randn(B, Q, D, generator=g), torch.randn(B, Q, D, generator=g)
    memory = torch.randn(B, levels.num_tokens, D, generator=g)
    anchors = torch.rand(B, Q, coords, generator=g) * 0.6 + 0.2  # the papers' (cx, cy[, w, h]) in the valid area
    ref_xy = anchors[:, :, None] * (ratios.flip(-1) if coords == 2 else torch.cat([ratios.flip(-1)] * 2, -1))[:, None]
    with torch.no_grad():
        want = hf(t, pos, ref_xy, levels.tensor(), list(levels.shapes), torch.tensor(levels.start), memory, ~pad)
        got = ours(t, pos, points_at_levels(swap_xy(anchors), ratios), memory, levels, pad)
    assert want.abs().max() > 0.5
    torch.testing.assert_close(got, want, rtol=0, atol=1e-5)


def test_encoder_proposals_equal_transformers():
    masks = level_masks()
    levels = Levels.of(masks)
    pad = levels.flatten(masks)
    memory = torch.randn(2, levels.num_tokens, D)
    fake = SimpleNamespace(enc_output=nn.Identity(), enc_output_norm=nn.Identity())  # its projection is the model's
    want_mem, want = DeformableDetrModel.gen_encoder_output_proposals(fake, memory, pad, list(levels.shapes))
    got_mem, got = encoder_proposals(memory, pad, levels)
    assert torch.equal(got.isinf(), want.isinf()) and got.isfinite().sum() > 100
    torch.testing.assert_close(got, want, rtol=0, atol=1e-5)  # (cx, cy, w, h) logits; +inf where none
    torch.testing.assert_close(got_mem, want_mem, rtol=0, atol=0)
    alone = level_masks(valid=((72, 104),), H=72 + 56, W=104 + 88)  # the same valid size on another canvas
    lv = Levels.of(alone)
    _, p_alone = encoder_proposals(torch.zeros(1, lv.num_tokens, D), lv.flatten(alone), lv)
    torch.testing.assert_close(p_alone[0][~lv.flatten(alone)[0]], got[1][~pad[1]], rtol=0, atol=1e-6)
    no_pad = torch.zeros_like(pad)
    torch.testing.assert_close(encoder_proposals(memory, None, levels)[1], encoder_proposals(memory, no_pad, levels)[1])


def test_proposal_sine_equals_transformers_get_proposal_pos_embed():
    logits = torch.randn(2, 7, 4) * 2
    fake = SimpleNamespace(config=SimpleNamespace(d_model=D))  # transformers: d_model / 2 features per coordinate
    want = DeformableDetrModel.get_proposal_pos_embed(fake, logits)
    got = proposal_sine(logits, num_feats=D // 2)
    assert got.shape == (2, 7, 4 * D // 2)
    torch.testing.assert_close(got, want, rtol=0, atol=1e-6)
    assert proposal_sine(logits).shape[-1] == 512  # the papers' 128 per coordinate
    with pytest.raises(ValueError, match="box logits"):
        proposal_sine(logits[..., :2])


def test_every_parameter_of_the_layers_gets_a_gradient():
    masks = level_masks()
    levels, ratios, pad = Levels.of(masks), valid_ratios(masks), Levels.of(masks).flatten(masks)
    enc = DeformableEncoderLayer(D, HEADS, 128, num_levels=4, num_points=2)
    dec = DeformableDecoderLayer(D, HEADS, 128, num_levels=4, num_points=2)
    x = torch.randn(2, levels.num_tokens, D)
    from vispe.coords import level_reference_points
    memory = enc(x, torch.randn(1, levels.num_tokens, D), level_reference_points(levels.shapes, ratios), levels, pad)
    out = dec(torch.randn(2, 5, D), torch.randn(1, 5, D), points_at_levels(torch.rand(2, 5, 4), ratios), memory,
              levels, pad)
    out.square().sum().backward()
    for name, p in list(enc.named_parameters()) + list(dec.named_parameters()):
        assert p.grad is not None and p.grad.abs().max() > 0, name
