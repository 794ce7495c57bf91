"""DINOv3 (Simeoni et al., 2025, "DINOv3") in vispe: its RoPE as ``rope_axial`` options, and its
ViT from timm (``vit_*_dinov3``, an ``Eva``) or transformers (``DINOv3ViTModel``).

DINOv3's ``RopePositionEmbedding`` (facebookresearch/dinov3 ``dinov3/layers/rope_position_encoding.py``;
timm ``RotaryEmbeddingDinoV3``, transformers ``DINOv3ViTRopePositionEmbedding``), for patch i of n
along an axis and channel pair j < head_dim/4 of that axis (y first, then x; "half" pairing):

    c = (i + 0.5) / d * 2 - 1          d = n ("separate"), min(h, w) ("min") or max(h, w) ("max")
    angle_j = 2 pi * c / period_j      period_j = base^(4 j / head_dim)  (base 100)
                                       or min_period * (max_period / min_period)^(j / (head_dim/4 - 1))

with, in training only, one shift of c per axis in [-shift, shift], one log-uniform factor per axis
in [1/J, J] (``jitter_coords``) and one shared in [1/R, R] (``rescale_coords``). In vispe that is
``rope_axial`` with ``coords="centered"``, ``scale=2 pi`` and the options of
``vispe.image._rotary`` (``normalize_coords``, ``shift``, ``stretch`` = DINOv3's jitter,
``rescale``): ``dinov3_rope_kwargs`` writes them. It is options, not another encoding, because
every step is one of RotaryBase's coordinate steps (centred coordinates, a scale, a per-image
augmentation) and the frequencies are axial RoPE's (periods are their inverses).

* ``convert_vit(timm.create_model("vit_small_patch16_dinov3"))``: timm's Eva, converted in place by
  ``vispe.models.eva.convert_eva``; ``pe=None`` maps its ``RotaryEmbeddingDinoV3`` (``native_rope``).
* ``convert_vit(transformers.DINOv3ViTModel(...))``: a new ``VispeEva`` holding the same weights
  (``convert_hf_dinov3``): class token, register tokens, patch embedding, per layer norm1, q/k/v/o
  projections (key bias absent, as DINOv3), layer scales ``lambda1`` -> ``gamma_1`` / ``gamma_2``,
  plain or gated MLP, final norm. ``forward_features`` equals transformers' ``last_hidden_state``
  (class token, registers, patches); the model has no head (``num_classes=0``).
"""
from __future__ import annotations

import math
from functools import partial

import torch


def dinov3_rope_kwargs(*, base: float | None = 100.0, min_period: float | None = None,
                       max_period: float | None = None, normalize_coords: str = "separate",
                       shift_coords: float | None = None, jitter_coords: float | None = None,
                       rescale_coords: float | None = None, axis_order: str = "yx", layout: str = "half") -> dict:
    """``rope_axial`` settings equal to DINOv3's RoPE with these (DINOv3-named) arguments.

    ``base`` or ``min_period`` + ``max_period`` (then pass ``base=None``); augmentation arguments
    None = off, as DINOv3's. The released models: ``base=100``, ``rescale_coords=2``.
    """
    kw = dict(coords="centered", scale=2 * math.pi, normalize_coords=normalize_coords, axis_order=axis_order,
              layout=layout)
    if min_period is not None or max_period is not None:
        if base is not None:
            raise ValueError(f"base={base!r} with min_period / max_period: DINOv3 takes one of the two (base=None)")
        kw.update(min_period=min_period, max_period=max_period)
    else:
        kw.update(base=base)
    for key, value in (("shift", shift_coords), ("stretch", jitter_coords), ("rescale", rescale_coords)):
        if value is not None:
            kw[key] = value
    return kw


def native_rope(rope, layout: str) -> tuple[str, dict]:
    """``("rope_axial", settings)`` equal to timm's ``RotaryEmbeddingDinoV3`` ``rope``."""
    if rope.grid_offset:
        raise ValueError(f"the model's DINOv3 RoPE has grid_offset={rope.grid_offset}: rope_axial's centred "
                         "coordinates have none; name the encoding (pe=...) to replace it")
    period = rope.min_period is not None and rope.max_period is not None
    return "rope_axial", dinov3_rope_kwargs(
        base=None if period else rope.temperature, min_period=rope.min_period if period else None,
        max_period=rope.max_period if period else None, normalize_coords=rope.normalize_coords,
        shift_coords=rope.shift_coords, jitter_coords=rope.jitter_coords, rescale_coords=rope.rescale_coords,
        axis_order="xy" if rope.grid_indexing == "xy" else "yx", layout=layout)


