"""The original repositories' checkpoint layouts of D-FINE (Peterande/D-FINE; DEIM's D-FINE models,
ShihuaHuang95/DEIM, share it) and DEIMv2 (Intellindust-AI-Lab/DEIMv2) as vispe's keys, for
``load_detr(path_or_state, config=DFineConfig(...) | Deimv2Config(...))``.

A checkpoint is ``{"ema": {"module": sd}}``, ``{"model": sd}`` or the state_dict (``load_original.unwrap``);
the architecture is the repository's YAML, not in the file, so ``config`` (as transformers' conversion scripts
``convert_d_fine_original_pytorch_checkpoint_to_hf.py`` / ``convert_deimv2_..._to_hf.py`` build one per model)
is required. The originals' names (left) and vispe's:

* HGNetV2 ``backbone.stem.*`` / ``backbone.stages.*`` (``conv``, ``bn``, ``lab``) -> transformers' HGNetV2
  (``embedder``, ``encoder.stages``; ``convolution``, ``normalization``), which vispe wraps;
* DEIMv2's DINOv3 ``backbone.dinov3.[_model.]*`` (``storage_tokens``, fused ``attn.qkv``, ``ls1.gamma``, SwiGLU
  ``w1, w2, w3``) -> vispe's converted ViT (registers, q / k / v, ``gamma_1``, ``fc1_g, fc1_x, fc2``); the key
  bias must be zero or masked (``qkv.bias_mask``: DINOv3 has none); ``backbone.sta.*`` -> the STA,
  ``backbone.convs`` / ``backbone.norms`` -> the hybrid encoder's ``input_proj``;
* ``encoder.encoder.{i}.layers`` (``nn.MultiheadAttention``, ``linear1/2``) -> AIFI; fusion blocks ``cv1..cv4``
  (D-FINE's ``RepNCSPELAN4``: ``cv2 = [CSP, conv]``, ``cv3 = [CSP, conv]``; DEIMv2's ``RepNCSPELAN5``: the convs
  after each CSP are the CSP's trailing ``conv2``, ``cv4`` its output conv); ``downsample_convs.{i}.0.cv{1,2}``;
* ``decoder.decoder.layers.{i}`` (``cross_attn``, ``norm1..3`` - DEIMv2: RMSNorm ``scale`` -, ``linear1/2`` or
  DEIMv2's ``swish_ffn.w12`` (gate and up, fused) / ``w3``, ``gateway``), ``decoder.decoder.lqe_layers``,
  ``decoder.dec_score_head`` / ``dec_bbox_head``, ``decoder.{pre_bbox_head, query_pos_head, enc_output.{proj,
  norm}, enc_score_head, enc_bbox_head, denoising_class_embed, tgt_embed, up, reg_scale}``.

Dropped: ``decoder.anchors`` / ``valid_mask`` (vispe computes them at the input's size), the cross-attention's
``num_points_scale`` (1 / points, from the config), DINOv3's
``rope_embed.periods`` (computed from the config) and ``mask_token``, the decoder's second copy of ``up`` /
``reg_scale`` (checked equal). A key that no rule maps onto vispe's model is refused by its original name.
"""
from __future__ import annotations

from typing import Any

import torch

from vispe.models.detr.load.keys import layer_rules, rename_keys
from vispe.models.detr.realtime.load_original import unwrap

