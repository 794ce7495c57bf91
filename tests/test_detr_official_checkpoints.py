"""The papers' own checkpoint layouts: Atten4Vis/ConditionalDETR and IDEA-Research/DAB-DETR
``checkpoint.pth`` files (``{"model": state_dict, "args": Namespace}``), written here from a
transformers model with random weights through a key map read off the papers' code
(``models/transformer.py``: ``sa_qcontent_proj``, ``ca_qpos_sine_proj``, ``linear1``, ``activation``, ...;
``models/conditional_detr.py`` / ``DABDETR.py``: ``query_embed`` / ``refpoint_embed``, ``class_embed``,
``bbox_embed``, ``backbone.0.body``). transformers' classes were converted from these checkpoints, so a
file written this way must give transformers' outputs once loaded by ``load_detr``."""
import argparse
import re

import pytest
import torch
from test_detr_positioned_reference import (
    assert_outputs_equal,
    conditional_reference,
    dab_reference,
    hf_conditional,
    hf_dab,
)
from test_detr_reference import batch

from vispe.models.detr import load_detr

_BACKBONE = [(r"^model\.backbone\.(?:conv_encoder\.)?model\.(?:_backbone\.)?", "backbone.0.body.")]
_LAYERS = [(r"^model\.(encoder|decoder)\.layers\.", r"transformer.\1.layers."),
           (r"^model\.decoder\.layernorm\.", "transformer.decoder.norm."),
           (r"^model\.(encoder|decoder)\.(query_scale|ref_point_head|ref_anchor_head|bbox_embed)\.", r"transformer.\1.\2."),
           (r"^model\.input_projection\.", "input_proj."), (r"^bbox_predictor\.", "bbox_embed.")]
CONDITIONAL = _BACKBONE + _LAYERS + [
    (r"^model\.query_position_embeddings\.", "query_embed."), (r"^class_labels_classifier\.", "class_embed."),
    (r"(decoder\.layers\.\d+)\.self_attn\.(q|k)_content_proj\.", r"\1.sa_\2content_proj."),
    (r"(decoder\.layers\.\d+)\.self_attn\.(q|k)_pos_proj\.", r"\1.sa_\2pos_proj."),
    (r"(decoder\.layers\.\d+)\.self_attn\.v_proj\.", r"\1.sa_v_proj."),
    (r"(decoder\.layers\.\d+)\.encoder_attn\.(q|k)_content_proj\.", r"\1.ca_\2content_proj."),
    (r"(decoder\.layers\.\d+)\.encoder_attn\.(q|k)_pos_proj\.", r"\1.ca_\2pos_proj."),
    (r"(decoder\.layers\.\d+)\.encoder_attn\.v_proj\.", r"\1.ca_v_proj."),
    (r"(decoder\.layers\.\d+)\.encoder_attn\.q_pos_sine_proj\.", r"\1.ca_qpos_sine_proj."),
    (r"\.encoder_attn\.o_proj\.", ".cross_attn.out_proj."), (r"\.self_attn\.o_proj\.", ".self_attn.out_proj."),
    (r"\.self_attn_layer_norm\.", ".norm1."), (r"\.encoder_attn_layer_norm\.", ".norm2."),
    (r"(decoder\.layers\.\d+)\.final_layer_norm\.", r"\1.norm3."),
    (r"(encoder\.layers\.\d+)\.final_layer_norm\.", r"\1.norm2."),
    (r"\.mlp\.fc(1|2)\.", r".linear\1."),
]
DAB = _BACKBONE + _LAYERS + [
    (r"^model\.query_refpoint_embeddings\.", "refpoint_embed."),
    (r"\.self_attn\.self_attn_(query|key)_content_proj\.", lambda m: f".sa_{m[1][0]}content_proj."),
    (r"\.self_attn\.self_attn_(query|key)_pos_proj\.", lambda m: f".sa_{m[1][0]}pos_proj."),
    (r"\.self_attn\.self_attn_value_proj\.", ".sa_v_proj."),
    (r"\.cross_attn\.cross_attn_(query|key)_content_proj\.", lambda m: f".ca_{m[1][0]}content_proj."),
    (r"\.cross_attn\.cross_attn_(query|key)_pos_proj\.", lambda m: f".ca_{m[1][0]}pos_proj."),
    (r"\.cross_attn\.cross_attn_value_proj\.", ".ca_v_proj."),
    (r"\.cross_attn\.cross_attn_query_pos_sine_proj\.", ".ca_qpos_sine_proj."),
    (r"\.(self_attn|cross_attn)\.\1\.output_proj\.", r".\1.out_proj."),
    (r"\.self_attn\.self_attn_layer_norm\.", ".norm1."), (r"\.cross_attn\.cross_attn_layer_norm\.", ".norm2."),
    (r"\.mlp\.final_layer_norm\.", ".norm3."), (r"\.self_attn_layer_norm\.", ".norm1."),
    (r"(encoder\.layers\.\d+)\.final_layer_norm\.", r"\1.norm2."),
    (r"\.(?:mlp\.)?fc(1|2)\.", r".linear\1."), (r"\.(?:mlp\.)?activation_fn\.", ".activation."),
]


