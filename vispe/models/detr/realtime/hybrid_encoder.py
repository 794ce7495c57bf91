"""RT-DETR's hybrid encoder, the detector's neck: per-level projection, AIFI on the top level, CCFM.

    backbone maps [(B, c_l, h_l, w_l)] -> input_proj (1x1 conv + BN) -> (B, dim, h_l, w_l)
    -> AIFI (``vispe.models.detr.realtime.aifi``) on the levels in ``aifi_levels`` (RT-DETR: the last)
    -> CCFM (``vispe.models.detr.realtime.ccfm``; D-FINE's blocks with ``fusion="dfine"``,
       ``vispe.models.detr.realtime.dfine_neck``) -> fused maps, finest first

transformers keeps the projections in ``RTDetrModel.encoder_input_proj`` and the rest in
``RTDetrHybridEncoder``; here they are one module (``input_proj``, ``aifi``, ``ccfm``).
"""
from __future__ import annotations

from collections.abc import Sequence
from typing import Any, cast

import torch
from torch import nn

from vispe import _checks
from vispe.coords import resize_mask
from vispe.models.detr.realtime.aifi import AIFI, SINCOS
from vispe.models.detr.realtime.ccfm import CCFM
from vispe.models.detr.realtime.dfine_neck import DFineCCFM


class HybridEncoder(nn.Module):
    def __init__(self, in_channels: Sequence[int], dim: int = 256, *, aifi_levels: Sequence[int] = (2,),
                 num_heads: int = 8, ffn_dim: int = 1024, aifi_layers: int = 1, dropout: float = 0.0,
                 aifi_activation: str = "gelu", ccfm_activation: str | None = "silu", expansion: float = 1.0,
                 csp_blocks: int = 3, eps: float = 1e-5, pe: str = SINCOS, pe_kwargs: dict[str, Any] | None = None,
                 fusion: str = "rtdetr") -> None:
        super().__init__()
        self.in_channels = tuple(int(c) for c in in_channels)
        n = len(self.in_channels)
        bad = [i for i in aifi_levels if not 0 <= i < n]
        if bad:
            raise ValueError(f"aifi_levels={tuple(aifi_levels)}: expected level indices in [0, {n})")
        self.aifi_levels = tuple(aifi_levels)
        self.input_proj = nn.ModuleList(
            nn.Sequential(nn.Conv2d(c, dim, 1, bias=False), nn.BatchNorm2d(dim)) for c in self.in_channels)  # eps 1e-5 as transformers
        self.aifi = nn.ModuleList(AIFI(dim, num_heads, ffn_dim, aifi_layers, dropout=dropout, activation=aifi_activation,
                                       pe=pe, pe_kwargs=pe_kwargs) for _ in self.aifi_levels)
        fuse = {"rtdetr": CCFM, "dfine": DFineCCFM}[_checks.choice("fusion", fusion, ("rtdetr", "dfine"))]
        self.ccfm = fuse(dim, n, num_blocks=csp_blocks, expansion=expansion, act=ccfm_activation, eps=eps)

    def set_encoding(self, name: str, **kwargs: Any) -> None:
        """Swap every AIFI's encoding (``AIFI.set_encoding``)."""
        for a in self.aifi:
            cast(AIFI, a).set_encoding(name, **kwargs)

    def forward(self, maps: Sequence[torch.Tensor], mask: torch.Tensor | None = None) -> list[torch.Tensor]:
        """Backbone maps, finest first, and the image's padding ``mask`` (B, H, W) or None -> fused maps."""
        if len(maps) != len(self.input_proj):
            raise ValueError(f"{len(maps)} backbone maps: this encoder was built for {len(self.input_proj)}")
        feats = [proj(m) for proj, m in zip(self.input_proj, maps)]  # [(B, dim, h_l, w_l)]
        for aifi, level in zip(self.aifi, self.aifi_levels):
            m = None if mask is None else resize_mask(mask, tuple(feats[level].shape[-2:]))  # (B, h, w)
            feats[level] = aifi(feats[level], m)
        return self.ccfm(feats)
