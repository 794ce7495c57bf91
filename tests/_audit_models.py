"""Small models with one planted position defect each, for tests/test_audit*.py.

``Tiny(mode)``: a 4x4 patch embedding, a position code, one attention block on
``scaled_dot_product_attention`` (head_dim 8, 2 heads), returning the tokens (B, N, C). Modes:

* "table": a learned 8x8 table resampled to (h, w) correctly (F.interpolate to size (h, w));
* "table_transposed": resampled to size (w, h) and read as (h, w): right on squares, transposed on
  non-square grids (timm #2190 / #2317);
* "rope": axial RoPE, rotate-half pairs and a table laid out for them (vispe rope_axial, base 100);
* "rope_wrong_layout": rotate-half pairs with cos/sin laid out for interleaved pairs (timm #2692);
* "rope_swapped": RoPE angles of token n at divmod(n, h), i.e. the grid read as (w, h): relative on
  squares, not on a non-square grid;
* "mask_ignored": takes a padding mask and drops it (DETR's sine over the whole canvas, no key padding).
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

C, HEADS, D = 16, 2, 8


def rope_angles(ys: torch.Tensor, xs: torch.Tensor, base: float = 100.0) -> torch.Tensor:
    """Axial RoPE angles, y on the first D/4 pairs (vispe rope_axial, written out).  # (N, D/2)"""
    f = base ** (-torch.arange(D // 4, dtype=torch.float32) * 4 / D)  # (D/4,)
    return torch.cat([ys[:, None] * f, xs[:, None] * f], dim=1)


def rotate_half(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    a, b = x.chunk(2, dim=-1)
    return x * cos + torch.cat([-b, a], dim=-1) * sin


class Attn(nn.Module):
    def __init__(self, mode: str):
        super().__init__()
        self.mode = mode
        self.qkv = nn.Linear(C, 3 * C)
        self.proj = nn.Linear(C, C)

    def forward(self, x: torch.Tensor, grid: tuple[int, int], kpm: torch.Tensor | None) -> torch.Tensor:
        B, N, _ = x.shape
        q, k, v = self.qkv(x).reshape(B, N, 3, HEADS, D).permute(2, 0, 3, 1, 4)  # (B, heads, N, D) each
        if self.mode.startswith("rope"):
            h, w = grid
            n = torch.arange(N)
            ys, xs = (n // h, n % h) if self.mode == "rope_swapped" else (n // w, n % w)
            ang = rope_angles(ys.float(), xs.float())  # (N, D/2)
            if self.mode == "rope_wrong_layout":
                ang = ang.repeat_interleave(2, dim=-1)  # (N, D): an interleaved table
            else:
                ang = torch.cat([ang, ang], dim=-1)  # (N, D): the rotate-half table
            q, k = rotate_half(q, ang.cos(), ang.sin()), rotate_half(k, ang.cos(), ang.sin())
        mask = None if kpm is None else ~kpm[:, None, None, :]  # (B, 1, 1, N) True = attend
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)  # (B, heads, N, D)
        return self.proj(out.transpose(1, 2).reshape(B, N, C))


class Block(nn.Module):
    def __init__(self, mode: str):
        super().__init__()
        self.attn = Attn(mode)

    def forward(self, x, grid, kpm):
        return x + self.attn(x, grid, kpm)


class Tiny(nn.Module):
    def __init__(self, mode: str = "table"):
        super().__init__()
        self.mode = mode
        self.patch_embed = nn.Conv2d(3, C, 4, 4)
        self.pos_embed = nn.Parameter(torch.randn(1, C, 8, 8) * 0.5)
        self.blocks = nn.ModuleList([Block(mode), Block(mode)])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.run(x, None)

    def run(self, x: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
        t = self.patch_embed(x)  # (B, C, h, w)
        B, _, h, w = t.shape
        t = t.flatten(2).transpose(1, 2)  # (B, N, C)
        if self.mode == "table":
            t = t + F.interpolate(self.pos_embed, size=(h, w), mode="bicubic").flatten(2).transpose(1, 2)
        elif self.mode == "table_transposed":
            t = t + F.interpolate(self.pos_embed, size=(w, h), mode="bicubic").flatten(2).transpose(1, 2)
        elif self.mode in ("mask_ignored", "sine_masked"):
            grid_mask = mask[:, ::4, ::4] if mask is not None else torch.zeros(B, h, w, dtype=torch.bool)
            t = t + sine(grid_mask if self.mode == "sine_masked" else torch.zeros_like(grid_mask))
        kpm = None
        if mask is not None and self.mode != "mask_ignored":
            kpm = mask[:, ::4, ::4].reshape(B, -1)  # (B, N) True = padding
        for blk in self.blocks:
            t = blk(t, (h, w), kpm)
        return t


class TinyMasked(Tiny):
    """``Tiny`` that takes a padding mask (B, H, W), True = padding."""

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
        return self.run(x, mask)


def sine(mask: torch.Tensor) -> torch.Tensor:
    """DETR's normalised sine (y then x), positions counted over the valid area of ``mask`` (B, h, w).  # (B, N, C)"""
    valid = (~mask).float()
    y = valid.cumsum(1)
    x = valid.cumsum(2)
    y = (y - 0.5) / y[:, -1:].clamp_min(1) * 2 * math.pi
    x = (x - 0.5) / x[:, :, -1:].clamp_min(1) * 2 * math.pi
    f = 10000 ** (-torch.arange(C // 4, dtype=torch.float32) * 4 / C)  # (C/4,)
    ey = torch.cat([(y[..., None] * f).sin(), (y[..., None] * f).cos()], -1)  # (B, h, w, C/2)
    ex = torch.cat([(x[..., None] * f).sin(), (x[..., None] * f).cos()], -1)
    return torch.cat([ey, ex], -1).flatten(1, 2)
