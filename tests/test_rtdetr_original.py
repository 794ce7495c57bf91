"""lyuwenyu/RT-DETR's checkpoint layout: a transformers RT-DETR's weights written under the original repository's
names (the table of transformers' ``convert_rt_detr_original_pytorch_checkpoint_to_hf.py``, read backwards and
brought to transformers 5.23's module names; nn.MultiheadAttention's ``in_proj`` = q, k, v rows) into a file
as the repository saves it (``{"ema": {"module": state_dict}}``), loaded by ``load_detr(path, config=...)``:
the outputs equal transformers'."""
import re

import pytest
import torch
from test_rtdetr import check_eval, images, reference

from vispe.models.detr import load_detr

# transformers 5.23 name -> lyuwenyu's, after convert_rt_detr_original_pytorch_checkpoint_to_hf.create_rename_keys
TO_ORIGINAL = [
    (r"^model\.backbone\.model\.embedder\.embedder\.(\d)\.convolution\.", lambda m: f"backbone.conv1.conv1_{int(m[1]) + 1}.conv."),
    (r"^model\.backbone\.model\.embedder\.embedder\.(\d)\.normalization\.", lambda m: f"backbone.conv1.conv1_{int(m[1]) + 1}.norm."),
    (r"^model\.backbone\.model\.encoder\.stages\.(\d+)\.layers\.(\d+)\.layer\.(\d)\.convolution\.",
     lambda m: f"backbone.res_layers.{m[1]}.blocks.{m[2]}.branch2{'abc'[int(m[3])]}.conv."),
    (r"^model\.backbone\.model\.encoder\.stages\.(\d+)\.layers\.(\d+)\.layer\.(\d)\.normalization\.",
     lambda m: f"backbone.res_layers.{m[1]}.blocks.{m[2]}.branch2{'abc'[int(m[3])]}.norm."),
    (r"^model\.backbone\.model\.encoder\.stages\.(\d+)\.layers\.0\.shortcut\.1\.convolution\.", r"backbone.res_layers.\1.blocks.0.short.conv.conv."),
    (r"^model\.backbone\.model\.encoder\.stages\.(\d+)\.layers\.0\.shortcut\.1\.normalization\.", r"backbone.res_layers.\1.blocks.0.short.conv.norm."),
    (r"^model\.backbone\.model\.encoder\.stages\.(\d+)\.layers\.0\.shortcut\.convolution\.", r"backbone.res_layers.\1.blocks.0.short.conv."),
    (r"^model\.backbone\.model\.encoder\.stages\.(\d+)\.layers\.0\.shortcut\.normalization\.", r"backbone.res_layers.\1.blocks.0.short.norm."),
    (r"^model\.encoder_input_proj\.", "encoder.input_proj."),
    (r"^model\.encoder\.aifi\.(\d+)\.layers\.", r"encoder.encoder.\1.layers."),
    (r"^(encoder\.encoder\.\d+\.layers\.\d+)\.self_attn_layer_norm\.", r"\1.norm1."),
    (r"^(encoder\.encoder\.\d+\.layers\.\d+)\.final_layer_norm\.", r"\1.norm2."),
    (r"^model\.encoder\.", "encoder."),
    (r"^model\.decoder_input_proj\.(\d+)\.0\.", r"decoder.input_proj.\1.conv."),
    (r"^model\.decoder_input_proj\.(\d+)\.1\.", r"decoder.input_proj.\1.norm."),
    (r"^model\.decoder\.layers\.(\d+)\.self_attn_layer_norm\.", r"decoder.decoder.layers.\1.norm1."),
    (r"^model\.decoder\.layers\.(\d+)\.encoder_attn_layer_norm\.", r"decoder.decoder.layers.\1.norm2."),
    (r"^model\.decoder\.layers\.(\d+)\.final_layer_norm\.", r"decoder.decoder.layers.\1.norm3."),
    (r"^model\.decoder\.layers\.(\d+)\.encoder_attn\.", r"decoder.decoder.layers.\1.cross_attn."),
    (r"^model\.decoder\.layers\.", "decoder.decoder.layers."),
    (r"^model\.decoder\.class_embed\.", "decoder.dec_score_head."),
    (r"^model\.decoder\.bbox_embed\.", "decoder.dec_bbox_head."),
    (r"^model\.decoder\.query_pos_head\.", "decoder.query_pos_head."),
    (r"^model\.(denoising_class_embed|enc_output|enc_score_head|enc_bbox_head)\.", r"decoder.\1."),
    (r"\.self_attn\.o_proj\.", ".self_attn.out_proj."),
    (r"\.mlp\.fc1\.", ".linear1."),
    (r"\.mlp\.fc2\.", ".linear2."),
]


def to_original(state):
    out, qkv = {}, {}
    for key, value in state.items():
        if key.endswith("num_batches_tracked"):
            continue
        for pattern, repl in TO_ORIGINAL:
            key = re.sub(pattern, repl, key)
        m = re.match(r"^(.*\.self_attn)\.(q|k|v)_proj\.(weight|bias)$", key)
        if m:
            qkv.setdefault((m[1], m[3]), {})[m[2]] = value
        else:
            out[key] = value
    for (prefix, kind), parts in qkv.items():  # nn.MultiheadAttention's in_proj: rows q, k, v
        out[f"{prefix}.in_proj_{kind}"] = torch.cat([parts[c] for c in "qkv"])
    assert not [k for k in out if k.startswith("model.")]
    return out


def test_a_checkpoint_in_the_original_layout_loads_with_its_config(tmp_path):
    hf = reference(seed=12)
    original = to_original(hf.state_dict())
    assert "backbone.res_layers.1.blocks.0.short.conv.conv.weight" in original
    assert "decoder.decoder.layers.0.self_attn.in_proj_weight" in original
    path = tmp_path / "rtdetr_r50vd_6x_coco.pth"
    torch.save({"ema": {"module": original}}, path)
    check_eval(load_detr(str(path), config=hf.config), hf, images(), "lyuwenyu/RT-DETR checkpoint file")
    check_eval(load_detr({"model": original}, hf.config), hf, images(64, 160), "lyuwenyu/RT-DETR {'model': ...}")
    with pytest.raises(ValueError, match="without its configuration"):
        load_detr({"model": original})
