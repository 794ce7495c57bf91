"""Load the DETR weights users have into vispe's detector: ``load_detr(source, **overrides)``.

``source`` is one of

* a ``transformers.DetrForObjectDetection`` (its config gives the architecture) or its
  ``state_dict()``: transformers 5 key names (``model.backbone.model.*``, ``self_attn.o_proj``,
  ``mlp.fc1``) and transformers 4 ones (``model.backbone.conv_encoder.model.*``, ``out_proj``,
  ``fc1``), with the timm ResNet backbone (``use_timm_backbone=True``, the hub's DETR checkpoints);
* facebookresearch/detr's checkpoint format: a dict whose ``model`` entry is the state_dict
  (``backbone.0.body.*``, ``transformer.encoder.layers.N.self_attn.in_proj_weight``, ...; its
  ``args`` give the architecture when present), or that state_dict itself;
* transformers' ``ConditionalDetrForObjectDetection`` / ``DabDetrForObjectDetection`` or their
  ``state_dict()`` (``vispe.models.detr.load.positioned``): ``create_detr(decoder="conditional" |
  "dab")`` with their sigmoid class head and, for DAB-DETR, its feature sine temperature and PReLU;
* the papers' own Conditional DETR (Atten4Vis/ConditionalDETR) and DAB-DETR (IDEA-Research/DAB-DETR)
  checkpoints, ``{"model": state_dict, "args": Namespace}`` or the state_dict alone
  (``load_positioned.OFFICIAL``);
* transformers' ``DeformableDetrForObjectDetection`` (or its ``state_dict()`` with ``config=`` its
  config) and fundamentalvision/Deformable-DETR's checkpoints, single-stage, ``with_box_refine`` and
  ``two_stage``: ``create_detr(attention="deformable", decoder="deformable")``
  (``vispe.models.detr.load.deformable``);
* vispe's own checkpoints, ``{"config": model.config, "model": state_dict}``, rebuilt from their config
  (written by an older vispe: upgraded first, ``vispe.models.detr.load.upgrade``);
* a path to a ``.pth`` / ``.bin`` file holding any of these (read with ``weights_only=True``).

What the weights cannot tell (``nheads``, ``dilation``, dropout) comes from the config or the
checkpoint's ``args``; a bare state_dict without them is refused unless ``nheads`` is passed
(a guess would build another model silently: 4 and 8 heads have the same tensors); ``overrides``
go to ``create_detr`` and win. The position encoding is DETR's: ``sine`` (normalised), or for
``position_embedding_type="learned"`` / DETR's ``row_embed``/``col_embed`` the ``learned_rowcol``
encoding with ``axis_order="xy"`` (DETR puts x first). Every key of the model must be filled and
every key of the source used, with equal shapes; anything else is a ValueError naming the key.
Note: transformers' ``auxiliary_loss=True`` feeds the normalised decoder states on to the next
layer, which DETR does not; vispe follows DETR (final outputs agree either way).
"""
from __future__ import annotations

import argparse
from pathlib import Path

import torch

from vispe.models.detr.build import create_detr
from vispe.models.detr.load import deformable as D, positioned as P
from vispe.models.detr.load.keys import rename_keys, resnet_of
from vispe.models.detr.load.positioned import check_timm_backbone as _check_timm_backbone
from vispe.models.detr.load.upgrade import is_vispe_checkpoint, upgrade_config
from vispe.models.detr.model import DETR
from vispe.models.detr.realtime import load as R  # RT-DETR (issue 48)
from vispe.models.detr.realtime.model import RTDETR
from vispe.models.detr.vitdet.model import ViTDETR  # the return annotation (the loader stays lazy below)

_COMMON = [  # (pattern, replacement) applied to both formats after their own renames
    (r"^bbox_predictor\.layers\.", "bbox_embed.layers."),
    (r"^class_labels_classifier\.", "class_embed."),
]
_HF = [
    (r"^model\.backbone\.(?:conv_encoder\.)?model\.", "backbone.body."),
    (r"^model\.input_projection\.", "input_proj."),
    (r"^model\.query_position_embeddings\.", "query_embed."),
    (r"^model\.position_embedding\.row_embeddings\.weight$", "pe.row.weight"),
    (r"^model\.position_embedding\.column_embeddings\.weight$", "pe.col.weight"),
    (r"^model\.decoder\.layernorm\.", "transformer.decoder_norm."),
    (r"^model\.(encoder|decoder)\.layers\.(\d+)\.", r"transformer.\1.\2."),
    (r"\.encoder_attn\.", ".cross_attn."),
    (r"\.(self_attn|cross_attn)\.(?:o_proj|out_proj)\.", r".\1.proj."),
    (r"^(transformer\.decoder\.\d+\.)encoder_attn_layer_norm\.", r"\1norm2."),
    (r"^(transformer\.decoder\.\d+\.)final_layer_norm\.", r"\1norm3."),
    (r"^(transformer\.encoder\.\d+\.)final_layer_norm\.", r"\1norm2."),
    (r"\.self_attn_layer_norm\.", ".norm1."),
    (r"\.(?:mlp\.)?(fc1|fc2)\.", r".mlp.\1."),
]
_DETR = [
    (r"^backbone\.0\.body\.", "backbone.body."),
    (r"^backbone\.1\.row_embed\.weight$", "pe.row.weight"),
    (r"^backbone\.1\.col_embed\.weight$", "pe.col.weight"),
    (r"^transformer\.decoder\.norm\.", "transformer.decoder_norm."),
    (r"^transformer\.(encoder|decoder)\.layers\.(\d+)\.", r"transformer.\1.\2."),
    (r"\.multihead_attn\.", ".cross_attn."),
    (r"\.(self_attn|cross_attn)\.in_proj_(weight|bias)$", r".\1.qkv.\2"),
    (r"\.(self_attn|cross_attn)\.out_proj\.", r".\1.proj."),
    (r"\.linear(1|2)\.", r".mlp.fc\1."),
]


