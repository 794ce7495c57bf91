"""Load transformers' ``LwDetrForObjectDetection`` / ``RfDetrForObjectDetection`` (the model, or its
state_dict with its config) into vispe's ``ViTDETR``.

The architecture comes from the config (``build.from_hf_config``); the weights by a key map on their
names. Where the layouts differ: the ViT's separate q / k / v projections become one fused ``qkv``
(LW-DETR's k projection has no bias: a zero bias, which changes no attention weight), the decoder
self-attention's likewise, DINOv2's ``mask_token`` (masked-image pretraining only) is dropped, and
the position table where ``table_grid=None`` asks for none (``encoding="rope_mixed"`` in its place). Every
other tensor must be used and every vispe tensor filled: a ValueError lists the rest.
"""
from __future__ import annotations

import re
from typing import Any

import torch

from vispe.models.detr.load.keys import rename_keys
from vispe.models.detr.vitdet.build import create_vit_detr, from_hf_config
from vispe.models.detr.vitdet.load_original import is_original, rename_original
from vispe.models.detr.vitdet.model import ViTDETR

CLASSES = ("LwDetrForObjectDetection", "RfDetrForObjectDetection")

_RULES = [  # (transformers pattern, vispe name), on the one engine (load.keys.rename_keys); every key matches one
    (r"^model\.backbone\.backbone\.embeddings\.position_embeddings$", "backbone.pos_embed"),
    (r"^model\.backbone\.backbone\.embeddings\.cls_token$", "backbone.cls_token"),
    (r"^model\.backbone\.backbone\.embeddings\.(?:patch_embeddings\.)?projection\.(\w+)$", r"backbone.patch_embed.\1"),
    (r"^model\.backbone\.backbone\.encoder\.layer\.(\d+)\.(?:gamma_1|layer_scale1\.lambda1)$", r"backbone.blocks.\1.ls1"),
    (r"^model\.backbone\.backbone\.encoder\.layer\.(\d+)\.(?:gamma_2|layer_scale2\.lambda1)$", r"backbone.blocks.\1.ls2"),
    (r"^model\.backbone\.backbone\.encoder\.layer\.(\d+)\.(?:layernorm_before|norm1)\.(\w+)$", r"backbone.blocks.\1.norm1.\2"),
    (r"^model\.backbone\.backbone\.encoder\.layer\.(\d+)\.(?:layernorm_after|norm2)\.(\w+)$", r"backbone.blocks.\1.norm2.\2"),
    (r"^model\.backbone\.backbone\.encoder\.layer\.(\d+)\.attention\.o_proj\.(\w+)$", r"backbone.blocks.\1.attn.proj.\2"),
    (r"^model\.backbone\.backbone\.encoder\.layer\.(\d+)\.attention\.([qkv])_proj\.(\w+)$", r"backbone.blocks.\1.attn.\2_proj.\3"),
    (r"^model\.backbone\.backbone\.encoder\.layer\.(\d+)\.(?:intermediate|mlp)\.fc1\.(\w+)$", r"backbone.blocks.\1.mlp.0.\2"),
    (r"^model\.backbone\.backbone\.encoder\.layer\.(\d+)\.(?:intermediate|mlp)\.fc2\.(\w+)$", r"backbone.blocks.\1.mlp.2.\2"),
    (r"^model\.backbone\.backbone\.layernorm\.(\w+)$", r"backbone.norm.\1"),
    (r"^model\.backbone\.projector\.scale_layers\.(.*)$", r"projector.scale_layers.\1"),
    (r"^model\.backbone\.projector\.(.*)$", r"projector.scale_layers.0.\1"),  # RF-DETR's single scale
    (r"^model\.decoder\.layers\.(\d+)\.self_attn\.o_proj\.(\w+)$", r"decoder.layers.\1.self_attn.proj.\2"),
    (r"^model\.decoder\.layers\.(\d+)\.self_attn\.([qkv])_proj\.(\w+)$", r"decoder.layers.\1.self_attn.\2_proj.\3"),
    (r"^model\.decoder\.layers\.(\d+)\.self_attn_layer_norm\.(\w+)$", r"decoder.layers.\1.norm1.\2"),
    (r"^model\.decoder\.layers\.(\d+)\.cross_attn_layer_norm\.(\w+)$", r"decoder.layers.\1.norm2.\2"),
    (r"^model\.decoder\.layers\.(\d+)\.layer_norm\.(\w+)$", r"decoder.layers.\1.norm3.\2"),
    (r"^model\.decoder\.layers\.(\d+)\.(cross_attn|mlp)\.(.*)$", r"decoder.layers.\1.\2.\3"),
    (r"^model\.decoder\.layernorm\.(\w+)$", r"decoder.norm.\1"),
    (r"^model\.decoder\.ref_point_head\.(.*)$", r"decoder.ref_point_head.\1"),
    (r"^model\.(reference_point_embed|query_feat|enc_output|enc_output_norm|enc_out_class_embed|enc_out_bbox_embed)\.(.*)$",
     r"queries.\1.\2"),
    (r"^(class_embed|bbox_embed)\.(.*)$", r"\1.\2"),
]
_DROPPED = re.compile(r"model\.backbone\.backbone\.embeddings\.mask_token")  # masked-image pretraining only
#: the ViT's and the decoder's separate projections, fused into vispe's ``Attention.qkv``
FUSE = re.compile(r"^(.*\.(?:attn|self_attn))\.(q|k|v)_proj\.(weight|bias)$")


