"""Build a ``ViTDETR`` from keyword arguments, or from a transformers ``LwDetrConfig`` / ``RfDetrConfig``
(read attribute by attribute; an option vispe does not implement is refused by name).

``create_vit_detr(flavour="rfdetr" | "lwdetr", ...)``: vispe's names with the small defaults of the
shapes configs; ``from_hf_config(config)``: the arguments that rebuild transformers' model.
"""
from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from vispe import _checks
from vispe.models.detr.vitdet.decoder import LiteDecoder
from vispe.models.detr.vitdet.model import ViTDETR
from vispe.models.detr.vitdet.projector import MultiScaleProjector
from vispe.models.detr.vitdet.queries import GroupTwoStageQueries
from vispe.models.detr.vitdet.vit import WindowedViT

FLAVOURS = ("lwdetr", "rfdetr")


def create_vit_detr(*, flavour: str = "rfdetr", num_classes: int, embed_dim: int = 64, depth: int = 4,
                    num_heads: int = 2, patch_size: int = 8, num_windows: int = 2,
                    window_blocks: Sequence[int] | None = None, out_indices: Sequence[int] | None = None,
                    table_grid: int | None = 8, encoding: str | None = None, mask_aware: bool = False,
                    d_model: int = 64, scales: Sequence[float] | None = None, c2f_blocks: int = 1,
                    expansion: float = 0.5, dec_layers: int = 2, self_heads: int = 4, cross_heads: int = 4,
                    dim_feedforward: int = 128, num_points: int = 2, num_queries: int = 30, groups: int = 3,
                    dropout: float = 0.0, mlp_ratio: float = 4.0, aux_loss: bool = True,
                    layer_scale: float = 1.0, vit_eps: float = 1e-6, norm_eps: float = 1e-5,
                    projector_act: str = "silu", decoder_act: str = "relu", attn_bias: bool = True) -> ViTDETR:
    """The detector; ``flavour`` picks RF-DETR's DINOv2 (class token, antialiased table, feature norm,
    one scale with a LayerNorm C2f) or LW-DETR's CAE ViT (no class token, BatchNorm C2f, scales
    (2.0, 0.5) by default)."""
    _checks.choice("flavour", flavour, FLAVOURS)
    rf = flavour == "rfdetr"
    out_indices = list(out_indices) if out_indices is not None else [depth // 2, depth]
    if window_blocks is None:  # RF-DETR's rule: every block before the last output that is not an output
        window_blocks = [i for i in range(max(out_indices)) if i + 1 not in out_indices]
    scales = list(scales) if scales is not None else ([1.0] if rf else [2.0, 0.5])
    if rf and scales != [1.0]:
        raise ValueError(f"scales={scales}: RF-DETR's projector has one scale, (1.0,)")
    backbone = WindowedViT(embed_dim=embed_dim, depth=depth, num_heads=num_heads, patch_size=patch_size,
                           num_windows=num_windows, window_blocks=window_blocks, out_indices=out_indices,
                           mlp_ratio=mlp_ratio, cls_token=rf, table_grid=table_grid, antialias=rf, out_norm=rf,
                           eps=vit_eps, layer_scale=layer_scale, encoding=encoding, mask_aware=mask_aware)
    projector = MultiScaleProjector([embed_dim] * len(out_indices), d_model, scales, num_blocks=c2f_blocks,
                                    expansion=expansion, act=projector_act, norm="layer" if rf else "batch",
                                    eps=norm_eps, sampling=not rf, mask_aware=mask_aware)
    queries = GroupTwoStageQueries(d_model, num_queries, num_classes, groups)
    decoder = LiteDecoder(dec_layers, d_model, self_heads=self_heads, cross_heads=cross_heads,
                          dim_feedforward=dim_feedforward, num_levels=len(scales), num_points=num_points,
                          dropout=dropout, activation=decoder_act, attn_bias=attn_bias, mask_aware=mask_aware)
    return ViTDETR(backbone, projector, queries, decoder, num_classes, aux_loss)


def _refuse(name: str, value: Any, expected: Any) -> None:
    if value != expected:
        raise ValueError(f"config {name}={value!r}: vispe's ViT detector implements {expected!r} only")


def from_hf_config(config: Any) -> dict[str, Any]:
    """``create_vit_detr`` arguments that rebuild transformers' ``LwDetrForObjectDetection`` /
    ``RfDetrForObjectDetection`` of ``config``."""
    kind = type(config).__name__
    if kind not in ("LwDetrConfig", "RfDetrConfig"):
        raise ValueError(f"config is a {kind}: expected a transformers LwDetrConfig or RfDetrConfig")
    rf = kind == "RfDetrConfig"
    b = config.backbone_config
    patch = b.patch_size if isinstance(b.patch_size, int) else b.patch_size[0]
    _refuse("backbone_config.hidden_act", b.hidden_act, "gelu")
    if rf:
        _refuse("backbone_config.use_swiglu_ffn", b.use_swiglu_ffn, False)
        _refuse("backbone_config.num_register_tokens", getattr(b, "num_register_tokens", 0), 0)
        _refuse("backbone_config.apply_layernorm", b.apply_layernorm, True)
        n, windows, grid = b.num_windows, list(b.window_block_indexes), b.image_size // patch
        scales, eps = [1.0], config.layer_norm_eps
    else:
        _refuse("backbone_config.use_absolute_position_embeddings", b.use_absolute_position_embeddings, True)
        side = int(round(b.num_windows ** 0.5))
        if side * side != b.num_windows:
            raise ValueError(f"config backbone_config.num_windows={b.num_windows}: expected a square number")
        pre = b.pretrain_image_size if isinstance(b.pretrain_image_size, int) else b.pretrain_image_size[0]
        n, windows, grid = side, list(b.window_block_indices), pre // patch
        scales, eps = list(config.projector_scale_factors), config.batch_norm_eps
    return dict(flavour="rfdetr" if rf else "lwdetr", num_classes=config.num_labels, embed_dim=b.hidden_size,
                depth=b.num_hidden_layers, num_heads=b.num_attention_heads, patch_size=patch, num_windows=n,
                window_blocks=windows, out_indices=list(b.out_indices), table_grid=grid, d_model=config.d_model,
                scales=scales, c2f_blocks=config.c2f_num_blocks, expansion=config.hidden_expansion,
                dec_layers=config.decoder_layers, self_heads=config.decoder_self_attention_heads,
                cross_heads=config.decoder_cross_attention_heads, dim_feedforward=config.decoder_ffn_dim,
                num_points=config.decoder_n_points, num_queries=config.num_queries, groups=config.group_detr,
                dropout=config.dropout, mlp_ratio=b.mlp_ratio, aux_loss=config.auxiliary_loss,
                vit_eps=b.layer_norm_eps, norm_eps=eps, projector_act=config.activation_function,
                decoder_act=config.decoder_activation_function, attn_bias=config.attention_bias,
                layer_scale=getattr(b, "layerscale_value", getattr(b, "cae_init_values", 1.0)))
