"""vispe's DETR against the reference implementations: transformers' DetrForObjectDetection
(built from a small DetrConfig with random weights, nothing downloaded) and facebookresearch/detr's
checkpoint format (key names from that project's source, written out here)."""
import argparse
import re

import pytest
import torch
from transformers import DetrConfig, DetrForObjectDetection

from vispe.models.detr import load_detr

NUM_LABELS = 5


def hf_detr(seed: int = 0, **overrides) -> DetrForObjectDetection:
    """A small transformers DETR whose every weight and BN statistic is random and of O(1) size."""
    torch.manual_seed(seed)
    cfg = dict(use_timm_backbone=True, backbone="resnet18", use_pretrained_backbone=False, encoder_layers=2,
               decoder_layers=2, num_queries=10, d_model=64, encoder_attention_heads=4, decoder_attention_heads=4,
               encoder_ffn_dim=128, decoder_ffn_dim=128, num_labels=NUM_LABELS)
    model = DetrForObjectDetection(DetrConfig(**{**cfg, **overrides})).eval()
    with torch.no_grad():
        for name, t in list(model.named_parameters()) + list(model.named_buffers()):
            if "running_var" in name:
                t.uniform_(0.5, 2.0)
            elif not t.is_floating_point():
                continue
            elif t.dim() > 1:  # conv / linear / embedding weights: O(1) activations
                t.normal_(0, 1.0 / t[0].numel() ** 0.5 if "embeddings" not in name else 1.0)
            elif name.endswith("weight"):  # 1-D weights are LayerNorm / BatchNorm scales
                t.uniform_(0.5, 1.5)
            else:  # biases, BN means
                t.normal_(0, 0.1)
    return model


def batch():
    """Two non-square images; the second (64 x 96 valid) is padded at the bottom and the right.

    At stride 32 the feature grid is 4 x 5, of which 2 x 3 cells are the second image's valid area.
    """
    torch.manual_seed(1)
    images = torch.randn(2, 3, 128, 160)
    mask = torch.zeros(2, 128, 160, dtype=torch.bool)
    mask[1, 64:] = True
    mask[1, :, 96:] = True
    images[1][:, mask[1]] = 0.0
    return images, mask


def reference_outputs(hf, images, mask):
    with torch.no_grad():
        out = hf(pixel_values=images, pixel_mask=(~mask).long())  # transformers: 1 = valid
    return out.logits, out.pred_boxes


def compare(model, hf):
    images, mask = batch()
    logits, boxes = reference_outputs(hf, images, mask)
    with torch.no_grad():
        ours = model.eval()(images, mask)
    assert logits.abs().max() > 0.5  # the comparison is not between near-zero outputs
    torch.testing.assert_close(ours["pred_logits"], logits, rtol=0, atol=1e-4)
    torch.testing.assert_close(ours["pred_boxes"], boxes, rtol=0, atol=1e-4)
    return ours


def test_transformers_model_parity_on_padded_non_square_batch():
    hf = hf_detr()
    model = load_detr(hf)
    assert model.num_classes == NUM_LABELS and model.num_queries == 10 and model.pe_name == "sine"
    ours = compare(model, hf)
    # the padded image's valid area matters, its padding does not (key padding mask, mask-aware sine)
    assert not torch.allclose(ours["pred_logits"][0], ours["pred_logits"][1], atol=1e-3)


def test_transformers_state_dict_v4_and_v5_key_names():
    hf = hf_detr(seed=2)
    state = hf.state_dict()
    compare(load_detr(dict(state), nheads=4), hf)  # a bare state_dict: heads cannot be read off the weights
    v4 = {}
    for k, v in state.items():  # transformers 4.x names of the same weights
        k = k.replace("model.backbone.model.", "model.backbone.conv_encoder.model.")
        k = re.sub(r"\.o_proj\.", ".out_proj.", k)
        k = re.sub(r"\.mlp\.(fc1|fc2)\.", r".\1.", k)
        v4[k] = v
    compare(load_detr(v4, nheads=4), hf)


