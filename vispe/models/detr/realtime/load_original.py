"""lyuwenyu/RT-DETR's checkpoint layout (``rtdetr_pytorch``: PResNet, ``HybridEncoder``, ``RTDETRTransformer``)
as vispe's keys, for ``load_rtdetr`` / ``load_detr(path, config=RTDetrConfig(...))``.

A checkpoint is ``{"ema": {"module": state_dict}}``, ``{"model": state_dict}`` or the state_dict; its
architecture is not stored with it (the repository's YAML), so ``config`` (an ``RTDetrConfig`` describing
it, as transformers' ``convert_rt_detr_original_pytorch_checkpoint_to_hf.py`` builds one per model name) is
required. The names (those of transformers' conversion script, left column):

* ``backbone.conv1.conv1_{1,2,3}.{conv,norm}`` -> the deep stem; ``backbone.res_layers.{s}.blocks.{b}.branch2{a,b,c}``
  -> ``layer{s+1}.{b}.conv{1,2,3}`` / ``bn{1,2,3}``; ``short.conv`` / ``short.norm`` (stage 0) and
  ``short.conv.conv`` / ``short.conv.norm`` (after the average pool) -> ``downsample.1`` / ``downsample.2``;
* ``encoder.input_proj``, ``encoder.encoder.{i}.layers.{k}`` (``nn.MultiheadAttention``'s ``in_proj`` rows
  q, k, v = vispe's fused ``qkv``; ``linear1`` / ``linear2``), the CCFM blocks under their own names;
* ``decoder.input_proj.{i}.{conv,norm}``, ``decoder.decoder.layers.{i}`` (``cross_attn``, ``norm1..3``,
  ``linear1`` / ``linear2``), ``decoder.dec_score_head`` / ``dec_bbox_head`` (the per-layer heads),
  ``decoder.{denoising_class_embed, query_pos_head, enc_output, enc_score_head, enc_bbox_head}``.
"""
from __future__ import annotations

from typing import Any

from vispe.models.detr.load.keys import layer_rules, rename_keys

RULES = [
    (r"^backbone\.conv1\.conv1_1\.conv\.", "backbone.body.conv1.0."),
    (r"^backbone\.conv1\.conv1_1\.norm\.", "backbone.body.conv1.1."),
    (r"^backbone\.conv1\.conv1_2\.conv\.", "backbone.body.conv1.3."),
    (r"^backbone\.conv1\.conv1_2\.norm\.", "backbone.body.conv1.4."),
    (r"^backbone\.conv1\.conv1_3\.conv\.", "backbone.body.conv1.6."),
    (r"^backbone\.conv1\.conv1_3\.norm\.", "backbone.body.bn1."),
    (r"^backbone\.res_layers\.(\d+)\.blocks\.(\d+)\.", lambda m: f"backbone.body.layer{int(m.group(1)) + 1}.{m.group(2)}."),
    (r"(backbone\.body\.layer\d\.\d+\.)branch2([abc])\.conv\.", lambda m: f"{m.group(1)}conv{'abc'.index(m.group(2)) + 1}."),
    (r"(backbone\.body\.layer\d\.\d+\.)branch2([abc])\.norm\.", lambda m: f"{m.group(1)}bn{'abc'.index(m.group(2)) + 1}."),
    (r"(backbone\.body\.layer\d\.\d+\.)short\.conv\.conv\.", r"\1downsample.1."),
    (r"(backbone\.body\.layer\d\.\d+\.)short\.conv\.norm\.", r"\1downsample.2."),
    (r"(backbone\.body\.layer\d\.\d+\.)short\.conv\.", r"\1downsample.1."),
    (r"(backbone\.body\.layer\d\.\d+\.)short\.norm\.", r"\1downsample.2."),
    *layer_rules(r"^encoder\.encoder\.(\d+)\.layers\.(\d+)\.", r"encoder.aifi.\1.layers.\2."),
    (r"^encoder\.(lateral_convs|fpn_blocks|downsample_convs|pan_blocks)\.", r"encoder.ccfm.\1."),
    (r"^decoder\.input_proj\.(\d+)\.conv\.", r"decoder_input_proj.\1.0."),
    (r"^decoder\.input_proj\.(\d+)\.norm\.", r"decoder_input_proj.\1.1."),
    *layer_rules(r"^decoder\.decoder\.layers\.(\d+)\.", r"decoder.layers.\1."),
    (r"^decoder\.dec_score_head\.", "decoder.class_embed."),
    (r"^decoder\.dec_bbox_head\.", "decoder.bbox_embed."),
    (r"^decoder\.(enc_output|enc_score_head|enc_bbox_head)\.", r"selection.\1."),
    (r"^decoder\.denoising_class_embed\.", "denoising_class_embed."),
]


def is_original(state: dict[str, Any]) -> bool:
    """Whether ``state`` (a checkpoint dict or a state_dict) is in lyuwenyu's layout."""
    state = unwrap(state)
    return any(k.startswith(("backbone.res_layers.", "decoder.dec_score_head.")) for k in state)


def unwrap(source: dict[str, Any]) -> dict[str, Any]:
    """The state_dict of ``{"ema": {"module": sd}}``, ``{"model": sd}`` or ``sd``."""
    if isinstance(source.get("ema"), dict) and isinstance(source["ema"].get("module"), dict):
        return source["ema"]["module"]
    if isinstance(source.get("model"), dict):
        return source["model"]
    return source


def rename(source: dict[str, Any]) -> dict[str, Any]:
    """lyuwenyu's keys -> vispe's (module docstring)."""
    renamed, _ = rename_keys(unwrap(source), RULES, fuse=None)
    return renamed
