"""D-FINE's cross-scale fusion (Peng et al., ICLR 2025, "D-FINE"; transformers' ``DFineHybridEncoder``).

The CCFM of RT-DETR (``vispe.models.detr.realtime.ccfm``, same forward: top-down, then bottom-up) with
other blocks, transformers' names:

* ``lateral_convs``: 1x1 conv + BN without activation;
* ``fpn_blocks`` / ``pan_blocks``: ``RepNCSPELAN4`` (GELAN): ``conv1`` (1x1, 2d -> 2d) split in two halves
  ``a, b``; ``b1 = conv2(CSP(b))``, ``b2 = conv3(CSP(b1))`` (3x3 convs, c = round(expansion * d // 2)
  channels); ``conv4(cat[a, b, b1, b2])`` (1x1 -> d), SiLU throughout;
* ``downsample_convs``: ``SCDown``, a 1x1 conv + BN then a depthwise 3x3 stride-2 conv + BN, no activation.
"""
from __future__ import annotations

import torch
from torch import nn

from vispe.models.detr.realtime.ccfm import CCFM, ConvNorm, CSPRepLayer


class RepNCSPELAN4(nn.Module):
    def __init__(self, dim: int, expansion: float = 1.0, num_blocks: int = 3, act: str = "silu", eps: float = 1e-5) -> None:
        super().__init__()
        c4 = round(expansion * dim // 2)
        self.split = dim  # conv1's output is split in two halves of ``dim``
        self.conv1 = ConvNorm(2 * dim, 2 * dim, 1, 1, act=act, eps=eps)
        self.csp_rep1 = CSPRepLayer(dim, c4, num_blocks, 1.0, act, eps)
        self.conv2 = ConvNorm(c4, c4, 3, 1, act=act, eps=eps)
        self.csp_rep2 = CSPRepLayer(c4, c4, num_blocks, 1.0, act, eps)
        self.conv3 = ConvNorm(c4, c4, 3, 1, act=act, eps=eps)
        self.conv4 = ConvNorm(2 * dim + 2 * c4, dim, 1, 1, act=act, eps=eps)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # (B, 2d, h, w) -> (B, d, h, w)
        parts = list(self.conv1(x).split((self.split, self.split), 1))
        b1 = self.conv2(self.csp_rep1(parts[-1]))
        b2 = self.conv3(self.csp_rep2(b1))
        return self.conv4(torch.cat([*parts, b1, b2], 1))


class SCDown(nn.Module):
    def __init__(self, dim: int, eps: float = 1e-5) -> None:
        super().__init__()
        self.conv1 = ConvNorm(dim, dim, 1, 1, eps=eps)
        self.conv2 = ConvNorm(dim, dim, 3, 2, eps=eps, groups=dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # (B, d, h, w) -> (B, d, h/2, w/2)
        return self.conv2(self.conv1(x))


class DFineCCFM(CCFM):
    """RT-DETR's fusion with D-FINE's blocks (module docstring); ``num_blocks`` = round(3 * depth_mult)."""

    def __init__(self, dim: int = 256, num_levels: int = 3, *, num_blocks: int = 3, expansion: float = 1.0,
                 act: str | None = "silu", eps: float = 1e-5) -> None:
        super().__init__(dim, num_levels, num_blocks=0, act=act, eps=eps)
        n = num_levels - 1
        a = act or "silu"
        self.lateral_convs = nn.ModuleList(ConvNorm(dim, dim, 1, 1, eps=eps) for _ in range(n))
        self.fpn_blocks = nn.ModuleList(RepNCSPELAN4(dim, expansion, num_blocks, a, eps) for _ in range(n))
        self.downsample_convs = nn.ModuleList(SCDown(dim, eps) for _ in range(n))
        self.pan_blocks = nn.ModuleList(RepNCSPELAN4(dim, expansion, num_blocks, a, eps) for _ in range(n))
