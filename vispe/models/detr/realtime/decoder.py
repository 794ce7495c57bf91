"""RT-DETR's decoder: Deformable DETR's layer, a box-MLP query position, per-layer heads, refinement.

Per layer i (transformers' ``RTDetrDecoder``; lyuwenyu's ``TransformerDecoder``)::

    query_pos = query_pos_head(b)                      MLP(4 -> 2d -> d) of the box b, (cx, cy, w, h)  # (B, T, d)
    t = DeformableDecoderLayer(t, query_pos, reference = b at every level, memory)            # (B, T, d)
    b' = sigmoid(bbox_embed[i](t) + logit(b));  logits_i = class_embed[i](t)
    b = b'.detach()

The query's position is an MLP of its 4D box, not a sine of it (DAB-/DINO-DETR's); the deformable
cross-attention samples around the box (the box rule of ``vispe.kernels.deformable``: offsets
scaled by the box's half size over the number of points). Boxes are the whole map's unit
coordinates (RT-DETR does not rescale by valid ratios). The self-attention takes the denoising
groups' mask. RT-DETRv2 (``v2={...}``): each layer's cross-attention is ``MSDeformAttnV2`` (per-level
points, ``offset_scale``, ``method="discrete"``), the rest unchanged. Gradients: transformers' (each layer's box from the detached box before it);
lyuwenyu's training adds look-forward-twice (``vispe.models.detr.queries.dn.lookahead``), which changes the
gradients only, not the outputs.
"""
from __future__ import annotations

from typing import Any

import torch
from torch import nn

from vispe.kernels.deformable import Levels, swap_xy
from vispe.models.detr.mlp import MLP, inverse_sigmoid
from vispe.models.detr.realtime.deform_v2 import MSDeformAttnV2
from vispe.models.detr.transformer.deformable_decoder import DeformableDecoderLayer


class RealtimeDecoder(nn.Module):
    def __init__(self, d_model: int = 256, num_heads: int = 8, ffn_dim: int = 1024, num_layers: int = 6, *,
                 num_classes: int = 80, num_levels: int = 3, num_points: int = 4, dropout: float = 0.0,
                 activation: str = "relu", v2: dict[str, Any] | None = None) -> None:
        super().__init__()
        self.layers = nn.ModuleList(DeformableDecoderLayer(d_model, num_heads, ffn_dim, dropout, num_levels, num_points,
                                                           activation, attn_dropout=dropout) for _ in range(num_layers))
        if v2 is not None:  # RT-DETRv2's operator in every layer (per-level points, offset scale, discrete sampling)
            for layer in self.layers:
                layer.cross_attn = MSDeformAttnV2(d_model, num_heads, num_levels, **{"num_points": num_points, **v2})
        self.query_pos_head = MLP(4, 2 * d_model, d_model, 2)
        self.class_embed = nn.ModuleList(nn.Linear(d_model, num_classes) for _ in range(num_layers))
        self.bbox_embed = nn.ModuleList(MLP(d_model, d_model, 4, 3) for _ in range(num_layers))

    def forward(self, t: torch.Tensor, box_logits: torch.Tensor, memory: torch.Tensor, levels: Levels,
                attn_mask: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """Queries ``t`` (B, T, d) at reference ``box_logits`` (B, T, 4) (cx, cy, w, h), ``memory`` (B, N, d);
        ``attn_mask`` (T, T) True = may not attend. -> (logits (B, layers, T, K), boxes (B, layers, T, 4))."""
        ref = box_logits.sigmoid()  # (B, T, 4)
        L = len(levels)
        allowed = None if attn_mask is None else ~attn_mask  # SDPA's convention: True = may attend
        logits, boxes = [], []
        for layer, cls_head, box_head in zip(self.layers, self.class_embed, self.bbox_embed):
            query_pos = self.query_pos_head(ref)  # (B, T, d)
            reference = swap_xy(ref)[:, :, None].expand(-1, -1, L, -1)  # (B, T, L, 4) as (cy, cx, h, w)
            t = layer(t, query_pos, reference, memory, levels, self_attn_mask=allowed)
            new = (box_head(t) + inverse_sigmoid(ref)).sigmoid()  # (B, T, 4)
            logits.append(cls_head(t))
            boxes.append(new)
            ref = new.detach()
        return torch.stack(logits, 1), torch.stack(boxes, 1)
