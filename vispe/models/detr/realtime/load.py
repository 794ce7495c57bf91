"""Load transformers' RT-DETR, RT-DETRv2, D-FINE and DEIMv2 into ``vispe.models.detr.realtime.RTDETR`` (DEIMv2: its
subclass ``DEIMv2``, ``load_deimv2``): ``load_rtdetr(source, config=None)``; the original repositories' layouts
of RT-DETR (``load_original``), D-FINE / DEIM and DEIMv2 (``load_original_dfine``) with ``config=``.

``source``: a ``transformers.RTDetrForObjectDetection`` / ``RTDetrV2ForObjectDetection`` (its config gives
the architecture), or its ``state_dict()`` with ``config=``, or a checkpoint of lyuwenyu/RT-DETR
(``vispe.models.detr.realtime.load_original``; a file path through ``load_detr``) with ``config=`` its ``RTDetrConfig`` / ``RTDetrV2Config``
(RT-DETRv2 also reads ``decoder_offset_scale`` and ``decoder_method``; ``decoder_n_levels`` must equal
``num_feature_levels``). The backbone (``RTDetrResNetBackbone``,
bottleneck layers) becomes timm's ResNet-vd (``vispe.models.detr.realtime.backbone``): the same
function, keys renamed. Every vispe key must be filled and every source key used, equal shapes.

Config fields read: the backbone's ``embedding_size``, ``hidden_sizes``, ``depths``, ``out_indices``;
``num_labels``, ``num_queries``, ``d_model``, ``encoder_hidden_dim``, ``encode_proj_layers``,
``encoder_*`` (AIFI), ``activation_function`` (CCFM), ``hidden_expansion``, ``num_feature_levels``,
``decoder_*``, ``dropout``, ``num_denoising``, ``label_noise_ratio``, ``box_noise_scale``,
``learn_initial_query``, ``positional_encoding_temperature``, ``layer_norm_eps``, ``batch_norm_eps``,
``freeze_backbone_batch_norms``. Refused by name (vispe does not build them): ``normalize_before=True``,
``encoder_layers=0``, ``with_box_refine=False``, ``use_focal_loss=False``, ``activation_dropout`` or
``attention_dropout`` other than ``dropout``, ``decoder_in_channels`` other than the encoder's width,
basic-block or ``downsample_in_bottleneck`` / ``downsample_in_first_stage`` backbones.

Sizes: ``eval_size`` and ``anchor_image_size`` are read and not used: vispe computes AIFI's
position and the anchors at the input's size always. transformers in eval mode with ``eval_size``
set gives AIFI no position at all, and with ``anchor_image_size`` uses anchors of that size.
"""
from __future__ import annotations

from typing import Any

import torch

from vispe.models.detr.load.keys import rename_keys
from vispe.models.detr.realtime import load_deimv2 as D, load_original as O, load_original_dfine as F
from vispe.models.detr.realtime.backbone import ResNetVd
from vispe.models.detr.realtime.hgnetv2 import TransformersBackbone
from vispe.models.detr.realtime.model import RTDETR

MODEL_TYPES = ("rt_detr", "rt_detr_v2", "d_fine", "deimv2")

