"""The original repositories' checkpoint layouts of D-FINE (Peterande/D-FINE, also DEIM's D-FINE models) and
DEIMv2 (Intellindust-AI-Lab/DEIMv2): a transformers model's weights written under the originals' names (the
tables of transformers' ``convert_d_fine_original_pytorch_checkpoint_to_hf.py`` and
``convert_deimv2_original_pytorch_checkpoint_to_hf.py`` read backwards, at transformers 5.23's module names;
``nn.MultiheadAttention``'s ``in_proj`` = q, k, v rows; DINOv3's fused ``qkv`` with a masked key bias; DEIMv2's
fused SwiGLU ``w12`` = gate, up) into a file as the repositories save it, loaded by ``load_detr(path,
config=...)``: the outputs equal transformers'. An unknown key is refused by its original name."""
import re

import pytest
import torch
from test_deimv2 import reference as deimv2_reference, unambiguous
from test_dfine import reference as dfine_reference
from test_rtdetr import check_eval, images
from transformers import RTDetrConfig

from vispe.models.detr import load_detr

# transformers 5.23 name -> the original's, shared by D-FINE and DEIMv2 (HGNetV2, AIFI, decoder, heads)
COMMON = [
    (r"^model\.(?:backbone|conv_encoder)\.model\.embedder\.", "backbone.stem."),
    (r"^model\.(?:backbone|conv_encoder)\.model\.encoder\.stages\.", "backbone.stages."),
    (r"^(backbone\..*)\.convolution\.", r"\1.conv."),
    (r"^(backbone\..*)\.normalization\.", r"\1.bn."),
    (r"^model\.encoder_input_proj\.(\d+)\.0\.", r"encoder.input_proj.\1.conv."),
    (r"^model\.encoder_input_proj\.(\d+)\.1\.", r"encoder.input_proj.\1.norm."),
    (r"^model\.conv_encoder\.encoder_input_proj\.", "encoder.input_proj."),
    (r"^model\.encoder\.aifi\.(\d+)\.layers\.", r"encoder.encoder.\1.layers."),
    (r"^(encoder\.encoder\.\d+\.layers\.\d+)\.self_attn_layer_norm\.", r"\1.norm1."),
    (r"^(encoder\.encoder\.\d+\.layers\.\d+)\.final_layer_norm\.", r"\1.norm2."),
    (r"^(encoder\.encoder\.\d+\.layers\.\d+)\.mlp\.layers\.([01])\.", lambda m: f"{m[1]}.linear{int(m[2]) + 1}."),
    (r"^model\.encoder\.downsample_convs\.(\d+)\.conv([12])\.", r"encoder.downsample_convs.\1.0.cv\2."),
    (r"^model\.encoder\.", "encoder."),
    (r"^model\.decoder\.layers\.(\d+)\.self_attn_layer_norm\.", r"decoder.decoder.layers.\1.norm1."),
    (r"^model\.decoder\.layers\.(\d+)\.encoder_attn_layer_norm\.", r"decoder.decoder.layers.\1.norm2."),
    (r"^model\.decoder\.layers\.(\d+)\.final_layer_norm\.", r"decoder.decoder.layers.\1.norm3."),
    (r"^model\.decoder\.layers\.(\d+)\.encoder_attn\.", r"decoder.decoder.layers.\1.cross_attn."),
    (r"^model\.decoder\.layers\.(\d+)\.mlp\.layers\.([01])\.", lambda m: f"decoder.decoder.layers.{m[1]}.linear{int(m[2]) + 1}."),
    (r"^model\.decoder\.layers\.(\d+)\.mlp\.down_proj\.", r"decoder.decoder.layers.\1.swish_ffn.w3."),
    (r"^model\.decoder\.(layers|lqe_layers)\.", r"decoder.decoder.\1."),
    (r"^model\.decoder\.(up|reg_scale)$", r"decoder.\1"),
    (r"^model\.decoder\.class_embed\.", "decoder.dec_score_head."),
    (r"^model\.decoder\.bbox_embed\.", "decoder.dec_bbox_head."),
    (r"^model\.decoder\.(pre_bbox_head|query_pos_head)\.", r"decoder.\1."),
    (r"^model\.enc_output\.0\.", "decoder.enc_output.proj."),
    (r"^model\.enc_output\.1\.", "decoder.enc_output.norm."),
    (r"^model\.(denoising_class_embed|enc_score_head|enc_bbox_head)\.", r"decoder.\1."),
    (r"^model\.weight_embedding\.", "decoder.tgt_embed."),
    (r"\.self_attn\.o_proj\.", ".self_attn.out_proj."),
]
_BLOCK = r"^(encoder\.(?:fpn|pan)_blocks\.\d+)"
DFINE = [(_BLOCK + r"\.csp_rep1\.", r"\1.cv2.0."), (_BLOCK + r"\.conv2\.", r"\1.cv2.1."),
         (_BLOCK + r"\.csp_rep2\.", r"\1.cv3.0."), (_BLOCK + r"\.conv3\.", r"\1.cv3.1."),
         (_BLOCK + r"\.conv1\.", r"\1.cv1."), (_BLOCK + r"\.conv4\.", r"\1.cv4.")]
