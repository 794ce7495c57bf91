"""State-dict keys of Deformable DETR's checkpoints mapped onto vispe's multi-scale pieces.

``deformable_keys(state)`` renames the keys of the parts that do not depend on the query design --
backbone, input projections, level embedding, encoder layers, decoder layers -- and returns the
rest (heads, query embeddings, ``reference_points``, two-stage ``enc_output`` / ``pos_trans``)
untouched for the detector's loader. Two source layouts (``deformable_format``):

| piece | transformers ``DeformableDetrForObjectDetection`` | fundamentalvision/Deformable-DETR ``.pth`` |
|---|---|---|
| backbone | ``model.backbone.model.*`` (v4: ``.conv_encoder.model``) | ``backbone.0.body.*`` |
| input projections | ``model.input_proj.{l}.{0,1}.*`` | ``input_proj.{l}.{0,1}.*`` |
| level embedding | ``model.level_embed`` | ``transformer.level_embed`` |
| encoder layer i | ``model.encoder.layers.{i}.``: ``self_attn.*``, ``self_attn_layer_norm``, ``mlp.fc1/2`` (v4: ``fc1/2``), ``final_layer_norm`` | ``transformer.encoder.layers.{i}.``: ``self_attn.*``, ``norm1``, ``linear1/2``, ``norm2`` |
| decoder layer i | ``model.decoder.layers.{i}.``: ``self_attn.{q,k,v,o}_proj`` (v4 ``out_proj``), ``self_attn_layer_norm``, ``encoder_attn.*``, ``encoder_attn_layer_norm``, ``mlp.fc1/2``, ``final_layer_norm`` | ``transformer.decoder.layers.{i}.``: ``self_attn.in_proj_*``, ``out_proj``, ``norm2`` (after self-attention!), ``cross_attn.*``, ``norm1``, ``linear1/2``, ``norm3`` |

vispe's names (``targets``, prefixes the detector chooses): the backbone's ``body.*`` (torchvision's
ResNet, ``MultiScaleResNet``), ``InputProjection``'s ``{l}.0`` / ``{l}.1``, ``LevelPositions``'
``level_embed``, ``DeformableEncoderLayer``'s ``self_attn.*`` (``MSDeformAttn``: the papers' names),
``norm1``, ``mlp.fc1/2``, ``norm2``, and ``DeformableDecoderLayer``'s ``self_attn.qkv`` (q, k, v
rows fused, as ``nn.MultiheadAttention``'s ``in_proj``) / ``self_attn.proj``, ``norm1`` (after
self-attention), ``cross_attn.*``, ``norm2`` (after cross-attention), ``mlp.fc1/2``, ``norm3``.
"""
from __future__ import annotations

import re

from vispe.models.detr.load.keys import rename_keys

TARGETS = dict(backbone="backbone.body.", input_proj="input_proj.", level_embed="level_pos.level_embed",
               encoder="encoder.layers.", decoder="decoder.layers.")
FORMATS = ("transformers", "transformers_model", "official")


def deformable_format(state: dict) -> str | None:
    """"transformers" (``DeformableDetrForObjectDetection``), "transformers_model" (``DeformableDetrModel``,
    the same keys without "model."), "official" or None (no Deformable DETR encoder keys)."""
    keys = list(state)
    if any(k.startswith("model.encoder.layers.") and ".sampling_offsets." in k for k in keys):
        return "transformers"
    if any(k.startswith("encoder.layers.") and ".sampling_offsets." in k for k in keys) and "level_embed" in state:
        return "transformers_model"
    if any(k.startswith("transformer.encoder.layers.") and ".sampling_offsets." in k for k in keys):
        return "official"
    return None


