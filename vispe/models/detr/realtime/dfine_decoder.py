"""D-FINE's decoder: fine-grained distribution refinement (FDR) and localization quality estimation (LQE).

Peng et al., ICLR 2025; transformers' ``DFineDecoder`` / ``DFineDecoderLayer`` (parameter names theirs).
A layer (post-norm)::

    t = self_attn_layer_norm(t + SelfAttn(q = k = t + pos, v = t))           pos = query_pos_head(b).clamp(-10, 10)
    t = gateway(t, MSDeformAttnV2(t + pos, b, memory))                        no value / output projections;
                                                                               gate: LN(g1 * t + g2 * a), g = sigmoid(W[t, a])
    t = final_layer_norm(t + MLP(t))

The loop: after layer 0, ``b0 = sigmoid(pre_bbox_head(t) + logit(b))`` is the initial box; each layer i
predicts four distributions over ``max_num_bins + 1`` bins (``bbox_embed[i]`` of ``t + t_{i-1}.detach()``,
added to the previous layer's, not detached), whose expectation under the non-uniform weighting function
W(n) (``up``, ``reg_scale``) gives each edge's distance from ``b0``'s centre in units of its size / reg_scale
(``distance2bbox``); the refined box is the next layer's reference (detached). Class scores:
``class_embed[i](t)`` plus the LQE term, an MLP of each edge distribution's top-4 probabilities and their
mean. Outputs per layer (training: every layer with the pre-box head's at the front; evaluation: the
last layer only, as transformers): logits (B, layers, T, K), boxes (B, layers, T, 4) (cx, cy, w, h); and for
D-FINE's losses (``dfine_loss``) each of those layers' edge distributions (the pre-box head's has none)
``corners`` (B, layers', T, 4 (N + 1)) and the initial box ``b0`` (B, T, 4).
"""
from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from torchvision.ops import box_convert

from vispe.attention import Attention, PosContext
from vispe.kernels.deformable import Levels, swap_xy
from vispe.models.detr.mlp import MLP, inverse_sigmoid
from vispe.models.detr.realtime.deform_v2 import MSDeformAttnV2


