"""Deformable DETR's encoder side in vispe (multi-scale ResNet levels, input projections, level
positions, DeformableEncoder, deformable_keys) against transformers' DeformableDetrEncoder and
DeformableDetrModel built from small configs with every parameter perturbed; batch invariance of
the mask-aware front."""
import pytest
import torch
from torch import nn
from transformers import DeformableDetrConfig, DeformableDetrModel
from transformers.models.deformable_detr.modeling_deformable_detr import DeformableDetrEncoder

import vispe
from vispe.coords import resize_mask, valid_ratios
from vispe.kernels.deformable import Levels
from vispe.models.detr.load.deformable_keys import deformable_keys
from vispe.models.detr.neck.level_pos import DEFORMABLE_SINE, LevelPositions
from vispe.models.detr.neck.multiscale import InputProjection, MultiScaleResNet
from vispe.models.detr.transformer.deformable_encoder import DeformableEncoder

D, HEADS = 64, 4


def config(L, **kw):
    return DeformableDetrConfig(**{**dict(use_timm_backbone=True, backbone="resnet18", use_pretrained_backbone=False,
                                          d_model=D, encoder_layers=2, decoder_layers=2, encoder_attention_heads=HEADS,
                                          decoder_attention_heads=HEADS, encoder_ffn_dim=128, decoder_ffn_dim=128,
                                          num_queries=10, num_feature_levels=L, encoder_n_points=3, decoder_n_points=2,
                                          num_labels=5), **kw})


def perturb(model, seed=0):
    """Every weight and BN statistic random and O(1) in effect (as tests/test_detr_reference.py)."""
    torch.manual_seed(seed)
    with torch.no_grad():
        for name, t in list(model.named_parameters()) + list(model.named_buffers()):
            if "running_var" in name:
                t.uniform_(0.5, 2.0)
            elif not t.is_floating_point():
                continue
            elif t.dim() > 1:
                t.normal_(0, 1.0 / t[0].numel() ** 0.5)
            elif name.endswith("weight"):
                t.uniform_(0.5, 1.5)
            else:
                t.normal_(0, 0.3 if "sampling_offsets" in name or "level_embed" in name else 0.1)
    return model.eval()


def padded_batch(H=128, W=192, valid=(96, 128)):
    """Two non-square images, the second padded at the bottom and the right."""
    g = torch.Generator().manual_seed(1)
    images = torch.randn(2, 3, H, W, generator=g)
    mask = torch.zeros(2, H, W, dtype=torch.bool)
    mask[1, valid[0]:] = True
    mask[1, :, valid[1]:] = True
    images[1][:, mask[1]] = 0.0
    return images, mask