def official_state(hf, rules) -> dict:
    """``hf.state_dict()`` in the paper's layout: the encoder's q, k, v in one ``in_proj``, and for
    DAB-DETR the shared box head under both of its names."""
    out, qkv = {}, {}
    for key, value in hf.state_dict().items():
        if key.endswith("num_batches_tracked"):
            continue
        m = re.match(r"^model\.encoder\.layers\.(\d+)\.self_attn\.(q|k|v)_proj\.(weight|bias)$", key)
        if m:
            qkv.setdefault((m[1], m[3]), {})[m[2]] = value
            continue
        for pattern, repl in rules:
            key = re.sub(pattern, repl, key)
        out[key] = value.clone()
    for (i, kind), parts in qkv.items():
        out[f"transformer.encoder.layers.{i}.self_attn.in_proj_{kind}"] = torch.cat([parts[c] for c in "qkv"])
    return out


def args_of(hf, design, **kw):
    c = hf.config
    a = dict(backbone="resnet18", dilation=False, nheads=c.encoder_attention_heads, dropout=c.dropout, aux_loss=True,
             position_embedding="sine", pre_norm=False, num_queries=c.num_queries, enc_layers=c.encoder_layers,
             dec_layers=c.decoder_layers, dim_feedforward=c.encoder_ffn_dim, focal_alpha=0.25)
    if design == "dab":
        a.update(hidden_dim=c.hidden_size, pe_temperatureH=c.temperature_height, pe_temperatureW=c.temperature_width,
                 transformer_activation="prelu", num_patterns=0, random_refpoints_xy=False)
    else:
        a.update(hidden_dim=c.d_model)
    return argparse.Namespace(**{**a, **kw})


@pytest.mark.parametrize("design", ["conditional", "dab"])
def test_a_papers_checkpoint_file_gives_transformers_outputs(design, tmp_path):
    hf, rules, ref = (hf_conditional(), CONDITIONAL, conditional_reference) if design == "conditional" else \
        (hf_dab(), DAB, dab_reference)
    state = official_state(hf, rules)
    assert not any(k.startswith("model.") for k in state)  # really the paper's layout
    path = tmp_path / "checkpoint.pth"
    torch.save({"model": state, "optimizer": {}, "epoch": 49, "args": args_of(hf, design)}, path)
    model = load_detr(path).eval()
    assert model.queries.design == design and model.class_head == "sigmoid"
    assert_outputs_equal(model, ref(hf, *batch()))


def test_a_bare_papers_state_dict_needs_heads_and_takes_dab_temperature_20():
    hf = hf_dab()  # transformers' default temperature is the paper's 20
    state = official_state(hf, DAB)
    with pytest.raises(ValueError, match="pass nheads"):
        load_detr(state)
    model = load_detr(state, nheads=4).eval()
    assert model.pe.temperature == 20 and isinstance(model.transformer.encoder[0].mlp.act, torch.nn.PReLU)
    assert_outputs_equal(model, dab_reference(hf, *batch()))


def test_papers_args_that_vispe_does_not_build_are_refused():
    hf = hf_dab()
    state = official_state(hf, DAB)
    for kw, match in ((dict(pe_temperatureH=20, pe_temperatureW=10000), "pe_temperatureH=20, pe_temperatureW=10000"),
                      (dict(num_patterns=3), "num_patterns=3"), (dict(pre_norm=True), "pre_norm"),
                      (dict(position_embedding="learned"), "position_embedding 'learned'")):
        with pytest.raises(ValueError, match=match):
            load_detr({"model": state, "args": args_of(hf, "dab", **kw)})
    state["transformer.decoder.bbox_embed.layers.0.weight"] = state["bbox_embed.layers.0.weight"] + 1
    with pytest.raises(ValueError, match="box head .* differ"):
        load_detr({"model": state, "args": args_of(hf, "dab")})