def rename(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """transformers' state_dict in vispe's names, q / k / v fused (module docstring); a tensor no rule
    knows is refused by name."""
    kept = {k: v for k, v in state.items() if not _DROPPED.fullmatch(k)}
    out, _ = rename_keys(kept, _RULES, fuse=FUSE, zero_bias="k", unknown=True,
                         name="source (a LW-DETR / RF-DETR state_dict)")
    return out


def is_vit_detr(source: Any, config: Any = None) -> bool:
    """True for transformers' LW-DETR / RF-DETR models, or a state_dict beside their config."""
    return type(source).__name__ in CLASSES or type(config).__name__ in ("LwDetrConfig", "RfDetrConfig")


def load_vit_detr(source: Any, config: Any = None, **overrides: Any) -> ViTDETR:
    """vispe's ``ViTDETR`` with ``source``'s weights: a transformers ``LwDetrForObjectDetection`` /
    ``RfDetrForObjectDetection``, or its state_dict with ``config``, or a checkpoint of the original
    repositories (Atten4Vis/LW-DETR, roboflow/rf-detr: ``load_original``) with ``config``; ``overrides`` go to
    ``create_vit_detr`` (e.g. ``mask_aware=True``, or an ``encoding`` beside the table)."""
    if is_vit_detr(source):
        if config is not None:
            raise ValueError("config=... beside a transformers model: its own config builds vispe's")
        config, state = source.config, source.state_dict()
    elif isinstance(source, dict):
        if config is None:
            raise ValueError("source is a state_dict: expected config=<LwDetrConfig | RfDetrConfig> beside it")
        state = source
    else:
        raise ValueError(f"source is a {type(source).__name__}: expected one of {CLASSES} or a state_dict")
    model = create_vit_detr(**{**from_hf_config(config), **overrides})
    state = rename_original(state) if is_original(state) else rename(state)
    if model.backbone.pos_embed is None:  # table_grid=None asked for: the table is replaced (an encoding, or none)
        state.pop("backbone.pos_embed", None)
    have = {k for k in model.state_dict() if not k.endswith("num_batches_tracked")
            and ".attn.pe." not in k}  # an encoding asked for is new: its parameters keep their initialisation
    missing, extra = sorted(have - state.keys()), sorted(state.keys() - have)
    if missing or extra:
        raise ValueError(f"source does not fit vispe's ViT detector: missing {missing[:8]}, unexpected {extra[:8]}")
    model.load_state_dict(state, strict=False)
    return model