_FPN = r"^(encoder\.ccfm\.(?:fpn|pan)_blocks\.\d+)"
RULES = [
    # backbones
    (r"^backbone\.stem\.", "backbone.model.embedder."),
    (r"^backbone\.stages\.", "backbone.model.encoder.stages."),
    (r"^(backbone\.model\..*\.)conv\.weight$", r"\1convolution.weight"),
    (r"^(backbone\.model\..*\.)bn\.", r"\1normalization."),
    (r"^backbone\.dinov3\.(?:_model\.)?", "backbone.vit."),
    (r"^backbone\.vit\.storage_tokens$", "backbone.vit.reg_token"),
    (r"^(backbone\.vit\.blocks\.\d+)\.ls([12])\.gamma$", r"\1.gamma_\2"),
    (r"^(backbone\.vit\.blocks\.\d+\.mlp)\.w1\.", r"\1.fc1_g."),
    (r"^(backbone\.vit\.blocks\.\d+\.mlp)\.w2\.", r"\1.fc1_x."),
    (r"^(backbone\.vit\.blocks\.\d+\.mlp)\.w3\.", r"\1.fc2."),
    (r"^backbone\.sta\.stem\.0\.", "backbone.sta.stem_conv.conv."),
    (r"^backbone\.sta\.stem\.1\.", "backbone.sta.stem_conv.norm."),
    (r"^backbone\.sta\.conv2\.0\.", "backbone.sta.conv2.conv."),
    (r"^backbone\.sta\.conv2\.1\.", "backbone.sta.conv2.norm."),
    (r"^backbone\.sta\.(conv[34])\.1\.", r"backbone.sta.\1.conv."),
    (r"^backbone\.sta\.(conv[34])\.2\.", r"backbone.sta.\1.norm."),
    (r"^backbone\.convs\.(\d+)\.", r"encoder.input_proj.\1.0."),
    (r"^backbone\.norms\.(\d+)\.", r"encoder.input_proj.\1.1."),
    # hybrid encoder
    (r"^encoder\.input_proj\.(\d+)\.conv\.", r"encoder.input_proj.\1.0."),
    (r"^encoder\.input_proj\.(\d+)\.norm\.", r"encoder.input_proj.\1.1."),
    *layer_rules(r"^encoder\.encoder\.(\d+)\.layers\.(\d+)\.", r"encoder.aifi.\1.layers.\2."),
    (r"^encoder\.(lateral_convs|fpn_blocks|downsample_convs|pan_blocks)\.", r"encoder.ccfm.\1."),
    (r"^(encoder\.ccfm\.downsample_convs\.\d+)\.0\.cv([12])\.", r"\1.conv\2."),
    (_FPN + r"\.cv1\.", r"\1.conv1."),
    (_FPN + r"\.cv2\.0\.", r"\1.csp_rep1."),
    (_FPN + r"\.cv3\.0\.", r"\1.csp_rep2."),
    # decoder
    (r"^decoder\.input_proj\.(\d+)\.(?:conv|0)\.", r"decoder_input_proj.\1.0."),
    (r"^decoder\.input_proj\.(\d+)\.(?:norm|1)\.", r"decoder_input_proj.\1.1."),
    *layer_rules(r"^decoder\.decoder\.layers\.(\d+)\.", r"decoder.layers.\1.", mlp=("mlp.layers.0", "mlp.layers.1"),
                 norms=("self_attn_layer_norm", "encoder_attn_layer_norm", "final_layer_norm"), cross="encoder_attn"),
    (r"^decoder\.decoder\.lqe_layers\.", "decoder.lqe_layers."),
    (r"^decoder\.decoder\.(up|reg_scale)$", r"decoder.second_\1"),
    (r"^(decoder\.layers\.\d+\..*norm)\.scale$", r"\1.weight"),
    (r"^(decoder\.layers\.\d+)\.swish_ffn\.w3\.", r"\1.mlp.down_proj."),
    (r"^decoder\.dec_score_head\.", "decoder.class_embed."),
    (r"^decoder\.dec_bbox_head\.", "decoder.bbox_embed."),
    (r"^decoder\.(enc_score_head|enc_bbox_head)\.", r"selection.\1."),
    (r"^decoder\.enc_output\.(?:proj|0)\.", "selection.enc_output.0."),
    (r"^decoder\.enc_output\.(?:norm|1)\.", "selection.enc_output.1."),
    (r"^decoder\.denoising_class_embed\.", "denoising_class_embed."),
    (r"^decoder\.tgt_embed\.", "selection.weight_embedding."),  # learn_query_content (learn_initial_query)
]
#: the fusion blocks' remaining convolutions, by model type (module docstring)
BLOCKS = {
    "d_fine": [(_FPN + r"\.cv2\.1\.", r"\1.conv2."), (_FPN + r"\.cv3\.1\.", r"\1.conv3."), (_FPN + r"\.cv4\.", r"\1.conv4.")],
    "deimv2": [(_FPN + r"\.cv2\.1\.", r"\1.csp_rep1.conv2."), (_FPN + r"\.cv3\.1\.", r"\1.csp_rep2.conv2."),
               (_FPN + r"\.cv4\.", r"\1.conv2.")],
}
DROPPED = ("decoder.anchors", "decoder.valid_mask")
DROPPED_ENDINGS = ("rope_embed.periods", ".mask_token", "qkv.bias_mask", "cross_attn.num_points_scale")


