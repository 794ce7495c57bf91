"""Key maps and architectures of the positioned-query detectors for ``load_detr``.

transformers' ``ConditionalDetrForObjectDetection`` and ``DabDetrForObjectDetection`` (a model, or its
``state_dict()`` with the architecture passed as arguments) map onto ``create_detr(decoder=
"conditional" | "dab")``; see ``vispe.models.detr.load.detr`` for the entry point. Content and position
projections (``q_content_proj``, ``q_pos_proj``, ...) map onto the one ``Attention``: content q, k, v
into its fused ``qkv`` (``load._rename`` fuses them), positions into ``q_pos`` / ``k_pos``, the sine
query projection into ``q_spatial``. DAB-DETR's decoder box head (``model.decoder.bbox_embed``) is
its ``bbox_predictor`` (tied in transformers): both keys must hold the same tensor.

The papers' own checkpoints load too (``OFFICIAL``): Atten4Vis/ConditionalDETR's and
IDEA-Research/DAB-DETR's ``checkpoint.pth`` (``{"model": state_dict, "args": Namespace}``, or the
state_dict alone). Their decoder layers hold the projections as ``sa_qcontent_proj``, ``ca_kpos_proj``,
``ca_qpos_sine_proj``, ... beside a ``MultiheadAttention`` that keeps only its ``out_proj``; their
encoder layers are DETR's (``in_proj_weight``, ``linear1``); DAB-DETR's PReLU is each layer's
``activation.weight``, and its decoder's box head is stored twice (``bbox_embed`` and
``transformer.decoder.bbox_embed``, one module). Their ``args`` give what the weights cannot
(``nheads``, ``dilation``, ``dropout``, DAB's ``pe_temperatureH/W``); without ``args``, ``nheads`` must be
passed and DAB's feature sine takes the paper's temperature 20 (``pe_kwargs`` overrides it).
"""
from __future__ import annotations

import torch

from vispe.encoding import GRID_KEY

DESIGN_OF_MODEL_TYPE = {"conditional_detr": "conditional", "dab-detr": "dab"}

_COMMON = [
    (r"^model\.backbone\.(?:conv_encoder\.)?model\.(?:_backbone\.)?", "backbone.body."),
    (r"^model\.input_projection\.", "input_proj."),
    (r"^model\.decoder\.layernorm\.", "transformer.decoder_norm."),
    (r"^model\.decoder\.(query_scale|ref_point_head|ref_anchor_head)\.", r"queries.\1."),
    (r"^model\.encoder\.query_scale\.", "transformer.enc_pos_scale."),
    (r"^model\.(encoder|decoder)\.layers\.(\d+)\.", r"transformer.\1.\2."),
    (r"^bbox_predictor\.", "bbox_embed."),
]
CONDITIONAL = [
    (r"^model\.query_position_embeddings\.", "query_embed."),
    (r"^class_labels_classifier\.", "class_embed."),
    *_COMMON,
    (r"\.encoder_attn\.", ".cross_attn."),
    (r"\.(self_attn|cross_attn)\.o_proj\.", r".\1.proj."),
    (r"\.(self_attn|cross_attn)\.(q|k)_content_proj\.", r".\1.\2_proj."),
    (r"\.(self_attn|cross_attn)\.(q|k)_pos_proj\.", r".\1.\2_pos."),
    (r"\.cross_attn\.q_pos_sine_proj\.", ".cross_attn.q_spatial."),
    (r"^(transformer\.decoder\.\d+\.)encoder_attn_layer_norm\.", r"\1norm2."),
    (r"^(transformer\.decoder\.\d+\.)final_layer_norm\.", r"\1norm3."),
    (r"^(transformer\.encoder\.\d+\.)final_layer_norm\.", r"\1norm2."),
    (r"\.self_attn_layer_norm\.", ".norm1."),
]
DAB = [
    (r"^model\.query_refpoint_embeddings\.", "query_embed."),
    (r"^model\.decoder\.bbox_embed\.", "decoder_bbox_embed."),
    *_COMMON,
    # encoder layers: DETR's attention names, FFN without the mlp prefix
    (r"^(transformer\.encoder\.\d+\.)self_attn\.out_proj\.", r"\1self_attn.proj."),
    (r"^(transformer\.encoder\.\d+\.)(fc1|fc2)\.", r"\1mlp.\2."),
    (r"^(transformer\.encoder\.\d+\.)activation_fn\.", r"\1mlp.act."),
    (r"^(transformer\.encoder\.\d+\.)final_layer_norm\.", r"\1norm2."),
    (r"^(transformer\.encoder\.\d+\.)self_attn_layer_norm\.", r"\1norm1."),
    # decoder layers: self_attn.self_attn_query_content_proj, cross_attn.cross_attn_key_pos_proj, ...
    (r"\.(self_attn|cross_attn)\.\1\.output_proj\.", r".\1.proj."),
    (r"\.(self_attn|cross_attn)\.(?:self_attn|cross_attn)_layer_norm\.", r".\1.LN."),
    (r"\.(self_attn|cross_attn)\.(?:self_attn|cross_attn)_query_content_proj\.", r".\1.q_proj."),
    (r"\.(self_attn|cross_attn)\.(?:self_attn|cross_attn)_key_content_proj\.", r".\1.k_proj."),
    (r"\.(self_attn|cross_attn)\.(?:self_attn|cross_attn)_value_proj\.", r".\1.v_proj."),
    (r"\.(self_attn|cross_attn)\.(?:self_attn|cross_attn)_query_pos_sine_proj\.", r".\1.q_spatial."),
    (r"\.(self_attn|cross_attn)\.(?:self_attn|cross_attn)_query_pos_proj\.", r".\1.q_pos."),
    (r"\.(self_attn|cross_attn)\.(?:self_attn|cross_attn)_key_pos_proj\.", r".\1.k_pos."),
    (r"\.self_attn\.LN\.", ".norm1."),
    (r"\.cross_attn\.LN\.", ".norm2."),
    (r"^(transformer\.decoder\.\d+\.)mlp\.final_layer_norm\.", r"\1norm3."),
    (r"^(transformer\.decoder\.\d+\.)mlp\.activation_fn\.", r"\1mlp.act."),
]


