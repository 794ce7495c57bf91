"""The original repositories' checkpoint layouts as vispe's keys: Atten4Vis/LW-DETR and roboflow/rf-detr, for
``load_detr(state, config=LwDetrConfig(...) | RfDetrConfig(...))``.

A checkpoint is ``{"model": state_dict, ...}`` (their training script's) or the state_dict. Neither stores its
architecture, so the transformers config that describes it is required (as transformers' conversion scripts
``convert_lw_detr_to_hf.py`` / ``convert_rf_detr_weights_to_hf.py`` build one per model name). The names:

* LW-DETR's ViT (``backbone.0.encoder.``, ViTDet / CAE): ``pos_embed``, ``patch_embed.proj``,
  ``blocks.{i}.{norm1, norm2, attn.qkv, attn.proj, mlp.fc1, mlp.fc2, gamma_1, gamma_2}``; CAE's
  ``attn.q_bias`` / ``attn.v_bias`` beside a bias-free ``qkv`` (the k rows of the fused bias are zeros, as
  its forward builds them);
* RF-DETR's DINOv2 (``backbone.0.encoder.encoder.``, transformers' Dinov2WithRegisters names):
  ``embeddings.{cls_token, mask_token, position_embeddings, patch_embeddings.projection}``,
  ``encoder.layer.{i}.{norm1, norm2, attention.attention.{query,key,value}, attention.output.dense,
  layer_scale1.lambda1, layer_scale2.lambda1, mlp.fc1, mlp.fc2}``, ``layernorm`` (``mask_token``, for
  masked-image pretraining only, is dropped);
* the projector (``backbone.0.projector.``): ``stages.{s}.0`` the C2f block (``cv1``, ``cv2``,
  ``m.{j}.cv1 / cv2``, each ``conv`` + ``bn``), ``stages.{s}.1`` its layer norm, ``stages_sampling.{s}.{j}.{k}``
  the up / down sampling layers (``conv`` + ``bn``, or a transposed convolution);
* the decoder (``transformer.``): ``decoder.layers.{i}.{self_attn (nn.MultiheadAttention's in_proj rows q, k,
  v = vispe's qkv), norm1, cross_attn, norm2, linear1, linear2, norm3}``, ``decoder.norm``,
  ``decoder.ref_point_head``, the two-stage ``enc_output``, ``enc_output_norm``, ``enc_out_class_embed``,
  ``enc_out_bbox_embed`` per group; ``refpoint_embed``, ``query_feat``, ``class_embed``, ``bbox_embed``.

Every key must match a rule: the rest is refused by name. ``transformer.decoder.bbox_embed`` (the head shared
into the decoder when ``lite_refpoint_refine=False``: a per-layer refinement neither transformers nor vispe
implements) is refused with that reason.
"""
from __future__ import annotations

import re
from typing import Any

import torch

from vispe.models.detr.load.keys import layer_rules, rename_keys

_LW = r"^backbone\.0\.encoder\."
_RF = r"^backbone\.0\.encoder\.encoder\."
_PROJ = r"^backbone\.0\.projector\."
_DEC = r"^transformer\.decoder\."