DEIMV2 = [(_BLOCK + r"\.csp_rep1\.conv2\.", r"\1.cv2.1."), (_BLOCK + r"\.csp_rep2\.conv2\.", r"\1.cv3.1."),
          (_BLOCK + r"\.csp_rep1\.", r"\1.cv2.0."), (_BLOCK + r"\.csp_rep2\.", r"\1.cv3.0."),
          (_BLOCK + r"\.conv1\.", r"\1.cv1."), (_BLOCK + r"\.conv2\.", r"\1.cv4."),
          (r"^(decoder\.decoder\.layers\.\d+\..*norm\d?)\.weight$", r"\1.scale")]  # RMSNorm's parameter
VIT = "model.conv_encoder.backbone."
DINOV3 = [
    (r"^model\.conv_encoder\.backbone\.embeddings\.patch_embeddings\.", "backbone.dinov3._model.patch_embed.proj."),
    (r"^model\.conv_encoder\.backbone\.embeddings\.register_tokens$", "backbone.dinov3._model.storage_tokens"),
    (r"^model\.conv_encoder\.backbone\.embeddings\.", "backbone.dinov3._model."),
    (r"^model\.conv_encoder\.backbone\.model\.layer\.", "backbone.dinov3._model.blocks."),
    (r"^model\.conv_encoder\.backbone\.norm\.", "backbone.dinov3._model.norm."),
    (r"\.attention\.o_proj\.", ".attn.proj."),
    (r"\.layer_scale([12])\.lambda1$", r".ls\1.gamma"),
    (r"(blocks\.\d+)\.mlp\.up_proj\.", r"\1.mlp.fc1."),
    (r"(blocks\.\d+)\.mlp\.down_proj\.", r"\1.mlp.fc2."),
    (r"^model\.conv_encoder\.spatial_tuning_adapter\.stem_conv\.conv\.", "backbone.sta.stem.0."),
    (r"^model\.conv_encoder\.spatial_tuning_adapter\.stem_conv\.norm\.", "backbone.sta.stem.1."),
    (r"^model\.conv_encoder\.spatial_tuning_adapter\.conv2\.conv\.", "backbone.sta.conv2.0."),
    (r"^model\.conv_encoder\.spatial_tuning_adapter\.conv2\.norm\.", "backbone.sta.conv2.1."),
    (r"^model\.conv_encoder\.spatial_tuning_adapter\.(conv[34])\.conv\.", r"backbone.sta.\1.1."),
    (r"^model\.conv_encoder\.spatial_tuning_adapter\.(conv[34])\.norm\.", r"backbone.sta.\1.2."),
    (r"^model\.conv_encoder\.fusion_proj\.(\d+)\.conv\.", r"backbone.convs.\1."),
    (r"^model\.conv_encoder\.fusion_proj\.(\d+)\.norm\.", r"backbone.norms.\1."),
]


def to_original(state, rules):
    """``state`` (transformers') under the original's names, with its fused tensors."""
    out, fused = {}, {}
    for key, value in state.items():
        if key.endswith("num_batches_tracked") or key.startswith(("class_embed.", "bbox_embed.")) or \
                "rope_embeddings" in key:  # tied copies of the decoder's heads; RoPE periods (from the config)
            continue
        for pattern, repl in rules:
            key = re.sub(pattern, repl, key)
        m = re.match(r"^(.*\.(?:self_attn|attention))\.(q|k|v)_proj\.(weight|bias)$", key)
        g = re.match(r"^(.*)\.mlp\.(gate|up)_proj\.(weight|bias)$", key)
        if m:
            fused.setdefault((m[1], "qkv", m[3]), {})[m[2]] = value
        elif g:
            fused.setdefault((g[1], "w12", g[3]), {})[g[2]] = value
        else:
            out[key] = value
    for (prefix, what, kind), parts in fused.items():
        if what == "w12":  # DEIMv2's SwiGLU: one Linear, gate rows first
            out[f"{prefix}.swish_ffn.w12.{kind}"] = torch.cat([parts["gate"], parts["up"]])
        elif prefix.endswith(".attention"):  # DINOv3: attn.qkv; the key bias stored, masked to zero by bias_mask
            base = prefix[: -len(".attention")] + ".attn.qkv"
            if kind == "bias":
                parts["k"] = torch.full_like(parts["q"], 0.7)
                out[base + ".bias_mask"] = torch.cat([torch.ones_like(parts["q"]), torch.zeros_like(parts["q"]),
                                                      torch.ones_like(parts["q"])])
            out[f"{base}.{kind}"] = torch.cat([parts[c] for c in "qkv"])
        else:  # nn.MultiheadAttention's in_proj: rows q, k, v
            out[f"{prefix}.in_proj_{kind}"] = torch.cat([parts[c] for c in "qkv"])
    assert not [k for k in out if k.startswith("model.")], [k for k in out if k.startswith("model.")][:5]
    return out