OFFICIAL = [  # Atten4Vis/ConditionalDETR and IDEA-Research/DAB-DETR checkpoints
    (r"^backbone\.0\.body\.", "backbone.body."),
    (r"^refpoint_embed\.", "query_embed."),
    (r"^transformer\.decoder\.bbox_embed\.", "decoder_bbox_embed."),
    (r"^transformer\.decoder\.norm\.", "transformer.decoder_norm."),
    (r"^transformer\.decoder\.(query_scale|ref_point_head|ref_anchor_head)\.", r"queries.\1."),
    (r"^transformer\.encoder\.query_scale\.", "transformer.enc_pos_scale."),
    (r"^transformer\.(encoder|decoder)\.layers\.(\d+)\.", r"transformer.\1.\2."),
    (r"\.self_attn\.in_proj_(weight|bias)$", r".self_attn.qkv.\1"),
    (r"\.(self_attn|cross_attn)\.out_proj\.", r".\1.proj."),
    (r"\.sa_(q|k)content_proj\.", r".self_attn.\1_proj."),
    (r"\.ca_(q|k)content_proj\.", r".cross_attn.\1_proj."),
    (r"\.sa_(q|k)pos_proj\.", r".self_attn.\1_pos."),
    (r"\.ca_(q|k)pos_proj\.", r".cross_attn.\1_pos."),
    (r"\.sa_v_proj\.", ".self_attn.v_proj."),
    (r"\.ca_v_proj\.", ".cross_attn.v_proj."),
    (r"\.ca_qpos_sine_proj\.", ".cross_attn.q_spatial."),
    (r"\.linear(1|2)\.", r".mlp.fc\1."),
    (r"\.activation\.weight$", ".mlp.act.weight"),
]


def official_design(state: dict) -> str | None:
    """"conditional" / "dab" for a state_dict in the papers' own layout, else None."""
    if not any(k.endswith("ca_qpos_sine_proj.weight") for k in state):
        return None
    return "dab" if "refpoint_embed.weight" in state else "conditional"


def args_dict(args) -> dict:
    """A checkpoint's ``args`` (its main.py's argparse Namespace, a dict, or None) as a dict."""
    import argparse

    return {} if args is None else (vars(args) if isinstance(args, argparse.Namespace) else dict(args))


def hints_from_official_args(args, design: str, detr_hints: dict) -> dict:
    """create_detr arguments from the papers' ``args``: ``detr_hints`` are what DETR's own arguments
    give (``load._hints_from_detr_args``: backbone, dilation, nheads, dropout, aux_loss; pre_norm
    refused; both papers' code is a fork of DETR's), plus each design's own."""
    a = args_dict(args)
    hints = {k: v for k, v in detr_hints.items() if k != "position"}
    if detr_hints.get("position", "sine") not in ("sine", "v2"):
        raise ValueError(f"source was trained with --position_embedding {a['position_embedding']!r}: expected 'sine'")
    hints.update(decoder=design, class_head="sigmoid")
    if design == "conditional":
        hints["pe_kwargs"] = dict(temperature=10000.0, normalize=True)
        return hints
    th, tw = a.get("pe_temperatureH", 20), a.get("pe_temperatureW", 20)
    if th != tw:
        raise ValueError(f"source has pe_temperatureH={th}, pe_temperatureW={tw}: vispe's sine has one temperature "
                         "for both axes")
    if a.get("num_patterns", 0):
        raise ValueError(f"source has num_patterns={a['num_patterns']}: vispe's DAB-DETR has no pattern embeddings")
    if a.get("two_stage", False):
        raise ValueError("source has two_stage=True (DAB-Deformable-DETR): expected DAB-DETR")
    hints["pe_kwargs"] = dict(temperature=float(th), normalize=True)
    if "transformer_activation" in a:
        hints["activation"] = a["transformer_activation"]
    hints["decoder_kwargs"] = dict(random_refpoints_xy=bool(a.get("random_refpoints_xy", False)))
    return hints