def _rules(fmt: str, t: dict) -> list[tuple[str, str]]:
    enc, dec = re.escape(t["encoder"]), re.escape(t["decoder"])
    if fmt == "transformers":
        return [(r"^model\.backbone\.(?:conv_encoder\.)?model\.", t["backbone"]),
                (r"^model\.input_proj\.", t["input_proj"]),
                (r"^model\.level_embed$", t["level_embed"]),
                (r"^model\.encoder\.layers\.(\d+)\.", t["encoder"] + r"\1."),
                (r"^model\.decoder\.layers\.(\d+)\.", t["decoder"] + r"\1."),
                (rf"^({enc}\d+\.)self_attn_layer_norm\.", r"\1norm1."),
                (rf"^({enc}\d+\.)final_layer_norm\.", r"\1norm2."),
                (rf"^({dec}\d+\.)self_attn_layer_norm\.", r"\1norm1."),
                (rf"^({dec}\d+\.)encoder_attn_layer_norm\.", r"\1norm2."),
                (rf"^({dec}\d+\.)final_layer_norm\.", r"\1norm3."),
                (rf"^({dec}\d+\.)encoder_attn\.", r"\1cross_attn."),
                (rf"^({dec}\d+\.)self_attn\.(?:o_proj|out_proj)\.", r"\1self_attn.proj."),
                (rf"^((?:{enc}|{dec})\d+\.)(?:mlp\.)?(fc1|fc2)\.", r"\1mlp.\2.")]
    return [(r"^backbone\.0\.body\.", t["backbone"]),
            (r"^input_proj\.", t["input_proj"]),
            (r"^transformer\.level_embed$", t["level_embed"]),
            (r"^transformer\.encoder\.layers\.(\d+)\.", t["encoder"] + r"\1."),
            (r"^transformer\.decoder\.layers\.(\d+)\.norm1\.", t["decoder"] + r"\1.@norm2."),  # after cross-attention
            (r"^transformer\.decoder\.layers\.(\d+)\.norm2\.", t["decoder"] + r"\1.@norm1."),  # after self-attention
            (r"^transformer\.decoder\.layers\.(\d+)\.", t["decoder"] + r"\1."),
            (r"\.@norm", ".norm"),
            (rf"^({dec}\d+\.)self_attn\.in_proj_(weight|bias)$", r"\1self_attn.qkv.\2"),
            (rf"^({dec}\d+\.)self_attn\.out_proj\.", r"\1self_attn.proj."),
            (rf"^((?:{enc}|{dec})\d+\.)linear(1|2)\.", r"\1mlp.fc\2.")]


def deformable_keys(state: dict, fmt: str | None = None, **targets) -> tuple[dict, dict]:
    """``(renamed, rest)``: the backbone, input projection, level embedding, encoder- and decoder-layer
    tensors of ``state`` under vispe's names (module docstring; ``targets`` overrides ``TARGETS``'
    prefixes), and every other entry unchanged. ``fmt``: one of ``FORMATS`` or None (read from the
    keys). ``num_batches_tracked`` entries are dropped (frozen batch norm has none)."""
    unknown = sorted(set(targets) - set(TARGETS))
    if unknown:
        raise ValueError(f"targets {unknown}: expected some of {sorted(TARGETS)}")
    fmt = fmt if fmt is not None else deformable_format(state)
    if fmt not in FORMATS:
        raise ValueError(f"state has keys like {list(state)[:3]}: expected a Deformable DETR state_dict from "
                         f"transformers (model.encoder.layers.N.self_attn.sampling_offsets...) or fundamentalvision "
                         f"(transformer.encoder.layers.N.self_attn.sampling_offsets...); fmt={fmt!r}")
    if fmt == "transformers_model":  # DeformableDetrModel's keys: ForObjectDetection's without "model."
        renamed, rest = deformable_keys({"model." + k: v for k, v in state.items()}, "transformers", **targets)
        return renamed, {k.removeprefix("model."): v for k, v in rest.items()}
    t = {**TARGETS, **targets}
    starts = tuple(t.values())
    fuse = re.compile(rf"^({re.escape(t['decoder'])}\d+\.self_attn)\.(q|k|v)_proj\.(weight|bias)$")
    return rename_keys(state, _rules(fmt, t), fuse=fuse, keep=lambda key, new: new != key or key.startswith(starts),
                       name="state")