def _file(source):
    """``source`` itself, or what the file it names holds."""
    if isinstance(source, (str, Path)):
        path = Path(source)
        if not path.is_file():
            raise ValueError(f"source={str(path)!r}: no such file")
        with torch.serialization.safe_globals([argparse.Namespace]):
            return torch.load(path, map_location="cpu", weights_only=True)
    return source


def _read(source):
    """(state_dict, format, architecture hints) from any accepted ``source``."""
    if isinstance(source, torch.nn.Module):
        model_type = getattr(getattr(source, "config", None), "model_type", None)
        if model_type in P.DESIGN_OF_MODEL_TYPE:
            design = P.DESIGN_OF_MODEL_TYPE[model_type]
            _check_timm_backbone(source.config)
            return source.state_dict(), design, P.hints_from_config(source.config, design)
        if model_type != "detr":
            raise ValueError(f"source is a {type(source).__name__}: expected a transformers DetrForObjectDetection, "
                             "ConditionalDetrForObjectDetection or DabDetrForObjectDetection")
        return source.state_dict(), "transformers", _hints_from_hf_config(source.config)
    if not isinstance(source, dict):
        raise ValueError(f"source is a {type(source).__name__}: expected a model, a state_dict, a DETR checkpoint or a path")
    hints, args = {}, None
    if "model" in source and isinstance(source["model"], dict):  # the papers' .pth: {"model": ..., "args": ...}
        args, source = source.get("args"), source["model"]
    hints = _hints_from_detr_args(args)
    official = P.official_design(source)
    if official is not None:  # Atten4Vis/ConditionalDETR, IDEA-Research/DAB-DETR
        return source, "official", P.hints_from_official_args(args, official, hints)
    keys = list(source)
    design = P.design_of_state(source)
    if design is not None and any(k.startswith("model.") for k in keys):
        return source, design, {**hints, "decoder": design, "class_head": "sigmoid"}
    if any(k.startswith("model.") for k in keys):
        return source, "transformers", hints
    if any(k.startswith("transformer.encoder.layers.") or k.startswith("backbone.0.body.") for k in keys):
        return source, "detr", hints
    raise ValueError(f"source has keys like {keys[:3]}: expected a transformers DETR state_dict "
                     "(model.backbone..., class_labels_classifier...) or a facebookresearch/detr one (backbone.0.body...)")


def _hints_from_hf_config(c) -> dict:
    name = _check_timm_backbone(c)
    if c.encoder_attention_heads != c.decoder_attention_heads or c.encoder_ffn_dim != c.decoder_ffn_dim:
        raise ValueError("source has different encoder and decoder heads or FFN sizes: vispe's DETR uses one of each")
    if getattr(c, "activation_function", "relu") != "relu":
        raise ValueError(f"source has activation_function={c.activation_function!r}: expected 'relu' (DETR's)")
    return dict(backbone=name, dilation=bool(getattr(c, "dilation", False)), nheads=c.encoder_attention_heads,
                dropout=c.dropout, attn_dropout=c.attention_dropout, aux_loss=bool(c.auxiliary_loss),
                position=c.position_embedding_type)


def _hints_from_detr_args(args) -> dict:
    a = P.args_dict(args)
    if a.get("pre_norm"):
        raise ValueError("source was trained with --pre_norm: vispe's DETR is post-norm (DETR's default)")
    hints = {k2: a[k1] for k1, k2 in (("backbone", "backbone"), ("dilation", "dilation"), ("nheads", "nheads"),
                                       ("dropout", "dropout"), ("position_embedding", "position")) if k1 in a}
    if "aux_loss" in a:
        hints["aux_loss"] = bool(a["aux_loss"])
    return hints


def _rename(state: dict, fmt: str) -> dict:
    rules = {"transformers": _HF + _COMMON, "detr": _DETR + _COMMON, "conditional": P.CONDITIONAL, "dab": P.DAB,
             "official": P.OFFICIAL}[fmt]
    out, _ = rename_keys(state, rules)
    return P.tie_dab_box_heads(out) if fmt in ("dab", "official") else out