@pytest.mark.slow
def test_a_dfine_checkpoint_in_the_original_layout_loads_with_its_config(tmp_path):
    hf = dfine_reference(seed=3)
    original = to_original(hf.state_dict(), COMMON + DFINE)
    original["decoder.decoder.up"], original["decoder.decoder.reg_scale"] = original["decoder.up"], original["decoder.reg_scale"]
    original["decoder.anchors"] = torch.zeros(1, 10, 4)  # the eval-size buffers the original saves
    for i in range(hf.config.decoder_layers):
        original[f"decoder.decoder.layers.{i}.cross_attn.num_points_scale"] = torch.full((12,), 0.25)
    assert "backbone.stem.stem1.conv.weight" in original and "encoder.fpn_blocks.0.cv3.1.conv.weight" in original
    path = tmp_path / "dfine_hgnetv2_s_coco.pth"
    torch.save({"model": original}, path)
    check_eval(load_detr(str(path), config=hf.config), hf, images(), "Peterande/D-FINE checkpoint file", num_aux=0)
    check_eval(load_detr({"ema": {"module": original}}, hf.config), hf, images(64, 160), "D-FINE {'ema': ...}",
               num_aux=0)
    with pytest.raises(ValueError, match="without its configuration"):
        load_detr({"model": original})
    with pytest.raises(ValueError, match="original layout: expected a DFineConfig or Deimv2Config, got 'rt_detr'"):
        load_detr(original, RTDetrConfig())


def test_learned_query_content_lands_in_vispes_initial_queries():
    """D-FINE's ``learn_query_content`` (``decoder.tgt_embed``): transformers 5.23's D-FINE cannot run it
    (``self.weight_embedding.tile``: an nn.Embedding has no ``tile``), so the weights are compared, not outputs."""
    hf = dfine_reference(seed=4, learn_initial_query=True)
    original = to_original(hf.state_dict(), COMMON + DFINE)
    assert "decoder.tgt_embed.weight" in original
    ours = load_detr(original, hf.config)
    torch.testing.assert_close(ours.selection.weight_embedding.weight, hf.model.weight_embedding.weight, rtol=0, atol=0)
    with torch.no_grad():
        out = ours.eval()(images())
    assert out["pred_logits"].shape == (2, 30, 5) and torch.isfinite(out["pred_boxes"]).all()


@pytest.mark.slow
@pytest.mark.parametrize("backbone, seed, kw", [
    (None, 0, {}),
    (None, 9, {"use_gateway": False, "share_bbox_head": True, "encoder_has_trailing_conv": False}),
    ("dinov3", 0, {}),
])
def test_a_deimv2_checkpoint_in_the_original_layout_loads_with_its_config(tmp_path, backbone, seed, kw):
    hf = deimv2_reference(seed=seed, backbone=backbone, **kw)
    unambiguous(hf, images())
    original = to_original(hf.state_dict(), (DINOV3 if backbone else []) + COMMON + DEIMV2)
    if kw.get("share_bbox_head"):  # the shared head saved once
        original = {k: v for k, v in original.items() if not re.match(r"decoder\.dec_bbox_head\.[1-9]", k)}
    want = {"dinov3": "backbone.dinov3._model.blocks.0.attn.qkv.bias_mask", None: "backbone.stem.stem1.lab.scale"}
    assert want[backbone] in original and "decoder.decoder.layers.0.swish_ffn.w12.weight" in original
    path = tmp_path / "deimv2.pth"
    torch.save({"model": original}, path)
    check_eval(load_detr(str(path), config=hf.config), hf, images(), f"DEIMv2 {backbone or 'hgnetv2'} original layout",
               num_aux=0)


def test_unknown_keys_and_an_unmasked_key_bias_are_refused_by_their_original_names():
    hf = deimv2_reference(seed=1, backbone="dinov3")
    original = to_original(hf.state_dict(), DINOV3 + COMMON + DEIMV2)
    with pytest.raises(ValueError, match=r"no place for: \['decoder\.decoder\.layers\.0\.extra\.weight'\]"):
        load_detr({**original, "decoder.decoder.layers.0.extra.weight": torch.zeros(1)}, hf.config)
    unmasked = {k: v for k, v in original.items() if not k.endswith("bias_mask")}
    with pytest.raises(ValueError, match=r"backbone\.dinov3\._model\.blocks\.0\.attn\.qkv\.bias: a nonzero key bias"):
        load_detr(unmasked, hf.config)