def is_original(state: dict[str, Any]) -> bool:
    """Whether ``state`` is in D-FINE's or DEIMv2's original layout (HGNetV2 or DINOv3 keys, or D-FINE's heads)."""
    state = unwrap(state)
    return any(k.startswith(("backbone.stem.", "backbone.stages.", "backbone.dinov3.", "decoder.decoder.lqe_layers."))
               for k in state)


def rename(source: dict[str, Any], model_type: str, own: dict[str, torch.Tensor]) -> dict[str, Any]:
    """The original's keys -> vispe's (module docstring); ``own``: vispe's state_dict (to name unknown keys)."""
    if model_type not in BLOCKS:
        raise ValueError(f"config.model_type={model_type!r}: the D-FINE / DEIMv2 original layouts load with a "
                         f"config of {sorted(BLOCKS)}")
    state = unwrap(source)
    bias_masks = {k[: -len("bias_mask")]: v for k, v in state.items() if k.endswith("qkv.bias_mask")}
    kept = {k: v for k, v in state.items() if k not in DROPPED and not k.endswith(DROPPED_ENDINGS)}
    renamed, _ = rename_keys(kept, RULES + BLOCKS[model_type], fuse=None)
    origin = dict(zip(renamed, [k for k in kept if not k.endswith("num_batches_tracked")]))
    for name in ("up", "reg_scale"):
        second = renamed.pop(f"decoder.second_{name}", None)
        if second is not None and f"decoder.{name}" in renamed and not torch.equal(second, renamed[f"decoder.{name}"]):
            raise ValueError(f"source has decoder.{name} and decoder.decoder.{name} unequal: expected one shared value")
        if second is not None:
            renamed.setdefault(f"decoder.{name}", second)
    _split_fused(renamed, origin, bias_masks)
    _share_bbox_head(renamed, own)
    unknown = sorted(origin.get(k, k) for k in set(renamed) - set(own))
    if unknown:
        raise ValueError(f"source ({model_type} original layout) has keys vispe's model has no place for: {unknown[:8]}"
                         f"{' ...' if len(unknown) > 8 else ''}")
    return renamed


def _split_fused(state: dict[str, Any], origin: dict[str, str], bias_masks: dict[str, torch.Tensor]) -> None:
    """In place: DINOv3's fused ``attn.qkv`` -> q, k, v projections (the key bias zero or masked, refused otherwise);
    DEIMv2's fused SwiGLU ``w12`` -> ``gate_proj``, ``up_proj`` (gate first)."""
    for key in [k for k in state if k.startswith("backbone.vit.") and ".attn.qkv." in k]:
        q, k, v = state.pop(key).chunk(3, 0)
        base, kind = key.rsplit(".qkv.", 1)
        if kind == "bias":
            mask = bias_masks.get(origin.get(key, "")[: -len("bias")])
            if mask is not None:
                k = k * mask.chunk(3, 0)[1]
            if bool(k.any()):
                raise ValueError(f"{origin.get(key, key)}: a nonzero key bias; vispe's DINOv3 (timm's Eva) has none, "
                                 "as DINOv3 (its bias_mask zeroes it)")
            state[f"{base}.q_proj.bias"], state[f"{base}.v_proj.bias"] = q, v
        else:
            state[f"{base}.q_proj.weight"], state[f"{base}.k_proj.weight"], state[f"{base}.v_proj.weight"] = q, k, v
    for key in [k for k in state if ".swish_ffn.w12." in k]:
        gate, up = state.pop(key).chunk(2, 0)
        base, kind = key.split(".swish_ffn.w12.")
        state[f"{base}.mlp.gate_proj.{kind}"], state[f"{base}.mlp.up_proj.{kind}"] = gate, up


def _share_bbox_head(state: dict[str, Any], own: dict[str, torch.Tensor]) -> None:
    """A shared box head saved once (``bbox_embed.0``): copied to the layers vispe's model lists it under."""
    for key in [k for k in own if k.startswith("decoder.bbox_embed.") and k not in state]:
        first = "decoder.bbox_embed.0." + key.split(".", 3)[3]
        if first in state:
            state[key] = state[first]
