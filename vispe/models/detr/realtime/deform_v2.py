"""RT-DETRv2's deformable cross-attention (Lv et al., 2024, "RT-DETRv2: Improved Baseline with Bag-of-Freebies").

Two changes to Deformable DETR's operator (``vispe.deformable_attention.MSDeformAttn``), same parameter
names (``sampling_offsets``, ``attention_weights``, ``value_proj``, ``output_proj``):

* per-level sampling points: ``num_points`` an int or one count per level, ``P_l``; the projections
  predict ``M * sum(P_l)`` offsets (the papers' (x, y) pairs) and weights, points concatenated level by
  level, softmax over all of them; a box reference moves point p of level l by
  ``offset * (1 / P_l) * (w, h) * offset_scale`` (``offset_scale`` 0.5: Deformable DETR's box rule);
* ``method="discrete"``: each point reads the value of one cell, ``int(u * (w_l, h_l) + 0.5)`` clamped to
  the map (transformers' ``multi_scale_deformable_attention_v2``; lyuwenyu's ``discrete`` for
  deployment without ``grid_sample``), instead of ``"default"``'s bilinear sampling.

Bilinear sampling runs through ``vispe.kernels.deformable.ms_deform_attn``, levels with fewer points
padded with zero-weight points. Called as ``MSDeformAttn``: ``(query, reference (B, Q, L, 4) boxes
(cy, cx, h, w), value, levels, key_padding_mask, query_pos=...)``; the box is read from the first level
(RT-DETR's reference is the same box at every level). ``projections=False``: no ``value_proj`` /
``output_proj`` (D-FINE's operator, whose value is the memory itself).
"""
from __future__ import annotations

import math
from collections.abc import Sequence

import torch
from torch import nn

from vispe import _checks
from vispe.kernels.deformable import Levels, ms_deform_attn

METHODS = ("default", "discrete")


