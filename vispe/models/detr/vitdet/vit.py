"""The windowed ViT backbone of LW-DETR and RF-DETR: plain pre-norm ViT blocks, some attending within
rectangular windows of the patch grid, the others globally; multi-level features are the grids after
chosen blocks.

Data flow (n = windows per side, G = the table's pretraining grid)::

    images (B, 3, H, W) -> patch conv -> grid (B, h, w, C) [+ table resampled to (h, w) (``table``)]
    [class token + its table row, one copy per window (RF-DETR's DINOv2)]         cls (B, n*n, C)
    block i: x + ls1 * attn(norm1(x)) ; x + ls2 * mlp(norm2(x))
       window block: tokens of window (i, j) (``windows.partition``: a rectangle of (h/n) x (w/n)
                     patches) and that window's class token attend to each other
       global block: every token and every class-token copy attend to each other
    features: the grid after each block of ``out_indices`` (k = after k blocks) [+ ``out_norm``]
       -> [(B, C, h, w)]

Position: the learned table (``table.resample_table``: bicubic, antialias as the source), or any vispe
rotary or bias encoding by name (``encoding="rope_mixed"``; RoPE needs no table: its scores depend on
offsets only, so window blocks rotate with window-local coordinates and global ones with the grid's),
or both, or none. An encoding is built per block from the registry with ``num_heads`` / ``head_dim``
(and ``grid``: the window's, for a bias table).

Mask-aware (``mask_aware=True`` and a mask with padding): windows are cut from each image's valid area
(``windows.window_ids``), the table is resampled to it (``table.table_for_valid``), padded keys are hidden:
an image alone and padded in a batch give the same features on its valid area when its valid grid is a
multiple of n per side (a ValueError otherwise). Without padding both paths are the same computation.
"""
from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import nn

from vispe import _checks, registry
from vispe.attention import Attention, PosContext
from vispe.coords import valid_extent
from vispe.models.detr.vitdet import windows as W
from vispe.models.detr.vitdet.table import resample_table, table_for_valid


class Block(nn.Module):
    """A pre-norm ViT block with layer scale (CAE's ``gamma_1/2``, DINOv2's ``layer_scale1/2``)."""

    def __init__(self, dim: int, num_heads: int, mlp_ratio: float, *, eps: float, layer_scale: float,
                 window: bool) -> None:
        super().__init__()
        self.window = window
        self.norm1 = nn.LayerNorm(dim, eps=eps)
        self.attn = Attention(dim, num_heads, qkv_bias=True)
        self.ls1 = nn.Parameter(torch.full((dim,), float(layer_scale)))
        self.norm2 = nn.LayerNorm(dim, eps=eps)
        hidden = int(dim * mlp_ratio)
        self.mlp = nn.Sequential(nn.Linear(dim, hidden), nn.GELU(), nn.Linear(hidden, dim))
        self.ls2 = nn.Parameter(torch.full((dim,), float(layer_scale)))

    def forward(self, x: torch.Tensor, ctx: PosContext | None = None,
                attn_mask: torch.Tensor | None = None) -> torch.Tensor:  # (B, L, C)
        x = x + self.ls1 * self.attn(self.norm1(x), attn_mask=attn_mask, ctx=ctx)
        return x + self.ls2 * self.mlp(self.norm2(x))