@pytest.mark.parametrize("L", [4, 1])
def test_encoder_equals_transformers_deformable_detr_encoder(L):
    hf = perturb(DeformableDetrEncoder(config(L)))
    ours = DeformableEncoder(D, HEADS, 2, 128, dropout=0.1, num_levels=L, num_points=3).eval()
    renamed, rest = deformable_keys({"model.encoder." + k: v for k, v in hf.state_dict().items()}, "transformers",
                                    encoder="layers.")
    assert not rest
    ours.load_state_dict(renamed)
    _, pix = padded_batch()
    masks = [resize_mask(pix, (128 // s, 192 // s)) for s in (8, 16, 32, 64)[-L:]]  # non-square, padded
    levels = Levels.of(masks)
    g = torch.Generator().manual_seed(2)
    x = torch.randn(2, levels.num_tokens, D, generator=g)
    pos = torch.randn(2, levels.num_tokens, D, generator=g)
    pad = levels.flatten(masks)
    ratios = valid_ratios(masks)
    with torch.no_grad():
        want = hf(inputs_embeds=x, attention_mask=~pad, spatial_position_embeddings=pos, spatial_shapes=levels.tensor(),
                  spatial_shapes_list=list(levels.shapes), level_start_index=torch.tensor(levels.start),
                  valid_ratios=ratios.flip(-1)).last_hidden_state
        got = ours(x, levels, pos, ratios, pad)
    valid = ~pad
    assert want[valid].abs().max() > 0.5 and (want[0] - want[1]).abs().max() > 0.1
    torch.testing.assert_close(got[valid], want[valid], rtol=0, atol=1e-5)


class Front(nn.Module):
    """Backbone levels -> input projection -> level positions -> deformable encoder (vispe's pieces)."""

    def __init__(self, L, mask_aware=False):
        super().__init__()
        self.backbone = MultiScaleResNet("resnet18", layers=(2, 3, 4) if L > 1 else (4,), mask_aware=mask_aware)
        self.input_proj = InputProjection(self.backbone.num_channels, D, L, mask_aware=mask_aware)
        self.level_pos = LevelPositions(vispe.build("sine", dim=D, **DEFORMABLE_SINE), D, L)
        self.encoder = DeformableEncoder(D, HEADS, 2, 128, num_levels=L, num_points=3)

    def forward(self, images, mask):
        maps, masks = self.input_proj(self.backbone(images, mask), mask)
        levels = Levels.of(maps)
        pos = self.level_pos(levels, masks)
        pad = levels.flatten(masks)
        return self.encoder(levels.flatten(maps), levels, pos, valid_ratios(masks), pad), pad


@pytest.mark.parametrize("L", [4, 1])
def test_front_equals_transformers_deformable_detr_model_encoder_output(L):
    """ResNet-18 C3-C5 (C5 for one level) + extra stride-2 level + GroupNorm projections + sine(-0.5) +
    level embedding + encoder, loaded with deformable_keys from a perturbed DeformableDetrModel."""
    hf = perturb(DeformableDetrModel(config(L)))
    ours = Front(L).eval()
    renamed, rest = deformable_keys(hf.state_dict())
    assert sorted({k.split(".")[0] for k in rest}) == ["query_position_embeddings", "reference_points"]
    missing, unexpected = ours.load_state_dict(renamed, strict=False)
    assert not missing and all(k.startswith("decoder.") for k in unexpected)
    images, mask = padded_batch()
    with torch.no_grad():
        want = hf(pixel_values=images, pixel_mask=(~mask).long()).encoder_last_hidden_state
        got, pad = ours(images, mask)
    assert want.abs().max() > 0.5
    torch.testing.assert_close(got[~pad], want[~pad], rtol=0, atol=1e-4)


def test_official_layout_maps_like_transformers():
    """The fundamentalvision layout (key names from its models/deformable_transformer.py, written out here)
    gives the same tensors under the same names, the decoder's norm1/norm2 swapped as in its forward."""
    state = {"model." + k: v for k, v in perturb(DeformableDetrModel(config(4))).state_dict().items()}
    official = {}
    for k, v in state.items():
        new = k.replace("model.backbone.model.", "backbone.0.body.").replace("model.input_proj.", "input_proj.")
        new = new.replace("model.level_embed", "transformer.level_embed").replace("model.", "transformer.")
        if ".encoder." in new:
            new = new.replace("self_attn_layer_norm", "norm1").replace("final_layer_norm", "norm2")
        new = new.replace("mlp.fc1", "linear1").replace("mlp.fc2", "linear2").replace("encoder_attn.", "cross_attn.")
        new = new.replace("self_attn_layer_norm", "norm2").replace("encoder_attn_layer_norm", "norm1")
        new = new.replace("final_layer_norm", "norm3").replace("self_attn.o_proj", "self_attn.out_proj")
        official[new] = v
    for i in range(2):  # nn.MultiheadAttention's fused in_proj
        p = f"transformer.decoder.layers.{i}.self_attn."
        for kind in ("weight", "bias"):
            official[p + "in_proj_" + kind] = torch.cat([official.pop(f"{p}{c}_proj.{kind}") for c in "qkv"])
    a, rest_a = deformable_keys(state)
    b, rest_b = deformable_keys(official)
    assert sorted(a) == sorted(b) and len(rest_a) == len(rest_b)
    for k in a:
        torch.testing.assert_close(a[k], b[k], rtol=0, atol=0, msg=k)
    assert "decoder.layers.1.norm1.weight" in a and "decoder.layers.0.self_attn.qkv.weight" in a


def test_mask_aware_front_is_batch_invariant():
    """With the mask-aware ResNet and mask-aware GroupNorm, an image alone (64 x 128, a multiple of the
    coarsest stride 64) equals the same image padded into a 128 x 192 batch, token by token."""
    torch.manual_seed(0)
    front = perturb(Front(4, mask_aware=True), seed=3)
    images, mask = padded_batch(valid=(64, 128))
    with torch.no_grad():
        alone, _ = front(images[1:, :, :64, :128], mask[1:, :64, :128])
        batch, pad = front(images, mask)
    assert alone.shape[1] == int((~pad[1]).sum())
    torch.testing.assert_close(batch[1][~pad[1]], alone[0], rtol=0, atol=1e-4)
    paper = perturb(Front(4, mask_aware=False), seed=3)  # the papers' GroupNorm sees the padding
    with torch.no_grad():
        alone_p, _ = paper(images[1:, :, :64, :128], mask[1:, :64, :128])
        batch_p, _ = paper(images, mask)
    assert (batch_p[1][~pad[1]] - alone_p[0]).abs().max() > 1e-2


def test_deformable_keys_refuses_what_it_cannot_map():
    with pytest.raises(ValueError, match="expected a Deformable DETR state_dict"):
        deformable_keys({"backbone.0.body.conv1.weight": torch.zeros(1)})
    with pytest.raises(ValueError, match="targets"):
        deformable_keys({}, "official", heads="x.")
    with pytest.raises(ValueError, match=r"\['k', 'q'\] projections"):
        deformable_keys({"model.encoder.layers.0.self_attn.sampling_offsets.weight": torch.zeros(1),
                         "model.decoder.layers.0.self_attn.q_proj.weight": torch.zeros(1),
                         "model.decoder.layers.0.self_attn.k_proj.weight": torch.zeros(1)})
