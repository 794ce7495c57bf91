"""The original repositories' checkpoint layouts (Atten4Vis/LW-DETR, roboflow/rf-detr) through ``load_detr``.

No original checkpoint is downloaded: a transformers model (random weights, every parameter perturbed) is
written in the original layout by the tables below, the inverse of transformers' own conversion scripts
(``models/lw_detr/convert_lw_detr_to_hf.py``'s ``ORIGINAL_TO_CONVERTED_KEY_MAPPING`` and
``backbone_read_in_q_k_v`` / ``read_in_q_k_v``; ``models/rf_detr/convert_rf_detr_weights_to_hf.py``'s
``get_weight_mapping``, whose DINOv2 names are transformers' ``Dinov2WithRegistersModel`` renames in
``conversion_mapping.py``), saved as their training script saves it (``{"model": state_dict, "args": ...}``),
and loaded by path with the config: the outputs equal those of the model loaded from transformers, and
transformers' own within 1e-4.
"""
from __future__ import annotations

import argparse
import re

import pytest
import torch

from tests._vit_detr_refs import lw_detr, max_errors, reference_outputs, rf_detr
from vispe.models.detr import load_detr

_HF = r"^model\.backbone\.backbone\."
# (transformers 5.23 name, original name), applied in order, first match wins
TO_LW = [
    (_HF + r"embeddings\.position_embeddings$", "backbone.0.encoder.pos_embed"),
    (_HF + r"embeddings\.projection\.", "backbone.0.encoder.patch_embed.proj."),
    (_HF + r"encoder\.layer\.(\d+)\.gamma_([12])$", r"backbone.0.encoder.blocks.\1.gamma_\2"),
    (_HF + r"encoder\.layer\.(\d+)\.layernorm_before\.", r"backbone.0.encoder.blocks.\1.norm1."),
    (_HF + r"encoder\.layer\.(\d+)\.layernorm_after\.", r"backbone.0.encoder.blocks.\1.norm2."),
    (_HF + r"encoder\.layer\.(\d+)\.attention\.o_proj\.", r"backbone.0.encoder.blocks.\1.attn.proj."),
    (_HF + r"encoder\.layer\.(\d+)\.attention\.([qkv])_proj\.", r"backbone.0.encoder.blocks.\1.attn.\2_proj."),
    (_HF + r"encoder\.layer\.(\d+)\.intermediate\.fc([12])\.", r"backbone.0.encoder.blocks.\1.mlp.fc\2."),
]
TO_RF = [
    (_HF + r"embeddings\.", "backbone.0.encoder.encoder.embeddings."),
    (_HF + r"encoder\.layer\.(\d+)\.attention\.q_proj\.", r"backbone.0.encoder.encoder.encoder.layer.\1.attention.attention.query."),
    (_HF + r"encoder\.layer\.(\d+)\.attention\.k_proj\.", r"backbone.0.encoder.encoder.encoder.layer.\1.attention.attention.key."),
    (_HF + r"encoder\.layer\.(\d+)\.attention\.v_proj\.", r"backbone.0.encoder.encoder.encoder.layer.\1.attention.attention.value."),
    (_HF + r"encoder\.layer\.(\d+)\.attention\.o_proj\.", r"backbone.0.encoder.encoder.encoder.layer.\1.attention.output.dense."),
    (_HF + r"encoder\.", "backbone.0.encoder.encoder.encoder."),
    (_HF + r"layernorm\.", "backbone.0.encoder.encoder.layernorm."),
    (r"^model\.backbone\.projector\.(projector_layer|layer_norm)\.", r"model.backbone.projector.scale_layers.0.\1."),
]
_P = r"^model\.backbone\.projector\.scale_layers\.(\d+)\."
TO_SHARED = [  # the projector and the decoder, the same in both repositories
    (_P + r"projector_layer\.conv([12])\.conv\.", r"backbone.0.projector.stages.\1.0.cv\2.conv."),
    (_P + r"projector_layer\.conv([12])\.norm\.", r"backbone.0.projector.stages.\1.0.cv\2.bn."),
    (_P + r"projector_layer\.bottlenecks\.(\d+)\.conv([12])\.conv\.", r"backbone.0.projector.stages.\1.0.m.\2.cv\3.conv."),
    (_P + r"projector_layer\.bottlenecks\.(\d+)\.conv([12])\.norm\.", r"backbone.0.projector.stages.\1.0.m.\2.cv\3.bn."),
    (_P + r"layer_norm\.", r"backbone.0.projector.stages.\1.1."),
    (_P + r"sampling_layers\.(\d+)\.layers\.(\d+)\.norm\.", r"backbone.0.projector.stages_sampling.\1.\2.\3.bn."),
    (_P + r"sampling_layers\.(\d+)\.layers\.(\d+)\.", r"backbone.0.projector.stages_sampling.\1.\2.\3."),
    (r"^model\.decoder\.layers\.(\d+)\.self_attn\.o_proj\.", r"transformer.decoder.layers.\1.self_attn.out_proj."),
    (r"^model\.decoder\.layers\.(\d+)\.self_attn\.([qkv])_proj\.", r"transformer.decoder.layers.\1.self_attn.\2_proj."),
    (r"^model\.decoder\.layers\.(\d+)\.self_attn_layer_norm\.", r"transformer.decoder.layers.\1.norm1."),
    (r"^model\.decoder\.layers\.(\d+)\.cross_attn_layer_norm\.", r"transformer.decoder.layers.\1.norm2."),
    (r"^model\.decoder\.layers\.(\d+)\.layer_norm\.", r"transformer.decoder.layers.\1.norm3."),
    (r"^model\.decoder\.layers\.(\d+)\.mlp\.fc([12])\.", r"transformer.decoder.layers.\1.linear\2."),
    (r"^model\.decoder\.layers\.(\d+)\.cross_attn\.", r"transformer.decoder.layers.\1.cross_attn."),
    (r"^model\.decoder\.layernorm\.", "transformer.decoder.norm."),
    (r"^model\.decoder\.ref_point_head\.", "transformer.decoder.ref_point_head."),
    (r"^model\.(enc_output|enc_output_norm|enc_out_class_embed|enc_out_bbox_embed)\.", r"transformer.\1."),
    (r"^model\.reference_point_embed\.", "refpoint_embed."),
    (r"^model\.query_feat\.", "query_feat."),
    (r"^(class_embed|bbox_embed)\.", r"\1."),
]