def _hf_eva_args(cfg) -> dict:
    """timm ``Eva`` arguments of the same architecture as a transformers ``DINOv3ViTConfig``."""
    from timm.layers import LayerNorm

    want = "silu" if cfg.use_gated_mlp else "gelu"  # timm's Eva: SwiGLU gates with silu, its Mlp uses GELU
    if cfg.hidden_act != want:
        raise ValueError(f"hidden_act={cfg.hidden_act!r} with use_gated_mlp={cfg.use_gated_mlp}: expected "
                         f"{want!r} (the activation timm's Eva computes there)")
    if cfg.key_bias:
        raise ValueError("key_bias=True: timm's Eva has no key bias (DINOv3's is zero); expected key_bias=False")
    if cfg.query_bias != cfg.value_bias:
        raise ValueError(f"query_bias={cfg.query_bias}, value_bias={cfg.value_bias}: expected both or neither")
    size = cfg.image_size if isinstance(cfg.image_size, int) else tuple(cfg.image_size)
    patch = cfg.patch_size if isinstance(cfg.patch_size, int) else tuple(cfg.patch_size)
    return dict(img_size=size, patch_size=patch, in_chans=cfg.num_channels, num_classes=0, global_pool="token",
                embed_dim=cfg.hidden_size, depth=cfg.num_hidden_layers, num_heads=cfg.num_attention_heads,
                mlp_ratio=cfg.intermediate_size / cfg.hidden_size, qkv_bias=cfg.query_bias, qkv_fused=False,
                swiglu_mlp=cfg.use_gated_mlp, swiglu_align_to=1 if cfg.use_gated_mlp else 0, init_values=cfg.layerscale_value,
                num_reg_tokens=cfg.num_register_tokens, use_abs_pos_emb=False, use_rot_pos_emb=True,
                rope_type="dinov3", rope_temperature=cfg.rope_theta, rope_rotate_half=True,
                rope_shift_coords=cfg.pos_embed_shift, rope_jitter_coords=cfg.pos_embed_jitter,
                rope_rescale_coords=cfg.pos_embed_rescale, dynamic_img_size=True, use_fc_norm=False,
                norm_layer=partial(LayerNorm, eps=cfg.layer_norm_eps))


def hf_state_dict(hf_model, *, gated: bool) -> dict:
    """transformers' DINOv3ViTModel weights (the model or its state_dict) under timm Eva's keys."""
    out = {}
    state = hf_model if isinstance(hf_model, dict) else hf_model.state_dict()
    for key, value in state.items():
        if key in ("embeddings.mask_token",) or key.startswith("rope_embeddings.") or value.numel() == 0:
            continue  # pre-training mask token; the RoPE has no weights; no register tokens
        k = (key.replace("embeddings.cls_token", "cls_token").replace("embeddings.register_tokens", "reg_token")
             .replace("embeddings.patch_embeddings.", "patch_embed.proj.").replace("model.layer.", "blocks.")
             .replace(".attention.o_proj.", ".attn.proj.").replace(".attention.", ".attn.")
             .replace(".layer_scale1.lambda1", ".gamma_1").replace(".layer_scale2.lambda1", ".gamma_2"))
        if ".mlp." in k:
            names = {"gate_proj": "fc1_g", "up_proj": "fc1_x", "down_proj": "fc2"} if gated else \
                {"up_proj": "fc1", "down_proj": "fc2"}
            for a, b in names.items():
                k = k.replace(f".mlp.{a}.", f".mlp.{b}.")
        out[k] = value
    return out


def convert_hf_dinov3(hf_model):
    """A ``VispeEva`` with the weights of transformers' ``DINOv3ViTModel`` (module docstring)."""
    import timm.models.eva as timm_eva

    from vispe.models.eva import convert_eva

    if type(hf_model).__name__ != "DINOv3ViTModel":
        raise ValueError(f"hf_model is a {type(hf_model).__name__}: expected transformers' DINOv3ViTModel")
    cfg = hf_model.config
    model = timm_eva.Eva(**_hf_eva_args(cfg))
    ref = next(hf_model.parameters())
    sd = hf_state_dict(hf_model, gated=cfg.use_gated_mlp)
    if not cfg.proj_bias:  # timm's Eva projection always has a bias: zero, as transformers' absent one
        sd.update({k: torch.zeros_like(v) for k, v in model.state_dict().items() if k.endswith("attn.proj.bias")})
    if not cfg.mlp_bias:
        sd.update({k: torch.zeros_like(v) for k, v in model.state_dict().items() if ".mlp." in k and k.endswith("bias")})
    model.load_state_dict(sd, strict=True)
    model = model.to(device=ref.device, dtype=ref.dtype).train(hf_model.training)
    return convert_eva(model)
