"""Multi-scale deformable attention (Zhu et al., ICLR 2021, "Deformable DETR"), in plain PyTorch.

``MSDeformAttn`` has the papers' parameters and names (``sampling_offsets``, ``attention_weights``,
``value_proj``, ``output_proj``: fundamentalvision/Deformable-DETR's ``MSDeformAttn`` and
transformers' ``DeformableDetrMultiscaleDeformableAttention``, whose weights load one to one) and
their initialisation (``reset_parameters``). Per call::

    q = query [+ query_pos]                                         # (B, Q, d)
    V = value_proj(value), zero at padded keys                      # (B, N, M, D), M heads, D = d / M
    offsets = sampling_offsets(q)  (x, y) pairs, the papers' layout  # (B, Q, M, L, P, 2)
    A = softmax over the L*P points of attention_weights(q)          # (B, Q, M, L, P)
    loc = reference + offsets / (w_l, h_l), in (x, y)                 # or the box rule, kernels.deformable
    out = output_proj( sum_{l,p} A * bilinear(V_l, loc) )             # (B, Q, d)

Position never enters as a q.k product: there is none. It enters through ``query_pos`` (added to
the query before the offsets and weights are predicted) and through ``reference``, where the
samples are taken. Conventions (``vispe.kernels.deformable``): reference points are vispe's (y, x)
(boxes (cy, cx, h, w); ``swap_xy`` turns the papers' (cx, cy, w, h) into it) in unit coordinates
of each level's whole map, i.e. already multiplied by the valid ratios (``vispe.coords``);
``levels`` gives each level's (h, w); ``key_padding_mask`` (B, N) is True at padding, where the
values are zeroed (an image alone and padded in a batch then sample the same numbers: beyond its
valid area the padded batch reads zeros, the image alone ``grid_sample``'s zero padding).

The sampling: ``vispe.kernels.deformable`` (``grid_sample``, plain PyTorch).
"""
from __future__ import annotations

import math

import torch
from torch import nn

from vispe import _checks
from vispe.kernels.deformable import Levels, deform_attn


class MSDeformAttn(nn.Module):
    """Multi-scale deformable attention (module docstring).

    Args:
        d_model: channels of queries and values.
        num_heads: heads M (``d_model`` a multiple of it).
        num_levels: feature levels L the offsets and weights are predicted for.
        num_points: sampling points P per head and level.
    """

    def __init__(self, d_model: int = 256, num_heads: int = 8, num_levels: int = 4, num_points: int = 4) -> None:
        super().__init__()
        _checks.positive_int("d_model", d_model)
        _checks.positive_int("num_heads", num_heads)
        if d_model % num_heads:
            raise ValueError(f"d_model={d_model}: expected a multiple of num_heads={num_heads}")
        self.d_model, self.num_heads = d_model, num_heads
        self.num_levels = _checks.positive_int("num_levels", num_levels)
        self.num_points = _checks.positive_int("num_points", num_points)
        M, L, P = num_heads, num_levels, num_points
        self.sampling_offsets = nn.Linear(d_model, M * L * P * 2)  # (x, y) pairs, the papers' layout
        self.attention_weights = nn.Linear(d_model, M * L * P)
        self.value_proj = nn.Linear(d_model, d_model)
        self.output_proj = nn.Linear(d_model, d_model)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """The papers' initialisation: zero offset weights, offset biases pointing head m at angle
        2 pi m / M (on the square's border, point p at p + 1 cells), zero attention weights (uniform
        softmax), Xavier-uniform value / output projections with zero biases."""
        M, L, P = self.num_heads, self.num_levels, self.num_points
        nn.init.zeros_(self.sampling_offsets.weight)
        theta = torch.arange(M, dtype=torch.float32) * (2.0 * math.pi / M)
        grid = torch.stack([theta.cos(), theta.sin()], -1)  # (M, 2) as (x, y)
        grid = (grid / grid.abs().max(-1, keepdim=True)[0]).view(M, 1, 1, 2).repeat(1, L, P, 1)  # (M, L, P, 2)
        grid = grid * torch.arange(1, P + 1, dtype=torch.float32).view(1, 1, P, 1)
        with torch.no_grad():
            self.sampling_offsets.bias.copy_(grid.flatten())
        nn.init.zeros_(self.attention_weights.weight)
        nn.init.zeros_(self.attention_weights.bias)
        for lin in (self.value_proj, self.output_proj):
            nn.init.xavier_uniform_(lin.weight)
            nn.init.zeros_(lin.bias)

    def forward(self, query: torch.Tensor, reference: torch.Tensor, value: torch.Tensor, levels: Levels,
                key_padding_mask: torch.Tensor | None = None, *, query_pos: torch.Tensor | None = None) -> torch.Tensor:
        """``query`` (B, Q, d), ``reference`` (B, Q, L, 2|4) unit (y, x[, h, w]) of each level's map,
        ``value`` (B, N, d) flattened over ``levels``, ``key_padding_mask`` (B, N) True = padding,
        ``query_pos`` (B|1, Q, d) added to the query.  # (B, Q, d)"""
        B, Q, d = query.shape
        M, L, P = self.num_heads, self.num_levels, self.num_points
        if d != self.d_model or value.dim() != 3 or value.shape[0] != B or value.shape[-1] != d:
            raise ValueError(f"query {tuple(query.shape)} and value {tuple(value.shape)}: expected (B, Q, {self.d_model}) "
                             f"and (B, N, {self.d_model})")
        if len(levels) != L:
            raise ValueError(f"levels has {len(levels)} levels {list(levels.shapes)}: this layer was built for "
                             f"num_levels={L}")
        if key_padding_mask is not None and (key_padding_mask.shape != value.shape[:2] or key_padding_mask.dtype != torch.bool):
            raise ValueError(f"key_padding_mask has shape {tuple(key_padding_mask.shape)} and dtype {key_padding_mask.dtype}: "
                             f"expected a torch.bool ({B}, {value.shape[1]}) tensor, True = padding")
        if query_pos is not None:
            query = query + query_pos.to(query.dtype)
        v = self.value_proj(value)  # (B, N, d)
        if key_padding_mask is not None:
            v = v.masked_fill(key_padding_mask[..., None], 0.0)
        v = v.view(B, -1, M, d // M)  # (B, N, M, D)
        offsets = self.sampling_offsets(query).view(B, Q, M, L, P, 2)  # (x, y) pairs
        weights = self.attention_weights(query).view(B, Q, M, L * P).softmax(-1).view(B, Q, M, L, P)
        out = deform_attn(v, levels, reference, offsets, weights)  # (B, Q, d)
        return self.output_proj(out)

    def extra_repr(self) -> str:
        return (f"d_model={self.d_model}, num_heads={self.num_heads}, num_levels={self.num_levels}, "
                f"num_points={self.num_points}")
