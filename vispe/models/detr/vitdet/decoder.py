"""LW-DETR's and RF-DETR's decoder: DINO-style deformable layers with one query position for all layers.

Boxes are the papers' (cx, cy, w, h) in unit coordinates of the valid area, not logits ("box
reparameterisation": ``refine(box, delta) = (c + delta_c * wh, wh * exp(delta_wh))``). As transformers'
``LwDetrDecoder`` (the original's ``lite_refpoint_refine``), the reference boxes are not refined between
layers: every layer samples around the same boxes, and every layer's prediction refines them once::

    ref_in = ref * (valid ratios)                                       (B, Q, L, 4)
    query_pos = ref_point_head(sine(ref_in at level 0))                 (B, Q, d)   sine: 4 x d/2 channels, (y, x, w, h)
    layer: t = norm1(t + SelfAttn(q = k = t + query_pos, v = t))       Group-DETR: groups attend within themselves
           t = norm2(t + MSDeformAttn(t + query_pos, ref_in, memory))
           t = norm3(t + FFN(t))
    every layer's output through ``norm`` (the decoder's LayerNorm) -> heads

transformers takes the sine of the box in unit coordinates of the whole padded map (``ref_in``), so a
query's position code changes with the padding around its image; ``mask_aware=True`` takes it of the box
in the valid area (``ref``), where it is the same for an image alone and padded (vispe's deliberate
difference, off for loaded models).

Self-attention and cross-attention have their own head counts (transformers'
``decoder_self_attention_heads`` 8, ``decoder_cross_attention_heads`` 16).
"""
from __future__ import annotations

import math
from typing import Any

import torch
from torch import nn

from vispe.attention import Attention, PosContext
from vispe.axis.sinusoidal import sinusoidal
from vispe.coords import float32_math
from vispe.deformable_attention import MSDeformAttn
from vispe.kernels.deformable import Levels, swap_xy
from vispe.models.detr.mlp import MLP, ffn


def refine(box: torch.Tensor, delta: torch.Tensor) -> torch.Tensor:
    """Box reparameterisation (module docstring): (cx, cy, w, h) refined by ``delta``.  # (..., 4)"""
    box = box.to(delta.dtype)
    return torch.cat([delta[..., :2] * box[..., 2:] + box[..., :2], delta[..., 2:].exp() * box[..., 2:]], -1)


def box_sine(box: torch.Tensor, num_feats: int, temperature: float = 10000.0) -> torch.Tensor:
    """Each coordinate of ``box`` (..., 4) as (cx, cy, w, h) in ``num_feats`` interleaved sin/cos channels
    of ``2 pi * coordinate``, in the order (y, x, w, h), float32 math.  # (..., 4 * num_feats)"""
    with float32_math(box.device):
        p = box.float() * (2 * math.pi)
        codes = sinusoidal(p, num_feats, temperature, "interleaved")  # (..., 4, num_feats)
        codes = torch.cat([codes[..., 1:2, :], codes[..., 0:1, :], codes[..., 2:, :]], -2)  # (y, x, w, h)
        return codes.flatten(-2).to(box.dtype)


class DecoderLayer(nn.Module):
    """One post-norm layer (module docstring)."""

    def __init__(self, d_model: int, self_heads: int, cross_heads: int, dim_feedforward: int, num_levels: int,
                 num_points: int, dropout: float = 0.0, attn_dropout: float = 0.0, activation: str = "relu",
                 attn_bias: bool = True) -> None:
        super().__init__()
        self.self_attn = Attention(d_model, self_heads, qkv_bias=attn_bias, attn_drop=attn_dropout, proj_drop=dropout)
        self.norm1 = nn.LayerNorm(d_model)
        self.cross_attn = MSDeformAttn(d_model, cross_heads, num_levels, num_points)
        self.dropout = nn.Dropout(dropout)
        self.norm2 = nn.LayerNorm(d_model)
        self.mlp = ffn(d_model, dim_feedforward, dropout, activation)
        self.norm3 = nn.LayerNorm(d_model)

    def forward(self, t: torch.Tensor, query_pos: torch.Tensor, reference: torch.Tensor, memory: torch.Tensor,
                levels: Levels, key_padding_mask: torch.Tensor | None = None,
                self_attn_mask: torch.Tensor | None = None) -> torch.Tensor:
        """``t`` (B, Q, d), ``query_pos`` (B, Q, d), ``reference`` (B, Q, L, 4) as (cy, cx, h, w).  # (B, Q, d)"""
        t = self.norm1(t + self.self_attn(t, attn_mask=self_attn_mask, ctx=PosContext(pos=query_pos)))
        t = self.norm2(t + self.dropout(self.cross_attn(t, reference, memory, levels, key_padding_mask,
                                                        query_pos=query_pos)))
        return self.norm3(t + self.mlp(t))


class LiteDecoder(nn.Module):
    """The decoder (module docstring): ``layers.{i}``, ``norm``, ``ref_point_head`` (MLP 2d -> d -> d)."""

    def __init__(self, num_layers: int, d_model: int, *, mask_aware: bool = False, **layer_kw: Any) -> None:
        super().__init__()
        self.d_model, self.mask_aware = d_model, mask_aware
        self.layers = nn.ModuleList(DecoderLayer(d_model, **layer_kw) for _ in range(num_layers))
        self.norm = nn.LayerNorm(d_model)
        self.ref_point_head = MLP(2 * d_model, d_model, d_model, 2)

    def forward(self, t: torch.Tensor, ref: torch.Tensor, memory: torch.Tensor, levels: Levels,
                ratios: torch.Tensor, key_padding_mask: torch.Tensor | None = None,
                self_attn_mask: torch.Tensor | None = None) -> torch.Tensor:
        """``t`` (B, Q, d), ``ref`` (B, Q, 4) (cx, cy, w, h), ``ratios`` (B, L, 2) valid ratios (y, x)
        -> every layer's normed output.  # (num_layers, B, Q, d)"""
        r = swap_xy(ratios).repeat(1, 1, 2)  # (B, L, 4) as (x, y, x, y)
        ref_in = ref[:, :, None] * r[:, None]  # (B, Q, L, 4) as (cx, cy, w, h)
        at = ref if self.mask_aware else ref_in[:, :, 0]  # the valid area's box, or (transformers) the map's
        query_pos = self.ref_point_head(box_sine(at, self.d_model // 2))  # (B, Q, d)
        reference = swap_xy(ref_in)  # (B, Q, L, 4) as (cy, cx, h, w)
        outs = []
        for layer in self.layers:
            t = layer(t, query_pos, reference, memory, levels, key_padding_mask, self_attn_mask)
            outs.append(self.norm(t))
        return torch.stack(outs)
