"""DEIMv2's decoder: D-FINE's FDR / LQE decoder (``vispe.models.detr.realtime.dfine_decoder``) with other layers.

Huang et al., 2025 (DEIMv2); transformers' ``Deimv2Decoder`` / ``Deimv2DecoderLayer`` (parameter names theirs).
What differs from D-FINE, all in the layer but the first item::

    query_pos_head   MLP(4 -> d -> d -> d), three layers (D-FINE: 4 -> 2d -> d, two)
    norms            RMSNorm (eps 1e-6, a weight, no bias) instead of LayerNorm, the gate's included
    FFN              SwiGLU: down(silu(gate(t)) * up(t)), hidden ffn_dim // 2
    gateway          optional (``use_gateway=False``: t = encoder_attn_layer_norm(t + cross-attention))
    heads            ``share_bbox_head``: one box head for every layer

The loop (initial box from the pre-box head, distributions refined layer by layer, LQE) is D-FINE's.
"""
from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from vispe.attention import Attention, PosContext
from vispe.kernels.deformable import Levels
from vispe.models.detr.mlp import MLP
from vispe.models.detr.realtime.deform_v2 import MSDeformAttnV2
from vispe.models.detr.realtime.dfine_decoder import DFineDecoder, Gate

RMS_EPS = 1e-6  # transformers' Deimv2RMSNorm (Llama's)


class SwiGLU(nn.Module):
    def __init__(self, d: int, hidden: int) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(d, hidden)
        self.up_proj = nn.Linear(d, hidden)
        self.down_proj = nn.Linear(hidden, d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # (B, T, d)
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class DEIMv2DecoderLayer(nn.Module):
    def __init__(self, d: int, heads: int, ffn: int, num_levels: int, num_points: int | Sequence[int], *,
                 offset_scale: float = 0.5,
                 method: str = "default", use_gateway: bool = True) -> None:
        super().__init__()
        self.self_attn = Attention(d, heads, qkv_bias=True)
        self.self_attn_layer_norm = nn.RMSNorm(d, eps=RMS_EPS)
        self.encoder_attn = MSDeformAttnV2(d, heads, num_levels, num_points, offset_scale=offset_scale, method=method,
                                           projections=False)
        self.gateway: nn.Module | None = None
        self.encoder_attn_layer_norm: nn.Module | None = None
        if use_gateway:
            gate = Gate(d)
            gate.norm = nn.RMSNorm(d, eps=RMS_EPS)  # type: ignore[assignment]  # DEIMv2: RMSNorm in the gate
            self.gateway = gate
        else:
            self.encoder_attn_layer_norm = nn.RMSNorm(d, eps=RMS_EPS)
        self.mlp = SwiGLU(d, ffn // 2)
        self.final_layer_norm = nn.RMSNorm(d, eps=RMS_EPS)

    def forward(self, t: torch.Tensor, pos: torch.Tensor, reference: torch.Tensor, memory: torch.Tensor, levels: Levels,
                attn_mask: torch.Tensor | None = None) -> torch.Tensor:  # (B, T, d)
        t = self.self_attn_layer_norm(t + self.self_attn(t, attn_mask=attn_mask, ctx=PosContext(pos=pos)))
        a = self.encoder_attn(t + pos, reference, memory, levels)  # (B, T, d)
        if self.gateway is not None:
            t = self.gateway(t, a)
        else:
            assert self.encoder_attn_layer_norm is not None
            t = self.encoder_attn_layer_norm(t + a)
        return self.final_layer_norm(t + self.mlp(t))


class DEIMv2Decoder(DFineDecoder):
    """``DFineDecoder`` with DEIMv2's layers and query position head (module docstring)."""

    def __init__(self, d_model: int = 256, num_heads: int = 8, ffn_dim: int = 1024, num_layers: int = 6, *,
                 num_levels: int = 3, num_points: Any = 4, offset_scale: float = 0.5, method: str = "default",
                 use_gateway: bool = True, share_bbox_head: bool = False, **dfine: Any) -> None:
        super().__init__(d_model, num_heads, ffn_dim, num_layers, num_levels=num_levels, num_points=num_points,
                         offset_scale=offset_scale, method=method, **dfine)
        self.layers = nn.ModuleList(
            DEIMv2DecoderLayer(d_model, num_heads, ffn_dim, num_levels, num_points, offset_scale=offset_scale,
                               method=method, use_gateway=use_gateway) for _ in range(num_layers))
        self.query_pos_head = MLP(4, d_model, d_model, 3)
        if share_bbox_head:
            self.bbox_embed = nn.ModuleList([self.bbox_embed[0]] * num_layers)