def weighting_function(num_bins: int, up: torch.Tensor, reg_scale: torch.Tensor) -> torch.Tensor:
    """D-FINE's W(n), ``num_bins + 1`` values from ``-2 up reg_scale`` to ``+2 up reg_scale``, 0 in the middle.  # (N+1,)"""
    u1 = up.abs()[0] * reg_scale.abs()[0]
    step = (u1 + 1) ** (2 / (num_bins - 2))
    left = [-(step ** i) + 1 for i in range(num_bins // 2 - 1, 0, -1)]
    right = [step ** i - 1 for i in range(1, num_bins // 2)]
    return torch.stack([-2 * u1, *left, torch.zeros_like(u1), *right, 2 * u1])


def distance_to_box(ref: torch.Tensor, dist: torch.Tensor, reg_scale: torch.Tensor) -> torch.Tensor:
    """Edges at ``(0.5 reg_scale + d) * size / reg_scale`` from the centre of ``ref`` (cx, cy, w, h).  # (..., 4)"""
    s = reg_scale.abs()
    half = 0.5 * s
    x0 = ref[..., 0] - (half + dist[..., 0]) * (ref[..., 2] / s)
    y0 = ref[..., 1] - (half + dist[..., 1]) * (ref[..., 3] / s)
    x1 = ref[..., 0] + (half + dist[..., 2]) * (ref[..., 2] / s)
    y1 = ref[..., 1] + (half + dist[..., 3]) * (ref[..., 3] / s)
    return box_convert(torch.stack([x0, y0, x1, y1], -1), "xyxy", "cxcywh")


class Gate(nn.Module):
    def __init__(self, d: int) -> None:
        super().__init__()
        self.gate = nn.Linear(2 * d, 2 * d)
        self.norm = nn.LayerNorm(d)

    def forward(self, residual: torch.Tensor, x: torch.Tensor) -> torch.Tensor:  # (B, T, d)
        g1, g2 = self.gate(torch.cat([residual, x], -1)).sigmoid().chunk(2, -1)
        return self.norm(g1 * residual + g2 * x)


class LQE(nn.Module):
    def __init__(self, num_bins: int, top: int = 4, hidden: int = 64, layers: int = 2) -> None:
        super().__init__()
        self.num_bins, self.top = num_bins, top
        self.reg_conf = MLP(4 * (top + 1), hidden, 1, layers)

    def forward(self, scores: torch.Tensor, corners: torch.Tensor) -> torch.Tensor:  # (B, T, K)
        B, T, _ = corners.shape
        prob = corners.view(B, T, 4, self.num_bins + 1).softmax(-1)
        top = prob.topk(self.top, dim=-1).values  # (B, T, 4, top)
        stat = torch.cat([top, top.mean(-1, keepdim=True)], -1).reshape(B, T, -1)
        return scores + self.reg_conf(stat)


class DFineDecoderLayer(nn.Module):
    def __init__(self, d: int, heads: int, ffn: int, num_levels: int, num_points: int | Sequence[int], *,
                 offset_scale: float = 0.5,
                 method: str = "default") -> None:
        super().__init__()
        self.self_attn = Attention(d, heads, qkv_bias=True)
        self.self_attn_layer_norm = nn.LayerNorm(d)
        self.encoder_attn = MSDeformAttnV2(d, heads, num_levels, num_points, offset_scale=offset_scale, method=method,
                                           projections=False)
        self.gateway = Gate(d)
        self.mlp = MLP(d, ffn, d, 2)
        self.final_layer_norm = nn.LayerNorm(d)

    def forward(self, t: torch.Tensor, pos: torch.Tensor, reference: torch.Tensor, memory: torch.Tensor, levels: Levels,
                attn_mask: torch.Tensor | None = None) -> torch.Tensor:  # (B, T, d)
        t = self.self_attn_layer_norm(t + self.self_attn(t, attn_mask=attn_mask, ctx=PosContext(pos=pos)))
        t = self.gateway(t, self.encoder_attn(t + pos, reference, memory, levels))
        return self.final_layer_norm((t + self.mlp(t)).clamp(-65504, 65504))


class DFineDecoder(nn.Module):
    def __init__(self, d_model: int = 256, num_heads: int = 8, ffn_dim: int = 1024, num_layers: int = 6, *,
                 num_classes: int = 80, num_levels: int = 3, num_points: Any = 4, offset_scale: float = 0.5,
                 method: str = "default", num_bins: int = 32, reg_scale: float = 4.0, up: float = 0.5,
                 lqe_top: int = 4, lqe_hidden: int = 64, lqe_layers: int = 2) -> None:
        super().__init__()
        self.layers = nn.ModuleList(DFineDecoderLayer(d_model, num_heads, ffn_dim, num_levels, num_points,
                                                      offset_scale=offset_scale, method=method) for _ in range(num_layers))
        self.query_pos_head = MLP(4, 2 * d_model, d_model, 2)
        self.pre_bbox_head = MLP(d_model, d_model, 4, 3)
        self.class_embed = nn.ModuleList(nn.Linear(d_model, num_classes) for _ in range(num_layers))
        self.bbox_embed = nn.ModuleList(MLP(d_model, d_model, 4 * (num_bins + 1), 3) for _ in range(num_layers))
        self.lqe_layers = nn.ModuleList(LQE(num_bins, lqe_top, lqe_hidden, lqe_layers) for _ in range(num_layers))
        self.num_bins = num_bins
        self.reg_scale = nn.Parameter(torch.tensor([float(reg_scale)]), requires_grad=False)
        self.up = nn.Parameter(torch.tensor([float(up)]), requires_grad=False)

    def forward(self, t: torch.Tensor, box_logits: torch.Tensor, memory: torch.Tensor, levels: Levels,
                attn_mask: torch.Tensor | None = None) -> tuple[torch.Tensor, ...]:
        """As ``RealtimeDecoder.forward``, then ``corners`` and ``b0`` (module docstring)."""
        project = weighting_function(self.num_bins, self.up, self.reg_scale)  # (N+1,)
        ref = box_logits.sigmoid()  # (B, T, 4) detached reference
        L = len(levels)
        allowed = None if attn_mask is None else ~attn_mask
        prev_t: torch.Tensor | float = 0.0
        prev_corners: torch.Tensor | float = 0.0
        logits, boxes, dists = [], [], []
        last = len(self.layers) - 1
        for i, layer in enumerate(self.layers):
            pos = self.query_pos_head(ref).clamp(-10, 10)  # (B, T, d)
            reference = swap_xy(ref)[:, :, None].expand(-1, -1, L, -1)  # (B, T, L, 4) as (cy, cx, h, w)
            t = layer(t, pos, reference, memory, levels, allowed)
            if i == 0:
                first = (self.pre_bbox_head(t) + inverse_sigmoid(ref)).sigmoid()  # (B, T, 4)
                initial = first.detach()
            corners = self.bbox_embed[i](t + prev_t) + prev_corners  # (B, T, 4 (N+1))
            dist = F.linear(corners.reshape(-1, self.num_bins + 1).softmax(-1), project).reshape(*t.shape[:2], 4)
            box = distance_to_box(initial, dist, self.reg_scale)  # (B, T, 4)
            prev_corners, ref, prev_t = corners, box.detach(), t.detach()
            if self.training or i == last:
                scores = self.class_embed[i](t)
                if i == 0:  # the pre-box head's, as transformers (also in evaluation with one layer)
                    logits.append(scores)
                    boxes.append(first)
                logits.append(self.lqe_layers[i](scores, corners))
                boxes.append(box)
                dists.append(corners)
        return torch.stack(logits, 1), torch.stack(boxes, 1), torch.stack(dists, 1), initial