_BACKBONE = [
    (r"^model\.backbone\.model\.embedder\.embedder\.0\.convolution\.", "backbone.body.conv1.0."),
    (r"^model\.backbone\.model\.embedder\.embedder\.0\.normalization\.", "backbone.body.conv1.1."),
    (r"^model\.backbone\.model\.embedder\.embedder\.1\.convolution\.", "backbone.body.conv1.3."),
    (r"^model\.backbone\.model\.embedder\.embedder\.1\.normalization\.", "backbone.body.conv1.4."),
    (r"^model\.backbone\.model\.embedder\.embedder\.2\.convolution\.", "backbone.body.conv1.6."),
    (r"^model\.backbone\.model\.embedder\.embedder\.2\.normalization\.", "backbone.body.bn1."),
    (r"^model\.backbone\.model\.encoder\.stages\.(\d+)\.layers\.(\d+)\.",
     lambda m: f"backbone.body.layer{int(m.group(1)) + 1}.{m.group(2)}."),
    (r"(backbone\.body\.layer\d\.\d+\.)layer\.(\d)\.convolution\.", lambda m: f"{m.group(1)}conv{int(m.group(2)) + 1}."),
    (r"(backbone\.body\.layer\d\.\d+\.)layer\.(\d)\.normalization\.", lambda m: f"{m.group(1)}bn{int(m.group(2)) + 1}."),
    (r"(backbone\.body\.layer\d\.\d+\.)shortcut\.(?:1\.)?convolution\.", r"\1downsample.1."),
    (r"(backbone\.body\.layer\d\.\d+\.)shortcut\.(?:1\.)?normalization\.", r"\1downsample.2."),
]
_REST = [
    (r"^model\.encoder_input_proj\.", "encoder.input_proj."),
    (r"^model\.encoder\.aifi\.", "encoder.aifi."),
    (r"^model\.encoder\.(lateral_convs|fpn_blocks|downsample_convs|pan_blocks)\.", r"encoder.ccfm.\1."),
    (r"^model\.(enc_output|enc_score_head|enc_bbox_head|weight_embedding)\.", r"selection.\1."),
    (r"^model\.(denoising_class_embed|decoder_input_proj)\.", r"\1."),
    (r"^model\.decoder\.", "decoder."),
    (r"\.self_attn\.o_proj\.", ".self_attn.proj."),
    (r"^(encoder\.aifi\.\d+\.layers\.\d+)\.self_attn_layer_norm\.", r"\1.norm1."),
    (r"^(encoder\.aifi\.\d+\.layers\.\d+)\.final_layer_norm\.", r"\1.norm2."),
    (r"^(decoder\.layers\.\d+)\.self_attn_layer_norm\.", r"\1.norm1."),
    (r"^(decoder\.layers\.\d+)\.encoder_attn\.", r"\1.cross_attn."),
    (r"^(decoder\.layers\.\d+)\.encoder_attn_layer_norm\.", r"\1.norm2."),
    (r"^(decoder\.layers\.\d+)\.final_layer_norm\.", r"\1.norm3."),
]


def is_realtime(source: object, config: Any = None) -> bool:
    """Whether ``source`` is a transformers RT-DETR model or a checkpoint in lyuwenyu's layout, or ``config`` an
    ``RTDetrConfig`` (or RT-DETRv2's, D-FINE's)."""
    if config is not None:
        return getattr(config, "model_type", None) in MODEL_TYPES
    if isinstance(source, dict) and (O.is_original(source) or F.is_original(source)):  # refused below, without config
        return True
    return isinstance(source, torch.nn.Module) and \
        getattr(getattr(source, "config", None), "model_type", None) in MODEL_TYPES


