"""transformers' DEIMv2 (``Deimv2ForObjectDetection``) as vispe's ``DEIMv2``: ``load_detr(model)`` or
``load_detr(state_dict, config=Deimv2Config(...))`` reach ``build`` and ``rename`` here (through
``vispe.models.detr.realtime.load``).

The config is read as D-FINE's (``load.dfine_kwargs``: the same fields, the same refusals) plus
``use_gateway``, ``share_bbox_head``, ``encoder_has_trailing_conv``, ``spatial_tuning_adapter_inplanes``.
``encoder_type="lite"`` (the Atto / Femto / Pico models) builds ``deimv2_lite.LiteEncoder`` (HGNetV2 only; with a
DINOv3 backbone it is refused by name). Refused by name: ``encoder_fuse_op`` other than "sum" with the hybrid
encoder (transformers' blocks take ``encoder_hidden_dim`` channels, so "cat" cannot run there either). Backbones: transformers' own (HGNetV2) wrapped as for D-FINE, or, when
``backbone_config`` is a ``dinov3_vit`` one, vispe's DINOv3 (``vispe.models.dinov3.convert_hf_dinov3``)
with the spatial tuning adapter (``deimv2_backbone``): ``apply_layernorm`` read (False: only the last block's
output normed, as transformers), ``key_bias=True`` taken when the key biases are zero (DINOv3's are; nonzero
ones refused by name), a stage-0 (patch embedding) output refused.
"""
from __future__ import annotations

import copy
from typing import Any

import torch

from vispe.models.detr.load.keys import rename_keys
from vispe.models.detr.realtime.deimv2 import AIFI_ARGS, DEIMv2
from vispe.models.detr.realtime.deimv2_backbone import DINOv3Backbone
from vispe.models.detr.realtime.hgnetv2 import TransformersBackbone

RULES = [
    (r"^model\.conv_encoder\.model\.", "backbone.model."),
    (r"^model\.conv_encoder\.(?:encoder_input_proj|fusion_proj)\.(\d+)\.conv\.", r"encoder.input_proj.\1.0."),
    (r"^model\.conv_encoder\.(?:encoder_input_proj|fusion_proj)\.(\d+)\.norm\.", r"encoder.input_proj.\1.1."),
    (r"^model\.conv_encoder\.spatial_tuning_adapter\.", "backbone.sta."),
    (r"^model\.decoder_input_proj\.(\d+)\.conv\.", r"decoder_input_proj.\1.0."),
    (r"^model\.decoder_input_proj\.(\d+)\.norm\.", r"decoder_input_proj.\1.1."),
    (r"^(model\.encoder\.aifi\.\d+\.layers\.\d+\.mlp)\.layers\.0\.", r"\1.fc1."),
    (r"^(model\.encoder\.aifi\.\d+\.layers\.\d+\.mlp)\.layers\.1\.", r"\1.fc2."),
    (r"^model\.encoder\.aifi\.", "encoder.aifi."),
    (r"^model\.encoder\.(lateral_convs|fpn_blocks|downsample_convs|pan_blocks)\.", r"encoder.ccfm.\1."),
    (r"^model\.encoder\.(input_proj|down_conv[12]|bi_fusion_conv|fpn_block|pan_block)\.", r"encoder.\1."),  # lite
    (r"^model\.(enc_output|enc_score_head|enc_bbox_head|weight_embedding)\.", r"selection.\1."),
    (r"^model\.denoising_class_embed\.", "denoising_class_embed."),
    (r"^model\.decoder\.", "decoder."),
    (r"\.self_attn\.o_proj\.", ".self_attn.proj."),
    (r"^(encoder\.aifi\.\d+\.layers\.\d+)\.self_attn_layer_norm\.", r"\1.norm1."),
    (r"^(encoder\.aifi\.\d+\.layers\.\d+)\.final_layer_norm\.", r"\1.norm2."),
]
DINOV3 = "model.conv_encoder.backbone."


def is_dinov3(config: Any) -> bool:
    return getattr(config.backbone_config, "model_type", None) == "dinov3_vit"