class MSDeformAttnV2(nn.Module):
    def __init__(self, d_model: int = 256, num_heads: int = 8, num_levels: int = 3,
                 num_points: int | Sequence[int] = 4, *, offset_scale: float = 0.5, method: str = "default",
                 projections: bool = True) -> None:
        super().__init__()
        if d_model % num_heads:
            raise ValueError(f"d_model={d_model}: expected a multiple of num_heads={num_heads}")
        points = [num_points] * num_levels if isinstance(num_points, int) else list(num_points)
        if len(points) != num_levels or any(isinstance(p, bool) or not isinstance(p, int) or p < 1 for p in points):
            raise ValueError(f"num_points={num_points!r}: expected a positive int or {num_levels} positive ints (one per level)")
        self.d_model, self.num_heads, self.num_levels, self.points = d_model, num_heads, num_levels, points
        self.offset_scale = _checks.positive_float("offset_scale", offset_scale)
        self.method = _checks.choice("method", method, METHODS)
        S = sum(points)
        self.sampling_offsets = nn.Linear(d_model, num_heads * S * 2)
        self.attention_weights = nn.Linear(d_model, num_heads * S)
        # D-FINE's operator has no value / output projections (projections=False)
        self.value_proj: nn.Module = nn.Linear(d_model, d_model) if projections else nn.Identity()
        self.output_proj: nn.Module = nn.Linear(d_model, d_model) if projections else nn.Identity()
        self.point_scale: torch.Tensor
        self.register_buffer("point_scale", torch.tensor([1.0 / p for p in points for _ in range(p)]), persistent=False)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """Deformable DETR's init: head m's points along angle 2 pi m / M, point p of a level at p + 1."""
        M = self.num_heads
        nn.init.zeros_(self.sampling_offsets.weight)
        theta = torch.arange(M, dtype=torch.float32) * (2.0 * math.pi / M)
        grid = torch.stack([theta.cos(), theta.sin()], -1)
        grid = grid / grid.abs().max(-1, keepdim=True)[0]  # (M, 2) as (x, y)
        steps = torch.cat([torch.arange(1, p + 1, dtype=torch.float32) for p in self.points])  # (S,)
        with torch.no_grad():
            self.sampling_offsets.bias.copy_((grid[:, None] * steps[None, :, None]).flatten())
        nn.init.zeros_(self.attention_weights.weight)
        nn.init.zeros_(self.attention_weights.bias)
        for lin in (self.value_proj, self.output_proj):
            if isinstance(lin, nn.Linear):
                nn.init.xavier_uniform_(lin.weight)
                nn.init.zeros_(lin.bias)

    def forward(self, query: torch.Tensor, reference: torch.Tensor, value: torch.Tensor, levels: Levels,
                key_padding_mask: torch.Tensor | None = None, *, query_pos: torch.Tensor | None = None) -> torch.Tensor:
        """``query`` (B, Q, d), ``reference`` (B, Q, L, 4) boxes (cy, cx, h, w), ``value`` (B, N, d).  # (B, Q, d)"""
        B, Q, d = query.shape
        M, S = self.num_heads, sum(self.points)
        if len(levels) != self.num_levels or reference.shape[-1] != 4:
            raise ValueError(f"levels {list(levels.shapes)} and reference {tuple(reference.shape)}: expected "
                             f"{self.num_levels} levels and (B, Q, L, 4) boxes")
        if query_pos is not None:
            query = query + query_pos.to(query.dtype)
        v = self.value_proj(value)  # (B, N, d)
        if key_padding_mask is not None:
            v = v.masked_fill(key_padding_mask[..., None], 0.0)
        v = v.view(B, -1, M, d // M)  # (B, N, M, D)
        offsets = self.sampling_offsets(query).view(B, Q, M, S, 2)  # (x, y) pairs
        weights = self.attention_weights(query).view(B, Q, M, S).softmax(-1)  # (B, Q, M, S)
        box = reference[:, :, 0]  # (B, Q, 4) as (cy, cx, h, w)
        scale = self.point_scale.to(query.dtype)[:, None] * self.offset_scale  # (S, 1)
        loc_yx = box[:, :, None, None, :2] + offsets.flip(-1) * scale * box[:, :, None, None, 2:]  # (B, Q, M, S, 2)
        if self.method == "discrete":
            out = _discrete(v, levels, loc_yx, weights, self.points)
        else:
            out = ms_deform_attn(v, levels, *_padded(loc_yx, weights, self.points))
        return self.output_proj(out)


def _padded(loc: torch.Tensor, weights: torch.Tensor, points: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
    """(B, Q, M, S, 2), (B, Q, M, S) -> (B, Q, M, L, P_max, 2), (B, Q, M, L, P_max): zero weights pad."""
    P = max(points)
    locs, ws = [], []
    for lo, w in zip(loc.split(points, dim=3), weights.split(points, dim=3)):
        pad = P - w.shape[-1]
        locs.append(torch.nn.functional.pad(lo, (0, 0, 0, pad)))
        ws.append(torch.nn.functional.pad(w, (0, pad)))
    return torch.stack(locs, 3), torch.stack(ws, 3)


def _discrete(v: torch.Tensor, levels: Levels, loc_yx: torch.Tensor, weights: torch.Tensor,
              points: list[int]) -> torch.Tensor:
    """Each point reads the cell ``int(u * size + 0.5)`` clamped (module docstring).  # (B, Q, M*D)"""
    B, N, M, D = v.shape
    Q = loc_yx.shape[1]
    out = v.new_zeros(B, Q, M, D)
    for (h, w), start, lo, wt in zip(levels.shapes, levels.start, loc_yx.split(points, dim=3),
                                     weights.split(points, dim=3)):
        iy = (lo[..., 0] * h + 0.5).to(torch.int64).clamp(0, h - 1)  # (B, Q, M, P_l)
        ix = (lo[..., 1] * w + 0.5).to(torch.int64).clamp(0, w - 1)
        idx = start + iy * w + ix  # (B, Q, M, P_l) token index
        heads = torch.arange(M, device=v.device).view(1, 1, M, 1).expand_as(idx)
        batch = torch.arange(B, device=v.device).view(B, 1, 1, 1).expand_as(idx)
        sampled = v[batch, idx, heads]  # (B, Q, M, P_l, D)
        out = out + (sampled * wt[..., None]).sum(3)
    return out.flatten(2)  # (B, Q, M*D)
