"""The whole multi-scale detector against transformers' DeformableDetrForObjectDetection (plain,
with_box_refine, two_stage; 4 levels and 1), every parameter perturbed, loaded with load_detr from the
model, from its state_dict with its config, and from files in fundamentalvision/Deformable-DETR's
layout; padded non-square batch, auxiliary outputs and two-stage proposals included."""
import argparse

import pytest
import torch
from test_deformable_encoder import padded_batch, perturb
from transformers import DeformableDetrConfig, DeformableDetrForObjectDetection

from vispe.models.detr import load_detr
from vispe.models.detr.deformable_model import DeformableDETR

D, HEADS = 64, 4
VARIANTS = {"plain": {}, "refine": dict(with_box_refine=True), "two_stage": dict(with_box_refine=True, two_stage=True)}


def config(L, **kw):
    return DeformableDetrConfig(**{**dict(use_timm_backbone=True, backbone="resnet18", use_pretrained_backbone=False,
                                          d_model=D, encoder_layers=2, decoder_layers=2, encoder_attention_heads=HEADS,
                                          decoder_attention_heads=HEADS, encoder_ffn_dim=128, decoder_ffn_dim=128,
                                          num_queries=10, two_stage_num_proposals=10, num_feature_levels=L,
                                          num_labels=5, auxiliary_loss=True), **kw})


def reference(L, variant, seed=0):
    hf = perturb(DeformableDetrForObjectDetection(config(L, **VARIANTS[variant])), seed=seed)
    images, mask = padded_batch(64, 96, (48, 64)) if L > 1 else padded_batch(96, 160, (64, 96))  # >= 10 proposals
    labels = [{"class_labels": torch.tensor([1]), "boxes": torch.tensor([[0.5, 0.5, 0.2, 0.2]])}] * 2  # aux outputs
    with torch.no_grad():
        want = hf(pixel_values=images, pixel_mask=(~mask).long(), labels=labels)
    return hf, (images, mask), want


def assert_equal_outputs(ours, inputs, want, atol=1e-4):
    with torch.no_grad():
        got = ours.eval()(*inputs)
    assert want.logits.abs().max() > 0.5 and want.pred_boxes.std(1).min() > 1e-3  # queries differ
    torch.testing.assert_close(got["pred_logits"], want.logits, rtol=0, atol=atol)
    torch.testing.assert_close(got["pred_boxes"], want.pred_boxes, rtol=0, atol=atol)
    assert len(got["aux_outputs"]) == len(want.auxiliary_outputs) == 1
    for g, w in zip(got["aux_outputs"], want.auxiliary_outputs):
        torch.testing.assert_close(g["pred_logits"], w["logits"], rtol=0, atol=atol)
        torch.testing.assert_close(g["pred_boxes"], w["pred_boxes"], rtol=0, atol=atol)
    if want.enc_outputs_class is not None:
        torch.testing.assert_close(got["enc_outputs"]["pred_logits"], want.enc_outputs_class, rtol=0, atol=atol)
        finite = want.enc_outputs_coord_logits.isfinite()
        torch.testing.assert_close(got["enc_outputs"]["pred_boxes"][finite], want.enc_outputs_coord_logits.sigmoid()[finite],
                                   rtol=0, atol=atol)
    return got


@pytest.mark.parametrize("L, variant", [(4, "plain"), (4, "refine"), (4, "two_stage"), (1, "plain"), (1, "refine"),
                                        (1, "two_stage")])
def test_load_detr_equals_transformers_deformable_detr(L, variant):
    hf, inputs, want = reference(L, variant)
    ours = load_detr(hf)
    assert isinstance(ours, DeformableDETR) and ours.queries.with_box_refine == (variant != "plain")
    assert ours.queries.two_stage == (variant == "two_stage") and ours.num_levels == L
    assert (ours.class_embed[0] is ours.class_embed[1]) == (variant == "plain")  # shared heads without refinement
    assert_equal_outputs(ours, inputs, want)


def test_a_state_dict_loads_with_its_config_and_is_refused_without():
    hf, inputs, want = reference(4, "refine", seed=1)
    assert_equal_outputs(load_detr(hf.state_dict(), config=hf.config), inputs, want)
    with pytest.raises(ValueError, match="number of attention heads"):
        load_detr(hf.state_dict())
    v4 = {k.replace("model.backbone.model.", "model.backbone.conv_encoder.model.").replace("mlp.fc", "fc")
          .replace("self_attn.o_proj", "self_attn.out_proj"): v for k, v in hf.state_dict().items()}  # transformers 4
    assert v4.keys() != hf.state_dict().keys()
    assert_equal_outputs(load_detr(v4, nheads=HEADS, aux_loss=True), inputs, want)
    state = hf.state_dict()
    state["model.decoder.bbox_embed.1.layers.0.bias"] = state["model.decoder.bbox_embed.1.layers.0.bias"] + 1
    with pytest.raises(ValueError, match="decoder copy of 'bbox_embed.1.layers.0.bias' differs"):
        load_detr(state, config=hf.config)


def official_layout(state: dict) -> dict:
    """transformers' keys written in fundamentalvision/Deformable-DETR's names (its models/deformable_detr.py
    and deformable_transformer.py: backbone.0.body, transformer.*, query_embed, decoder norm2 after the
    self-attention and norm1 after the cross-attention, nn.MultiheadAttention's in_proj)."""
    out = {}
    for k, v in state.items():
        new = k.replace("model.backbone.model.", "backbone.0.body.").replace("model.input_proj.", "input_proj.")
        new = new.replace("model.query_position_embeddings.", "query_embed.").replace("model.", "transformer.")
        if ".encoder.layers." in new:
            new = new.replace("self_attn_layer_norm", "norm1").replace("final_layer_norm", "norm2")
        new = new.replace("mlp.fc1", "linear1").replace("mlp.fc2", "linear2").replace("encoder_attn.", "cross_attn.")
        new = new.replace("self_attn_layer_norm", "norm2").replace("encoder_attn_layer_norm", "norm1")
        new = new.replace("final_layer_norm", "norm3").replace("self_attn.o_proj", "self_attn.out_proj")
        out[new] = v
    for i in range(2):
        p = f"transformer.decoder.layers.{i}.self_attn."
        for kind in ("weight", "bias"):
            out[p + "in_proj_" + kind] = torch.cat([out.pop(f"{p}{c}_proj.{kind}") for c in "qkv"])
    return out


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_official_checkpoint_files_load(variant, tmp_path):
    hf, inputs, want = reference(4, variant, seed=2)
    state = official_layout(hf.state_dict())
    assert ("transformer.decoder.bbox_embed.0.layers.0.weight" in state) == (variant != "plain")
    args = argparse.Namespace(backbone="resnet18", dilation=False, position_embedding="sine", nheads=HEADS,
                              enc_n_points=4, dec_n_points=4, num_queries=10, dropout=0.1, aux_loss=True,
                              with_box_refine=variant != "plain", two_stage=variant == "two_stage")
    torch.save({"model": state, "args": args}, tmp_path / "checkpoint.pth")
    assert_equal_outputs(load_detr(tmp_path / "checkpoint.pth"), inputs, want)
    if variant == "two_stage":  # the state_dict alone: what the weights cannot say is passed
        with pytest.raises(ValueError, match="pass num_queries"):
            load_detr(state, nheads=HEADS)
        assert_equal_outputs(load_detr(state, nheads=HEADS, num_queries=10), inputs, want)