def to_original(state: dict, table: list) -> dict:
    """transformers' state_dict in the original layout: renamed by ``table``, then ``TO_SHARED`` (first match each),
    then q, k, v joined as the originals hold them: the decoder's ``nn.MultiheadAttention`` ``in_proj_weight`` /
    ``in_proj_bias``, LW-DETR's ViT a bias-free ``qkv`` with CAE's ``q_bias`` / ``v_bias`` (its k has no bias)."""
    out = {}
    for key, value in state.items():
        new = key
        for rules in (table, TO_SHARED):  # each pass: the first matching rule
            new = next((re.sub(p, r, new) for p, r in rules if re.match(p, new)), new)
        assert new != key or key.startswith(("class_embed.", "bbox_embed.")), f"the test's table misses {key}"
        out[new] = value
    for prefix in sorted({k.rsplit(".", 2)[0] for k in out if re.search(r"\.(self_attn|attn)\.q_proj\.weight$", k)}):
        parts = {c: out.pop(f"{prefix}.{c}_proj.weight") for c in "qkv"}
        bias = {c: out.pop(f"{prefix}.{c}_proj.bias") for c in "qkv" if f"{prefix}.{c}_proj.bias" in out}
        if prefix.endswith("self_attn"):
            out[f"{prefix}.in_proj_weight"] = torch.cat([parts[c] for c in "qkv"])
            out[f"{prefix}.in_proj_bias"] = torch.cat([bias[c] for c in "qkv"])
        else:  # LW-DETR's CAE attention
            assert set(bias) == {"q", "v"}
            out[f"{prefix}.qkv.weight"] = torch.cat([parts[c] for c in "qkv"])
            out[f"{prefix}.q_bias"], out[f"{prefix}.v_bias"] = bias["q"], bias["v"]
    return out


def _save(tmp_path, state: dict) -> str:
    path = tmp_path / "checkpoint.pth"
    torch.save({"model": state, "args": argparse.Namespace(lite_refpoint_refine=True), "epoch": 0}, path)
    return str(path)


@pytest.mark.parametrize("kind", ["lw", "rf"])
def test_original_layout_loads_with_parity(kind, tmp_path):
    ref, table = (lw_detr(scale=0.1), TO_LW) if kind == "lw" else (rf_detr(scale=0.1), TO_RF)
    state = to_original(ref.state_dict(), table)
    assert not any(k.startswith("model.") for k in state) and "refpoint_embed.weight" in state
    if kind == "lw":
        assert "backbone.0.encoder.blocks.0.attn.q_bias" in state and "backbone.0.encoder.blocks.0.attn.qkv.bias" not in state
    else:
        assert "backbone.0.encoder.encoder.encoder.layer.0.attention.attention.key.bias" in state
    model = load_detr(_save(tmp_path, state), config=ref.config).eval()
    direct = load_detr(ref).eval()
    x = torch.randn(2, 3, 64, 64, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        out, want = model(x), direct(x)
    for k in ("pred_logits", "pred_boxes"):
        assert torch.equal(out[k], want[k]), k
    assert torch.equal(out["enc_outputs"]["pred_logits"], want["enc_outputs"]["pred_logits"])
    errors = max_errors(out, reference_outputs(ref, x))
    assert max(errors.values()) < 1e-4, errors


def test_original_layout_refuses_unknown_keys(tmp_path):
    ref = lw_detr()
    state = to_original(ref.state_dict(), TO_LW)
    with pytest.raises(ValueError, match=r"no rule knows: \['transformer\.decoder\.extra\.weight'\]"):
        load_detr({**state, "transformer.decoder.extra.weight": torch.zeros(1)}, config=ref.config)
    shared = {**state, "transformer.decoder.bbox_embed.layers.0.weight": state["bbox_embed.layers.0.weight"]}
    with pytest.raises(ValueError, match="lite_refpoint_refine=False"):
        load_detr(_save(tmp_path, shared), config=ref.config)
    state.pop("backbone.0.encoder.blocks.1.attn.v_bias")  # the q bias alone: not CAE's pair
    with pytest.raises(ValueError, match=r"\['q'\] projections for backbone\.blocks\.1\.attn\.bias"):
        load_detr(state, config=ref.config)