class WindowedViT(nn.Module):
    """The windowed ViT (module docstring). ``forward(images, mask)`` -> ([(B, C, h, w)], mask).

    Args:
        embed_dim: the ViT's width.
        depth: its number of blocks.
        num_heads: its attention heads.
        patch_size: its patch side in pixels.
        num_windows: windows per side n (1: no windows).
        window_blocks: indices of the blocks attending within windows.
        out_indices: features after these many blocks (1 .. depth).
        cls_token: a class token (one copy per window), as DINOv2.
        table_grid: G of a learned (1, 1 + G*G, C) table, None for none.
        antialias: the table's resampling (RF-DETR True, LW-DETR False).
        out_norm: a LayerNorm on the features (DINOv2's ``layernorm``).
        encoding: a vispe rotary or bias encoding name for every block, or None.
        mask_aware: windows and table on each image's valid area (module docstring).
        mlp_ratio: the MLP's hidden width over ``embed_dim``.
        eps: the LayerNorms' epsilon.
        layer_scale: the layer scales' initial value.
        in_chans: image channels.
    """

    def __init__(self, *, embed_dim: int, depth: int, num_heads: int, patch_size: int, num_windows: int,
                 window_blocks: Sequence[int], out_indices: Sequence[int], mlp_ratio: float = 4.0,
                 cls_token: bool = False, table_grid: int | None = None, antialias: bool = True,
                 out_norm: bool = False, eps: float = 1e-6, layer_scale: float = 1.0,
                 encoding: str | None = None, mask_aware: bool = False, in_chans: int = 3) -> None:
        super().__init__()
        _checks.positive_int("depth", depth)
        self.patch_size = _checks.positive_int("patch_size", patch_size)
        self.num_windows = _checks.positive_int("num_windows", num_windows)
        bad = [i for i in window_blocks if not 0 <= i < depth]
        if bad:
            raise ValueError(f"window_blocks={list(window_blocks)}: expected block indices in [0, {depth})")
        bad = [k for k in out_indices if not 1 <= k <= depth]
        if bad or not out_indices:
            raise ValueError(f"out_indices={list(out_indices)}: expected one or more block counts in [1, {depth}]")
        self.out_indices = list(out_indices)
        self.embed_dim, self.antialias, self.mask_aware = embed_dim, antialias, mask_aware
        self.num_channels, self.stride = embed_dim, patch_size
        self.patch_embed = nn.Conv2d(in_chans, embed_dim, patch_size, patch_size)
        self.cls_token = nn.Parameter(torch.zeros(1, 1, embed_dim)) if cls_token else None
        self.pos_embed = (nn.Parameter(torch.zeros(1, 1 + table_grid * table_grid, embed_dim))
                          if table_grid is not None else None)
        blocks = [Block(embed_dim, num_heads, mlp_ratio, eps=eps, layer_scale=layer_scale,
                        window=i in set(window_blocks)) for i in range(depth)]
        self.blocks = nn.ModuleList(blocks)
        self.norm = nn.LayerNorm(embed_dim, eps=eps) if out_norm else None
        self.encoding = encoding
        if encoding is not None:
            for blk in blocks:
                blk.attn.set_pe(registry.build(encoding, num_heads=num_heads, head_dim=embed_dim // num_heads))
        if self.pos_embed is not None:
            nn.init.trunc_normal_(self.pos_embed, std=0.02)
        if self.cls_token is not None:
            nn.init.trunc_normal_(self.cls_token, std=0.02)

    def embed(self, images: torch.Tensor, valid: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor | None]:
        """(patch grid with its table (B, h, w, C), class tokens (B, 1, C) with their table row, or None)."""
        x = self.patch_embed(images).permute(0, 2, 3, 1)  # (B, h, w, C)
        grid = (x.shape[1], x.shape[2])
        if self.pos_embed is not None:
            if valid is None:
                x = x + resample_table(self.pos_embed, grid, antialias=self.antialias).to(x.dtype)
            else:
                x = x + table_for_valid(self.pos_embed, grid, valid, antialias=self.antialias).to(x.dtype)
        cls = None
        if self.cls_token is not None:
            cls = self.cls_token.expand(x.shape[0], -1, -1)  # (B, 1, C)
            if self.pos_embed is not None:
                cls = cls + self.pos_embed[:, :1]
        return x, cls

    def forward(self, images: torch.Tensor, mask: torch.Tensor | None = None
                ) -> tuple[list[torch.Tensor], torch.Tensor | None]:
        """``images`` (B, 3, H, W), ``mask`` (B, H, W) True = padding -> ([(B, C, h, w)] per out index,
        the mask at the patch grid (B, h, w) or None)."""
        B, _, H, Wd = images.shape
        p = self.patch_size
        if H % p or Wd % p:
            raise ValueError(f"images have size (H, W)=({H}, {Wd}): expected multiples of patch_size={p}")
        grid = (H // p, Wd // p)
        W.window_shape(grid, self.num_windows)
        small = None
        if mask is not None:
            small = F.interpolate(mask[:, None].float(), size=grid, mode="nearest")[:, 0].bool()  # (B, h, w)
        padded = self.mask_aware and small is not None and bool(small.any())
        valid = None
        if padded:
            assert small is not None
            valid = valid_extent(small, grid, device=images.device).long().expand(B, 2)  # (B, 2)
            bad = [tuple(v) for v in valid.tolist() if v[0] % self.num_windows or v[1] % self.num_windows]
            if bad:
                raise ValueError(f"valid patch grids {bad}: with mask_aware=True every image's valid grid must be "
                                 f"divisible by num_windows={self.num_windows} per side")
        x, cls = self.embed(images, valid)
        run = self._masked if padded else self._windowed
        feats = run(x, cls, small, valid)
        if self.norm is not None:
            feats = [self.norm(f) for f in feats]
        return [f.permute(0, 3, 1, 2) for f in feats], small

    def _windowed(self, x: torch.Tensor, cls: torch.Tensor | None, small: torch.Tensor | None,
                  valid: torch.Tensor | None) -> list[torch.Tensor]:
        """The fast path: window blocks on (B*n*n) rectangles, global blocks on the whole grid."""
        B, h, w, C = x.shape
        n = self.num_windows
        wh, ww = W.window_shape((h, w), n)
        P = 0 if cls is None else 1
        cls_w = None if cls is None else cls.expand(B, n * n, C)  # (B, n*n, C): one copy per window
        win_ctx = PosContext(shape=(wh, ww), num_prefix_tokens=P)
        glob_ctx = PosContext(shape=(h, w), num_prefix_tokens=P * n * n)
        feats = []
        for i, blk in enumerate(self.blocks):
            if blk.window:
                t = W.partition(x, n)  # (B*n*n, wh*ww, C)
                if cls_w is not None:
                    t = torch.cat([cls_w.reshape(B * n * n, 1, C), t], 1)
                t = blk(t, win_ctx)
                if cls_w is not None:
                    cls_w = t[:, :1].reshape(B, n * n, C)
                x = W.unpartition(t[:, P:], n, (h, w))  # (B, h, w, C)
            else:
                t = x.reshape(B, h * w, C)
                if cls_w is not None:
                    t = torch.cat([cls_w, t], 1)  # (B, n*n + h*w, C)
                t = blk(t, glob_ctx)
                if cls_w is not None:
                    cls_w = t[:, :n * n]
                x = t[:, P * n * n:].reshape(B, h, w, C)
            if i + 1 in self.out_indices:
                feats.append(x)
        return feats

    def _masked(self, x: torch.Tensor, cls: torch.Tensor | None, small: torch.Tensor | None,
                valid: torch.Tensor | None) -> list[torch.Tensor]:
        """The mask-aware path: one sequence per image, windows and padding as attention masks."""
        if valid is None:
            raise ValueError("the mask-aware path needs each image's valid grid: got valid=None")
        B, h, w, C = x.shape
        n = self.num_windows
        ids = W.window_ids(valid, (h, w), n).reshape(B, h * w)  # (B, h*w), -1 on padding
        P = 0 if cls is None else n * n
        if cls is not None:
            ids = torch.cat([torch.arange(P, device=x.device).expand(B, P), ids], 1)  # (B, P + h*w)
        L = ids.shape[1]
        self_only = (ids < 0)[:, :, None] & torch.eye(L, dtype=torch.bool, device=x.device)  # padded cells: themselves
        valid_k = (ids >= 0)[:, None, :]  # (B, 1, L)
        win_mask = ((ids[:, :, None] == ids[:, None, :]) & valid_k) | self_only  # (B, L, L) True = attend
        glob_mask = valid_k.expand(-1, L, -1) | self_only  # (B, L, L)
        ctx = PosContext(shape=(h, w), num_prefix_tokens=P, mask=small if self.encoding is not None else None)
        t = x.reshape(B, h * w, C)
        if cls is not None:
            t = torch.cat([cls.expand(B, P, C), t], 1)  # (B, P + h*w, C)
        feats = []
        for i, blk in enumerate(self.blocks):
            t = blk(t, ctx, (win_mask if blk.window else glob_mask)[:, None])
            if i + 1 in self.out_indices:
                feats.append(t[:, P:].reshape(B, h, w, C))
        return feats