def official_detr_state(hf) -> dict:
    """The same weights under facebookresearch/detr's key names (models/detr.py, transformer.py, backbone.py)."""
    out = {}
    s = hf.state_dict()
    for k, v in s.items():
        if k.startswith("model.backbone.model."):
            out["backbone.0.body." + k[len("model.backbone.model."):]] = v
    out["input_proj.weight"], out["input_proj.bias"] = s["model.input_projection.weight"], s["model.input_projection.bias"]
    out["query_embed.weight"] = s["model.query_position_embeddings.weight"]
    for part, n in (("encoder", 2), ("decoder", 2)):
        for i in range(n):
            src, dst = f"model.{part}.layers.{i}.", f"transformer.{part}.layers.{i}."
            attns = [("self_attn", "self_attn")] + ([("encoder_attn", "multihead_attn")] if part == "decoder" else [])
            for a_src, a_dst in attns:
                for kind in ("weight", "bias"):
                    out[f"{dst}{a_dst}.in_proj_{kind}"] = torch.cat([s[f"{src}{a_src}.{c}_proj.{kind}"] for c in "qkv"])
                    out[f"{dst}{a_dst}.out_proj.{kind}"] = s[f"{src}{a_src}.o_proj.{kind}"]
            norms = {"self_attn_layer_norm": "norm1", "final_layer_norm": "norm2" if part == "encoder" else "norm3",
                     "encoder_attn_layer_norm": "norm2"}
            for kind in ("weight", "bias"):
                out[f"{dst}linear1.{kind}"] = s[f"{src}mlp.fc1.{kind}"]
                out[f"{dst}linear2.{kind}"] = s[f"{src}mlp.fc2.{kind}"]
                for n_src, n_dst in norms.items():
                    if f"{src}{n_src}.{kind}" in s:
                        out[f"{dst}{n_dst}.{kind}"] = s[f"{src}{n_src}.{kind}"]
    for kind in ("weight", "bias"):
        out[f"transformer.decoder.norm.{kind}"] = s[f"model.decoder.layernorm.{kind}"]
        out[f"class_embed.{kind}"] = s[f"class_labels_classifier.{kind}"]
        for j in range(3):
            out[f"bbox_embed.layers.{j}.{kind}"] = s[f"bbox_predictor.layers.{j}.{kind}"]
    return out


def test_official_detr_checkpoint_file_with_args(tmp_path):
    hf = hf_detr(seed=3)
    args = argparse.Namespace(backbone="resnet18", dilation=False, nheads=4, dropout=0.1, pre_norm=False,
                              position_embedding="sine", aux_loss=True, hidden_dim=64)
    path = tmp_path / "detr-r18.pth"
    torch.save({"model": official_detr_state(hf), "args": args, "epoch": 3}, path)
    model = load_detr(path)
    assert model.aux_loss and model.transformer.nheads == 4
    compare(model, hf)


def test_load_errors_name_the_key():
    hf = hf_detr(seed=4)
    state = official_detr_state(hf)
    with pytest.raises(ValueError, match=r"does not fit vispe's DETR: missing \['backbone.body.bn1.bias'"):
        load_detr({k: v for k, v in state.items() if k != "backbone.0.body.bn1.bias"}, nheads=4)
    bad = dict(state)
    bad["transformer.extra.weight"] = torch.zeros(1)
    with pytest.raises(ValueError, match=r"unexpected \['transformer.extra.weight'\]"):
        load_detr(bad, nheads=4)
    with pytest.raises(ValueError, match=r"source key 'class_embed.weight' has shape \(6, 64\)"):
        load_detr(state, nheads=4, num_classes=9)
    with pytest.raises(ValueError, match="expected a transformers DETR state_dict"):
        load_detr({"foo.weight": torch.zeros(1)})
    with pytest.raises(ValueError, match="no such file"):
        load_detr("/nonexistent/detr.pth")


def test_learned_position_embedding_parity():
    """transformers' learned row/column tables (x first, 50 x d/2 each) load into learned_rowcol(axis_order="xy")."""
    hf = hf_detr(seed=5, position_embedding_type="learned")
    model = load_detr(hf)
    assert model.pe_name == "learned_rowcol" and model.pe.axis_order == "xy"
    compare(model, hf)