def deimv2_options(c: Any) -> dict[str, Any]:
    """``DEIMv2``'s ``deimv2`` options from a ``Deimv2Config`` (module docstring for the refusals)."""
    if c.encoder_type not in ("hybrid", "lite"):
        raise ValueError(f"config.encoder_type={c.encoder_type!r}: expected 'hybrid' (AIFI + fusion) or 'lite'")
    if c.encoder_type == "lite" and is_dinov3(c):
        raise ValueError("config.encoder_type='lite' with a dinov3_vit backbone: DEIMv2's lite encoder takes two "
                         "HGNetV2 levels (its Atto / Femto / Pico models), the DINOv3 variants the 'hybrid' encoder")
    if c.encoder_type == "hybrid" and c.encoder_fuse_op != "sum":
        raise ValueError(f"config.encoder_fuse_op={c.encoder_fuse_op!r}: expected 'sum' (DEIMv2's blocks take "
                         f"encoder_hidden_dim={c.encoder_hidden_dim} channels)")
    return {"use_gateway": bool(c.use_gateway), "share_bbox_head": bool(c.share_bbox_head),
            "trailing_conv": bool(c.encoder_has_trailing_conv), "encoder": c.encoder_type}


def dinov3_backbone(c: Any) -> DINOv3Backbone:
    """vispe's DINOv3 + STA for a ``Deimv2Config`` with a ``dinov3_vit`` backbone (random weights)."""
    from transformers import DINOv3ViTModel

    from vispe.models.dinov3 import convert_hf_dinov3

    b = c.backbone_config
    stages = [int(i) for i in b.out_indices]
    if min(stages) < 1:
        raise ValueError(f"config.backbone_config.out_indices={stages}: expected block outputs (>= 1), not the "
                         "patch embedding (stage 0)")
    if b.key_bias:  # DINOv3's key bias is zero (masked in the original): checked on the weights (``rename``)
        b = copy.deepcopy(b)
        b.key_bias = False
    vit = convert_hf_dinov3(DINOv3ViTModel(b))
    return DINOv3Backbone(vit, [s - 1 for s in stages], inplanes=c.spatial_tuning_adapter_inplanes,
                          eps=c.batch_norm_eps, norm_all=bool(b.apply_layernorm))


def build(config: Any, kwargs: dict[str, Any]) -> DEIMv2:
    """An untrained ``DEIMv2`` for ``config`` (``kwargs``: ``RTDETR``'s arguments from ``load.dfine_kwargs``)."""
    opts = deimv2_options(config)
    if opts["encoder"] == "lite":  # no AIFI: its arguments (read from the config all the same) are not passed
        kwargs = {k: v for k, v in kwargs.items() if k not in AIFI_ARGS}
    backbone = dinov3_backbone(config) if is_dinov3(config) else \
        TransformersBackbone(config, frozen_bn=bool(config.freeze_backbone_batch_norms))
    return DEIMv2(backbone, deimv2=opts, **kwargs)


def rename(state: dict[str, Any], config: Any, own: dict[str, torch.Tensor]) -> dict[str, Any]:
    """transformers' DEIMv2 keys -> vispe's; ``own`` (vispe's state_dict) gives the zero biases a DINOv3 without
    ``proj_bias`` / ``mlp_bias`` lacks (vispe's converted ViT has them, zero, as ``convert_hf_dinov3``)."""
    from vispe.models.dinov3 import hf_state_dict

    vit = {k[len(DINOV3):]: v for k, v in state.items() if k.startswith(DINOV3)}
    for key in [k for k in vit if k.endswith(".attention.k_proj.bias")]:  # config.backbone_config.key_bias=True
        if bool(vit.pop(key).any()):
            raise ValueError(f"{DINOV3}{key}: a nonzero key bias; vispe's DINOv3 (timm's Eva) has none, as DINOv3 "
                             "(the original masks it to zero)")
    rest = {k: v for k, v in state.items() if not k.startswith(DINOV3)}
    renamed, _ = rename_keys(rest, RULES)
    if vit:
        renamed.update({"backbone.vit." + k: v for k, v in
                        hf_state_dict(vit, gated=bool(config.backbone_config.use_gated_mlp)).items()})
        for k, v in own.items():
            if k.startswith("backbone.vit.") and k.endswith("bias") and k not in renamed and not bool(v.any()):
                renamed[k] = torch.zeros_like(v)
    return renamed