def tie_dab_box_heads(state: dict) -> dict:
    """DAB-DETR's decoder box head is its box predictor: fold ``decoder_bbox_embed.*`` into ``bbox_embed.*``."""
    out = {k: v for k, v in state.items() if not k.startswith("decoder_bbox_embed.")}
    for k, v in state.items():
        if k.startswith("decoder_bbox_embed."):
            own = "bbox_embed." + k[len("decoder_bbox_embed."):]
            if own in out and not torch.equal(out[own], v):
                raise ValueError(f"source's decoder box head (model.decoder.bbox_embed, transformer.decoder.bbox_embed) and "
                                 f"its box predictor differ at {own!r}: DAB-DETR "
                                 "shares one box head between anchor refinement and predictions (vispe too)")
            out.setdefault(own, v)
    return out


def hints_from_config(c, design: str) -> dict:
    """create_detr arguments a transformers Conditional/DAB-DETR config gives beyond the weights."""
    if c.encoder_attention_heads != c.decoder_attention_heads or c.encoder_ffn_dim != c.decoder_ffn_dim:
        raise ValueError("source has different encoder and decoder heads or FFN sizes: vispe's DETR uses one of each")
    act = getattr(c, "activation_function", "relu")
    hints = dict(nheads=c.encoder_attention_heads, dropout=c.dropout, attn_dropout=c.attention_dropout,
                 aux_loss=True, dilation=bool(getattr(c, "dilation", False)), activation=act,
                 backbone=getattr(c, "backbone", None), decoder=design, class_head="sigmoid")
    if getattr(c, "normalize_before", False):
        raise ValueError("source has normalize_before=True: vispe's decoder is post-norm (the papers' default)")
    if design == "conditional":
        if getattr(c, "position_embedding_type", "sine") != "sine":
            raise ValueError(f"source has position_embedding_type={c.position_embedding_type!r}: expected 'sine'")
        hints["pe_kwargs"] = dict(temperature=10000.0, normalize=True)
        return hints
    if c.temperature_height != c.temperature_width:
        raise ValueError(f"source has temperature_height={c.temperature_height}, temperature_width="
                         f"{c.temperature_width}: vispe's sine has one temperature for both axes")
    if getattr(c, "num_patterns", 0):
        raise ValueError(f"source has num_patterns={c.num_patterns}: vispe's DAB-DETR has no pattern embeddings")
    scale = getattr(c, "sine_position_embedding_scale", None)
    hints["pe_kwargs"] = dict(temperature=float(c.temperature_height), normalize=True,
                              **({"scale": float(scale)} if scale is not None else {}))
    hints["decoder_kwargs"] = dict(query_dim=c.query_dim, keep_query_pos=bool(c.keep_query_pos),
                                   random_refpoints_xy=bool(c.random_refpoints_xy))
    return hints


def design_of_state(state: dict) -> str | None:
    """"conditional" / "dab" for a transformers state_dict of those models (renamed or not), else None."""
    keys = list(state)
    if any("query_refpoint_embeddings" in k for k in keys):
        return "dab"
    if any(k.endswith("q_pos_sine_proj.weight") for k in keys):
        return "conditional"
    return None


def check_timm_backbone(c) -> str | None:
    """The timm backbone's name of a transformers config; its own ResNet is refused."""
    bb = getattr(c, "backbone_config", None)
    timm_bb = getattr(bb, "model_type", None) == "timm_backbone" if bb is not None else getattr(c, "use_timm_backbone", False)
    if not timm_bb:
        raise ValueError("source uses transformers' own ResNet backbone (use_timm_backbone=False): expected the "
                         "timm backbone (the hub's DETR checkpoints use it); convert or rebuild with use_timm_backbone=True")
    return getattr(bb, "backbone", None) if bb is not None else getattr(c, "backbone", None)


def load_fitting_state(model, state: dict, source: str, kwargs: dict):
    """Load ``state`` into ``model`` after checking that its keys and shapes are the model's own; ``source``
    starts the error ("source ... does not fit ..."), ``kwargs`` are the builder's arguments it names.
    The encodings' grid records (``GRID_KEY``) may be absent (no source outside vispe has them; each
    encoding's load hook then infers the grid from its table)."""
    own = {k: v for k, v in model.state_dict().items() if not k.endswith("." + GRID_KEY)}
    missing, unexpected = sorted(set(own) - set(state)), sorted(set(state) - set(own))
    if missing or unexpected:
        raise ValueError(f"{source}: missing {missing[:5]}{' ...' if len(missing) > 5 else ''}, "
                         f"unexpected {unexpected[:5]}{' ...' if len(unexpected) > 5 else ''}")
    for k, v in state.items():
        if v.shape != own[k].shape:
            raise ValueError(f"source key {k!r} has shape {tuple(v.shape)}: the model built with {kwargs} expects "
                             f"{tuple(own[k].shape)}")
    model.load_state_dict(state)
    return model
