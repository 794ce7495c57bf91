"""DEIMv2's ``lite`` encoder (Atto / Femto / Pico; Huang et al., 2025; transformers' ``Deimv2LiteEncoder``), the
neck of vispe's ``DEIMv2`` with ``deimv2={"encoder": "lite"}``: two backbone levels, no attention.

    maps (B, c_l, h_l, w_l), l = 0 (stride s), 1 (stride 2s) -> ``input_proj`` (1x1 conv + BN) -> p0, p1 (dim)
    o0 = fpn_block(p0 + up2(p1))                               (nearest upsampling)
    o1 = pan_block(p1 + down_conv2(avgpool3x3/2(o0)))          -> [o0, o1]

``fpn_block`` / ``pan_block``: DEIMv2's ``RepNCSPELAN5`` (``deimv2_neck``). ``down_conv1`` and ``bi_fusion_conv``
(a global-average-pool fusion of a third, coarser map) are parameters of the original and of transformers 5.23,
whose forward computes that map and then uses no part of it (DEIMv2's ``LiteEncoder`` in
Intellindust-AI-Lab/DEIMv2 does the same): vispe keeps them, so checkpoints load one to one, and skips the
computation (their BatchNorm running statistics stay as loaded in training; no output depends on them).

There is no AIFI, so no position encoding here: ``set_encoding`` is refused with that reason; the padding mask
is not read (the convolutions see the padding, as in RT-DETR's CCFM).
"""
from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from vispe.models.detr.realtime.ccfm import ConvNorm
from vispe.models.detr.realtime.deimv2_neck import RepNCSPELAN5


class LiteEncoder(nn.Module):
    """Two levels -> two fused levels of ``dim`` channels (module docstring)."""

    def __init__(self, in_channels: Sequence[int], dim: int, *, num_blocks: int = 3, expansion: float = 1.0,
                 act: str = "silu", eps: float = 1e-5, trailing_conv: bool = True) -> None:
        super().__init__()
        self.in_channels = tuple(int(c) for c in in_channels)
        if len(self.in_channels) != 2:
            raise ValueError(f"in_channels={list(in_channels)}: DEIMv2's lite encoder fuses two backbone levels")
        self.input_proj = nn.ModuleList(ConvNorm(c, dim, 1, 1, eps=eps) for c in self.in_channels)
        self.down_conv1 = ConvNorm(dim, dim, 1, 1, act=act, eps=eps)  # unused by the outputs (module docstring)
        self.down_conv2 = ConvNorm(dim, dim, 1, 1, act=act, eps=eps)
        self.bi_fusion_conv = ConvNorm(dim, dim, 1, 1, act=act, eps=eps)  # unused by the outputs
        self.fpn_block = RepNCSPELAN5(dim, expansion, num_blocks, act, eps, trailing_conv)
        self.pan_block = RepNCSPELAN5(dim, expansion, num_blocks, act, eps, trailing_conv)

    def set_encoding(self, name: str, **kwargs: Any) -> None:
        raise ValueError(f"set_encoding({name!r}): DEIMv2's lite encoder has no attention, so no position encoding "
                         "to swap (the 'hybrid' encoder's AIFI has one)")

    def forward(self, maps: Sequence[torch.Tensor], mask: torch.Tensor | None = None) -> list[torch.Tensor]:
        """Backbone maps, finest first [(B, c_l, h_l, w_l)] -> [(B, dim, h_0, w_0), (B, dim, h_1, w_1)]."""
        if len(maps) != 2:
            raise ValueError(f"{len(maps)} backbone maps: DEIMv2's lite encoder takes 2")
        p0, p1 = (proj(m) for proj, m in zip(self.input_proj, maps))  # (B, dim, h_l, w_l)
        o0 = self.fpn_block(p0 + F.interpolate(p1, scale_factor=2.0, mode="nearest"))  # (B, dim, h_0, w_0)
        down = self.down_conv2(F.avg_pool2d(o0, kernel_size=3, stride=2, padding=1))  # (B, dim, h_1, w_1)
        return [o0, self.pan_block(p1 + down)]
