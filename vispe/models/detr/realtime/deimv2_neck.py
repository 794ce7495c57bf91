"""DEIMv2's cross-scale fusion (Huang et al., 2025, "Real-Time Object Detection Meets DINOv3"; transformers'
``Deimv2HybridEncoder``): D-FINE's (``vispe.models.detr.realtime.dfine_neck``) with other blocks and a sum.

* the two maps meeting at a level are summed, not concatenated (``encoder_fuse_op="sum"``), so every
  block takes ``dim`` channels;
* ``fpn_blocks`` / ``pan_blocks``: ``RepNCSPELAN5``: ``conv1`` (1x1, d -> 2d) split in halves ``a, b``;
  ``b1 = CSP(b)``, ``b2 = CSP(b1)`` (no convolutions between them, unlike D-FINE's ``RepNCSPELAN4``);
  ``conv2(cat[a, b, b1, b2])`` (1x1 -> d);
* the CSP layer: one 1x1 ``conv1`` split into a residual half and a RepVGG half, then
  ``conv2(residual + RepVGG^n(half))``, ``conv2`` a 3x3 conv (``trailing_conv``, HGNetV2 variants) or none
  (DINOv3 variants);
* ``lateral_convs`` and ``downsample_convs`` (``SCDown``) as D-FINE's. Parameter names transformers'.

The maps are made contiguous first, as transformers' AIFI does with its output: AIFI's output here is a
view with channels-last strides, for which torch's CPU convolution takes another kernel and rounds
otherwise (8.9e-6 after the fusion on equal inputs in a training forward; 0.0 contiguous).
"""
from __future__ import annotations

import torch
from torch import nn

from vispe.models.detr.realtime.ccfm import CCFM, ConvNorm, RepVggBlock
from vispe.models.detr.realtime.dfine_neck import SCDown


class SplitCSPLayer(nn.Module):
    def __init__(self, cin: int, cout: int, num_blocks: int = 3, act: str = "silu", eps: float = 1e-5,
                 trailing_conv: bool = True) -> None:
        super().__init__()
        self.conv1 = ConvNorm(cin, 2 * cout, 1, 1, act=act, eps=eps)
        self.bottlenecks = nn.ModuleList(RepVggBlock(cout, act, eps) for _ in range(num_blocks))
        self.conv2 = ConvNorm(cout, cout, 3, 1, act=act, eps=eps) if trailing_conv else nn.Identity()

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # (B, cin, h, w) -> (B, cout, h, w)
        residual, y = self.conv1(x).chunk(2, 1)
        for block in self.bottlenecks:
            y = block(y)
        return self.conv2(residual + y)


class RepNCSPELAN5(nn.Module):
    def __init__(self, dim: int, expansion: float = 1.0, num_blocks: int = 3, act: str = "silu", eps: float = 1e-5,
                 trailing_conv: bool = True) -> None:
        super().__init__()
        c = round(expansion * dim // 2)
        self.conv1 = ConvNorm(dim, 2 * dim, 1, 1, act=act, eps=eps)
        self.csp_rep1 = SplitCSPLayer(dim, c, num_blocks, act, eps, trailing_conv)
        self.csp_rep2 = SplitCSPLayer(c, c, num_blocks, act, eps, trailing_conv)
        self.conv2 = ConvNorm(2 * dim + 2 * c, dim, 1, 1, act=act, eps=eps)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # (B, d, h, w) -> (B, d, h, w)
        a, b = self.conv1(x).chunk(2, 1)
        b1 = self.csp_rep1(b)
        b2 = self.csp_rep2(b1)
        return self.conv2(torch.cat([a, b, b1, b2], 1))


class DEIMv2CCFM(CCFM):
    """RT-DETR's fusion with DEIMv2's blocks and sums (module docstring); ``num_blocks`` = round(3 * depth_mult)."""

    def __init__(self, dim: int = 256, num_levels: int = 3, *, num_blocks: int = 3, expansion: float = 1.0,
                 act: str | None = "silu", eps: float = 1e-5, trailing_conv: bool = True) -> None:
        super().__init__(dim, num_levels, num_blocks=0, act=act, eps=eps)
        n = num_levels - 1
        a = act or "silu"
        self.lateral_convs = nn.ModuleList(ConvNorm(dim, dim, 1, 1, eps=eps) for _ in range(n))
        self.fpn_blocks = nn.ModuleList(RepNCSPELAN5(dim, expansion, num_blocks, a, eps, trailing_conv) for _ in range(n))
        self.downsample_convs = nn.ModuleList(SCDown(dim, eps) for _ in range(n))
        self.pan_blocks = nn.ModuleList(RepNCSPELAN5(dim, expansion, num_blocks, a, eps, trailing_conv) for _ in range(n))

    def forward(self, maps: list[torch.Tensor]) -> list[torch.Tensor]:
        """Maps finest first [(B, dim, h_l, w_l)], made contiguous (module docstring) -> fused maps."""
        return super().forward([m.contiguous() for m in maps])

    def fuse(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:  # (B, dim, h, w)
        return a + b