RULES: list[tuple[str, str]] = [  # (original pattern, vispe name); RF-DETR's backbone first (its prefix is longer)
    (_RF + r"embeddings\.cls_token$", "backbone.cls_token"),
    (_RF + r"embeddings\.position_embeddings$", "backbone.pos_embed"),
    (_RF + r"embeddings\.patch_embeddings\.projection\.", "backbone.patch_embed."),
    (_RF + r"encoder\.layer\.(\d+)\.norm([12])\.", r"backbone.blocks.\1.norm\2."),
    (_RF + r"encoder\.layer\.(\d+)\.attention\.attention\.query\.", r"backbone.blocks.\1.attn.q_proj."),
    (_RF + r"encoder\.layer\.(\d+)\.attention\.attention\.key\.", r"backbone.blocks.\1.attn.k_proj."),
    (_RF + r"encoder\.layer\.(\d+)\.attention\.attention\.value\.", r"backbone.blocks.\1.attn.v_proj."),
    (_RF + r"encoder\.layer\.(\d+)\.attention\.output\.dense\.", r"backbone.blocks.\1.attn.proj."),
    (_RF + r"encoder\.layer\.(\d+)\.layer_scale([12])\.lambda1$", r"backbone.blocks.\1.ls\2"),
    (_RF + r"encoder\.layer\.(\d+)\.mlp\.fc1\.", r"backbone.blocks.\1.mlp.0."),
    (_RF + r"encoder\.layer\.(\d+)\.mlp\.fc2\.", r"backbone.blocks.\1.mlp.2."),
    (_RF + r"layernorm\.", "backbone.norm."),
    (_LW + r"pos_embed$", "backbone.pos_embed"),
    (_LW + r"patch_embed\.proj\.", "backbone.patch_embed."),
    (_LW + r"blocks\.(\d+)\.norm([12])\.", r"backbone.blocks.\1.norm\2."),
    (_LW + r"blocks\.(\d+)\.gamma_([12])$", r"backbone.blocks.\1.ls\2"),
    (_LW + r"blocks\.(\d+)\.attn\.qkv\.", r"backbone.blocks.\1.attn.qkv."),
    (_LW + r"blocks\.(\d+)\.attn\.([qv])_bias$", r"backbone.blocks.\1.attn.\2_proj.bias"),  # CAE: no k bias
    (_LW + r"blocks\.(\d+)\.attn\.proj\.", r"backbone.blocks.\1.attn.proj."),
    (_LW + r"blocks\.(\d+)\.mlp\.fc1\.", r"backbone.blocks.\1.mlp.0."),
    (_LW + r"blocks\.(\d+)\.mlp\.fc2\.", r"backbone.blocks.\1.mlp.2."),
    (_PROJ + r"stages\.(\d+)\.0\.cv([12])\.conv\.", r"projector.scale_layers.\1.projector_layer.conv\2.conv."),
    (_PROJ + r"stages\.(\d+)\.0\.cv([12])\.bn\.", r"projector.scale_layers.\1.projector_layer.conv\2.norm."),
    (_PROJ + r"stages\.(\d+)\.0\.m\.(\d+)\.cv([12])\.conv\.",
     r"projector.scale_layers.\1.projector_layer.bottlenecks.\2.conv\3.conv."),
    (_PROJ + r"stages\.(\d+)\.0\.m\.(\d+)\.cv([12])\.bn\.",
     r"projector.scale_layers.\1.projector_layer.bottlenecks.\2.conv\3.norm."),
    (_PROJ + r"stages\.(\d+)\.1\.", r"projector.scale_layers.\1.layer_norm."),
    (_PROJ + r"stages_sampling\.(\d+)\.(\d+)\.(\d+)\.bn\.", r"projector.scale_layers.\1.sampling_layers.\2.layers.\3.norm."),
    (_PROJ + r"stages_sampling\.(\d+)\.(\d+)\.(\d+)\.", r"projector.scale_layers.\1.sampling_layers.\2.layers.\3."),
    *layer_rules(_DEC + r"layers\.(\d+)\.", r"decoder.layers.\1.", rest=False),  # norms, cross_attn named alike
    (_DEC + r"norm\.", "decoder.norm."),
    (_DEC + r"ref_point_head\.", "decoder.ref_point_head."),
    (r"^transformer\.(enc_output|enc_output_norm|enc_out_class_embed|enc_out_bbox_embed)\.", r"queries.\1."),
    (r"^refpoint_embed\.", "queries.reference_point_embed."),
    (r"^query_feat\.", "queries.query_feat."),
    (r"^(class_embed|bbox_embed)\.", r"\1."),
]
#: DINOv2's mask token: masked-image pretraining only, no part of a detector's forward
DROPPED = "backbone.0.encoder.encoder.embeddings.mask_token"
#: the ViT's separate projections (RF-DETR's DINOv2, LW-DETR's CAE biases), fused into vispe's ``Attention.qkv``
FUSE = r"^(.*\.attn)\.(q|k|v)_proj\.(weight|bias)$"


def unwrap(source: dict[str, Any]) -> dict[str, torch.Tensor]:
    """The state_dict of ``{"model": sd, ...}`` (the original training script's checkpoint) or ``sd``."""
    return source["model"] if isinstance(source.get("model"), dict) else source


def is_original(source: dict[str, Any]) -> bool:
    """Whether ``source`` (a checkpoint or a state_dict) is in LW-DETR's / RF-DETR's original layout."""
    return any(k.startswith(("backbone.0.encoder.", "transformer.decoder.")) for k in unwrap(source))


def rename_original(source: dict[str, Any]) -> dict[str, torch.Tensor]:
    """The original layout's keys as vispe's (module docstring); unknown keys refused by name."""
    state = unwrap(source)
    shared = sorted(k for k in state if k.startswith("transformer.decoder.bbox_embed."))
    if shared:
        raise ValueError(f"source has {shared[:2]}: a box head shared into the decoder (lite_refpoint_refine=False), "
                         "a per-layer refinement that neither transformers' LW-DETR / RF-DETR nor vispe implements")
    kept = {k: v for k, v in state.items() if k != DROPPED}
    out, _ = rename_keys(kept, RULES, fuse=re.compile(FUSE), zero_bias="k", unknown=True,
                         name="source (an original LW-DETR / RF-DETR checkpoint)")
    return out