def rtdetr_kwargs(config: Any) -> dict[str, Any]:
    """``RTDETR``'s arguments (and the backbone's, under "backbone") from an ``RTDetrConfig`` (module docstring)."""
    c = config
    refusals = {
        "normalize_before": (c.normalize_before, False), "encoder_layers": (c.encoder_layers > 0, True),
        "with_box_refine": (c.with_box_refine, True), "use_focal_loss": (c.use_focal_loss, True),
        "activation_dropout": (c.activation_dropout, c.dropout), "attention_dropout": (c.attention_dropout, c.dropout),
    }
    for name, (value, expected) in refusals.items():
        if value != expected:
            raise ValueError(f"config.{name}={getattr(c, name)!r}: vispe's RT-DETR builds "
                             f"{name}={expected!r} only ({'encoder_layers > 0' if name == 'encoder_layers' else ''})")
    if any(ch != c.encoder_hidden_dim for ch in c.decoder_in_channels):
        raise ValueError(f"config.decoder_in_channels={list(c.decoder_in_channels)}: expected every level at "
                         f"encoder_hidden_dim={c.encoder_hidden_dim} (the hybrid encoder's outputs)")
    if c.model_type in ("d_fine", "deimv2"):
        return dfine_kwargs(c)
    b = c.backbone_config
    if getattr(b, "model_type", None) != "rt_detr_resnet" or b.layer_type != "bottleneck" or \
            b.downsample_in_bottleneck or b.downsample_in_first_stage or b.hidden_act != "relu":
        raise ValueError(f"config.backbone_config ({getattr(b, 'model_type', None)!r}, layer_type="
                         f"{getattr(b, 'layer_type', None)!r}): vispe maps transformers' RTDetrResNet with bottleneck "
                         "layers, relu, no downsample_in_bottleneck / downsample_in_first_stage onto timm's ResNet-vd")
    out_indices = tuple(int(i) for i in b.out_indices)
    backbone = dict(depths=tuple(b.depths), widths=tuple(h // 4 for h in b.hidden_sizes),
                    stem_width=b.embedding_size // 2, out_indices=out_indices,
                    frozen_bn=bool(c.freeze_backbone_batch_norms))
    v2 = None
    if c.model_type == "rt_detr_v2":
        if c.decoder_n_levels != c.num_feature_levels:
            raise ValueError(f"config.decoder_n_levels={c.decoder_n_levels}: vispe's RT-DETRv2 samples every decoder "
                             f"level, expected num_feature_levels={c.num_feature_levels}")
        v2 = {"offset_scale": float(c.decoder_offset_scale), "method": c.decoder_method}
    return dict(
        backbone=backbone, v2=v2, num_classes=c.num_labels, num_queries=c.num_queries, d_model=c.d_model,
        encoder_dim=c.encoder_hidden_dim, aifi_levels=tuple(c.encode_proj_layers),
        aifi_heads=c.encoder_attention_heads, aifi_ffn=c.encoder_ffn_dim, aifi_layers=c.encoder_layers,
        aifi_activation=c.encoder_activation_function, ccfm_activation=c.activation_function,
        expansion=c.hidden_expansion, num_levels=c.num_feature_levels, decoder_layers=c.decoder_layers,
        decoder_heads=c.decoder_attention_heads, decoder_ffn=c.decoder_ffn_dim, num_points=c.decoder_n_points,
        decoder_activation=c.decoder_activation_function, dropout=c.dropout, num_denoising=c.num_denoising,
        label_noise_ratio=c.label_noise_ratio, box_noise_scale=c.box_noise_scale,
        learn_initial_query=c.learn_initial_query, layer_norm_eps=c.layer_norm_eps, batch_norm_eps=c.batch_norm_eps,
        pe_kwargs={"layout": "transformers", "temperature": float(c.positional_encoding_temperature), "float64": True},
    )


def dfine_kwargs(c: Any) -> dict[str, Any]:
    """``RTDETR``'s arguments for a ``DFineConfig`` (its backbone: transformers' own, ``hgnetv2``)."""
    eval_idx = c.eval_idx if c.eval_idx >= 0 else c.decoder_layers + c.eval_idx
    if eval_idx != c.decoder_layers - 1 or c.layer_scale != 1:
        raise ValueError(f"config.eval_idx={c.eval_idx}, layer_scale={c.layer_scale}: vispe's D-FINE evaluates the last "
                         "decoder layer (eval_idx=-1) and builds no scaled extra layers (layer_scale=1)")
    if c.decoder_activation_function != "relu" or c.num_feature_levels != len(c.encoder_in_channels):
        raise ValueError(f"config.decoder_activation_function={c.decoder_activation_function!r}, num_feature_levels="
                         f"{c.num_feature_levels}: expected 'relu' and the backbone's {len(c.encoder_in_channels)} levels")
    dfine = dict(offset_scale=float(c.decoder_offset_scale), method=c.decoder_method, num_bins=c.max_num_bins,
                 reg_scale=float(c.reg_scale), up=float(c.up), lqe_top=c.top_prob_values, lqe_hidden=c.lqe_hidden_dim,
                 lqe_layers=c.lqe_layers)
    return dict(
        backbone=None, dfine=dfine, num_classes=c.num_labels, num_queries=c.num_queries, d_model=c.d_model,
        encoder_dim=c.encoder_hidden_dim, aifi_levels=tuple(c.encode_proj_layers), aifi_heads=c.encoder_attention_heads,
        aifi_ffn=c.encoder_ffn_dim, aifi_layers=c.encoder_layers, aifi_activation=c.encoder_activation_function,
        ccfm_activation=c.activation_function, expansion=c.hidden_expansion, csp_blocks=round(3 * c.depth_mult),
        num_levels=c.num_feature_levels, decoder_layers=c.decoder_layers, decoder_heads=c.decoder_attention_heads,
        decoder_ffn=c.decoder_ffn_dim, num_points=c.decoder_n_points, dropout=c.dropout, num_denoising=c.num_denoising,
        label_noise_ratio=c.label_noise_ratio, box_noise_scale=c.box_noise_scale, learn_initial_query=c.learn_initial_query,
        layer_norm_eps=c.layer_norm_eps, batch_norm_eps=c.batch_norm_eps,
        pe_kwargs={"layout": "transformers", "temperature": float(c.positional_encoding_temperature), "float64": True},
    )


_DFINE = [
    (r"^model\.backbone\.model\.", "backbone.model."),
    (r"^(model\.encoder\.aifi\.\d+\.layers\.\d+\.mlp)\.layers\.0\.", r"\1.fc1."),
    (r"^(model\.encoder\.aifi\.\d+\.layers\.\d+\.mlp)\.layers\.1\.", r"\1.fc2."),
]


def rename(state: dict[str, Any], model_type: str = "rt_detr") -> dict[str, Any]:
    """transformers' RT-DETR / RT-DETRv2 keys -> vispe's (q, k, v projections fused into ``qkv``). RT-DETRv2's
    top-level ``class_embed`` / ``bbox_embed`` (tied copies of the decoder's) are checked equal and dropped, its
    ``n_points_scale`` buffers checked against ``1 / P``."""
    state = drop_tied(state)
    if model_type == "d_fine":  # the decoder layers keep transformers' names; the rest as RT-DETR's
        renamed, _ = rename_keys(state, _DFINE + [r for r in _REST if "decoder\\.layers" not in r[0]])
        return renamed
    renamed, _ = rename_keys(state, _BACKBONE + _REST)
    return renamed


def drop_tied(state: dict[str, Any]) -> dict[str, Any]:
    """``state`` without the top-level head copies (checked equal to the decoder's) and the ``num_points_scale``
    buffers (checked against ``1 / P``)."""
    state = dict(state)
    for key in [k for k in state if k.startswith(("class_embed.", "bbox_embed."))]:
        twin = "model.decoder." + key
        if twin not in state or not torch.equal(state[twin], state[key]):
            raise ValueError(f"source has {key} without an equal {twin}: expected the decoder's heads and their tied copies")
        del state[key]
    for key in [k for k in state if k.endswith(("encoder_attn.n_points_scale", "encoder_attn.num_points_scale"))]:
        scale = state.pop(key)
        n = 1.0 / scale
        if not torch.allclose(n, n.round()) or not torch.allclose(n, n[:1].expand_as(n)):
            raise ValueError(f"{key}={scale.tolist()}: expected 1 / num_points, the same count at every level")
    return state


def load_rtdetr(source: torch.nn.Module | dict[str, Any], config: Any = None, **overrides: Any) -> RTDETR:
    """A vispe ``RTDETR`` with ``source``'s weights (module docstring); ``overrides`` go to ``RTDETR``."""
    if isinstance(source, torch.nn.Module):
        if config is not None and config is not source.config:
            raise ValueError("config=... with a transformers model: its own config builds the model")
        config, state = source.config, source.state_dict()
    elif isinstance(source, dict):
        if config is None:
            raise ValueError("source is a state_dict without its configuration: pass config=RTDetrConfig(...) / "
                             "DFineConfig(...) / Deimv2Config(...) (for the original repositories' checkpoints, the "
                             "config of its model, e.g. as transformers' conversion scripts build it)")
        state = source
    else:
        raise ValueError(f"source={type(source).__name__}: expected an RTDetrForObjectDetection or its state_dict")
    if getattr(config, "model_type", None) not in MODEL_TYPES:
        raise ValueError(f"config.model_type={getattr(config, 'model_type', None)!r}: expected one of {MODEL_TYPES}")
    kwargs = {**rtdetr_kwargs(config), **overrides}
    spec = kwargs.pop("backbone")
    if config.model_type == "deimv2":
        model: RTDETR = D.build(config, kwargs)
    else:
        backbone = TransformersBackbone(config, frozen_bn=bool(config.freeze_backbone_batch_norms)) \
            if spec is None else ResNetVd(**spec)
        model = RTDETR(backbone, **kwargs)
    if config.model_type in ("d_fine", "deimv2") and F.is_original(state):
        state = F.rename(state, config.model_type, model.state_dict())
    elif config.model_type == "deimv2":
        state = D.rename(drop_tied(state), config, model.state_dict())
    elif F.is_original(state):
        raise ValueError(f"source is in D-FINE's / DEIMv2's original layout: expected a DFineConfig or Deimv2Config, "
                         f"got {config.model_type!r}")
    elif O.is_original(state):
        if config.model_type != "rt_detr":
            raise ValueError(f"source is in lyuwenyu/RT-DETR's layout: expected an RTDetrConfig, got {config.model_type!r}")
        state = O.rename(state)
    else:
        state = rename(state, config.model_type)
    own = {k: v for k, v in model.state_dict().items() if not k.endswith("num_batches_tracked")}
    missing = sorted(set(own) - set(state))
    unused = sorted(set(state) - set(own))
    bad = sorted(k for k in set(own) & set(state) if own[k].shape != state[k].shape)
    if missing or unused or bad:
        raise ValueError(f"source does not fit vispe's RT-DETR: missing {missing[:5]}, unused {unused[:5]}, "
                         f"shapes differ at {bad[:5]}")
    model.load_state_dict(state, strict=False)  # every key checked above; num_batches_tracked keeps its 0
    return model