def _architecture(state: dict, hints: dict) -> dict:
    """create_detr arguments read off the renamed weights (and hints for what they cannot say)."""
    def count(prefix):  # distinct indices right after ``prefix``
        return len({k[len(prefix):].split(".")[0] for k in state if k.startswith(prefix)})

    for need in ("query_embed.weight", "class_embed.weight", "transformer.decoder.0.mlp.fc1.weight"):
        if need not in state:
            raise ValueError(f"source has no weights for {need!r} (after renaming): not a DETR detection checkpoint")
    q = state["query_embed.weight"]
    blocks = count("backbone.body.layer3.")
    backbone = hints.get("backbone") or resnet_of(state)
    if backbone not in ("resnet18", "resnet34", "resnet50", "resnet101"):
        raise ValueError(f"source backbone {backbone!r} ({blocks} blocks in layer3): expected a ResNet-18/34/50/101")
    positioned = hints.get("decoder", "detr") != "detr"
    arch = dict(num_classes=state["class_embed.weight"].shape[0] - (0 if positioned else 1), num_queries=q.shape[0],
                d_model=state["input_proj.weight"].shape[0] if positioned else q.shape[1],
                enc_layers=count("transformer.encoder."), dec_layers=count("transformer.decoder."),
                dim_feedforward=state["transformer.decoder.0.mlp.fc1.weight"].shape[0], backbone=backbone)
    arch.update({k: hints[k] for k in ("dilation", "nheads", "dropout", "attn_dropout", "aux_loss", "decoder",
                                       "class_head", "activation", "pe_kwargs") if k in hints})
    if positioned:
        dk = dict(hints.get("decoder_kwargs", {}))
        if hints["decoder"] == "dab":
            dk.setdefault("query_dim", q.shape[1])
            dk.setdefault("keep_query_pos", "transformer.decoder.1.cross_attn.q_pos.weight" in state)
        else:
            dk.setdefault("keep_query_pos", "transformer.decoder.1.cross_attn.q_pos.weight" in state)
        if hints["decoder"] == "dab" and "activation" not in hints:
            arch["activation"] = "prelu" if "transformer.decoder.0.mlp.act.weight" in state else "relu"
        arch["decoder_kwargs"] = dk
        return arch
    learned = hints.get("position") == "learned" or "pe.row.weight" in state
    if learned:
        n = state["pe.row.weight"].shape[0] if "pe.row.weight" in state else 50
        arch.update(pe="learned_rowcol", pe_kwargs=dict(axis_order="xy", max_size=(n, n)))
    return arch


def load_detr(source, config=None, **overrides) -> DETR | RTDETR | ViTDETR:
    """A vispe DETR built for ``source``'s architecture with its weights (module docstring); ``config``: a
    transformers ``DeformableDetrConfig`` beside a Deformable DETR state_dict, or an ``RTDetrConfig`` beside
    an RT-DETR one."""
    source = _file(source)
    if R.is_realtime(source, config):
        return R.load_rtdetr(source, config, **overrides)
    if is_vispe_checkpoint(source):  # vispe's own: rebuilt from its config (older formats upgraded)
        if config is not None:
            raise ValueError("config=... with a vispe checkpoint: its own config builds the model")
        model = create_detr(**{**upgrade_config(source["config"]), **overrides})
        model.load_state_dict(source["model"])
        return model
    from vispe.models.detr.vitdet.load import is_vit_detr, load_vit_detr  # LW-DETR / RF-DETR (issue 49)
    if is_vit_detr(source, config):
        return load_vit_detr(source, config, **overrides)
    if D.is_deformable(source):
        return D.load_deformable_detr(source, config, **overrides)
    if config is not None:
        raise ValueError(f"config={type(config).__name__}: only a Deformable DETR state_dict takes a config here; "
                         "pass the transformers model itself, or nheads=... for a DETR state_dict")
    state, fmt, hints = _read(source)
    state = _rename({k: v for k, v in state.items() if not k.endswith("num_batches_tracked")}, fmt)
    if "nheads" not in hints and "nheads" not in overrides:
        raise ValueError("source is a state_dict without its configuration: the number of attention heads cannot be "
                         "read from the weights (4 and 8 heads have the same tensors); pass nheads=... (and "
                         "dilation=True for a DC5 model), or load the transformers model itself")
    kwargs = {**_architecture(state, hints), **overrides}
    model = create_detr(**kwargs)
    if kwargs.get("dec_layers") == 1 and not any(k.startswith("queries.query_scale.") for k in model.state_dict()):
        # Conditional / DAB-DETR scale the query position from the second layer on: with one decoder layer
        # the source's query_scale never runs, and vispe does not build a module without a gradient
        state = {k: v for k, v in state.items() if not k.startswith("queries.query_scale.")}
    return P.load_fitting_state(model, state, f"source ({fmt} format) does not fit vispe's DETR", kwargs)
