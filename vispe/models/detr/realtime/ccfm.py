"""CCFM, RT-DETR's CNN-based cross-scale feature fusion: a top-down FPN and a bottom-up PAN of CSP blocks.

Parameter names are transformers' ``RTDetrHybridEncoder`` ones (``lateral_convs``, ``fpn_blocks``,
``downsample_convs``, ``pan_blocks``; ``ConvNorm`` = ``conv`` + ``norm``), so its weights load one
to one. For levels P3..P5 (finest first), all with ``dim`` channels::

    top-down:   t5 = lateral(P5);  t4 = CSP([up2(t5), P4]); then t4 = lateral(t4); t3 = CSP([up2(t4), P3])
    bottom-up:  o3 = t3;  o4 = CSP([down(o3), t4]);  o5 = CSP([down(o4), t5])

``CSP`` (``CSPRepLayer``): ``conv3(RepVGG^n(conv1(x)) + conv2(x))``, a RepVGG block being
``act(BN(conv3x3(x)) + BN(conv1x1(x)))`` (the training-time form; not re-parameterised). Position
enters nowhere here but through the zero padding of the convolutions.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

CONV_ACTIVATIONS = {"silu": nn.SiLU, "relu": nn.ReLU, "gelu": nn.GELU, "leaky_relu": nn.LeakyReLU, "hardswish": nn.Hardswish}


def activation(name: str | None) -> nn.Module:
    if name is None:
        return nn.Identity()
    if name not in CONV_ACTIVATIONS:
        raise ValueError(f"activation={name!r}: expected one of {', '.join(map(repr, CONV_ACTIVATIONS))} or None")
    return CONV_ACTIVATIONS[name]()


class ConvNorm(nn.Module):
    """Conv (no bias) + BatchNorm + activation."""

    def __init__(self, cin: int, cout: int, kernel: int, stride: int = 1, padding: int | None = None,
                 act: str | None = None, eps: float = 1e-5, groups: int = 1) -> None:
        super().__init__()
        pad = (kernel - 1) // 2 if padding is None else padding
        self.conv = nn.Conv2d(cin, cout, kernel, stride, padding=pad, bias=False, groups=groups)
        self.norm = nn.BatchNorm2d(cout, eps=eps)
        self.act = activation(act)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # (B, cout, h', w')
        return self.act(self.norm(self.conv(x)))


class RepVggBlock(nn.Module):
    def __init__(self, dim: int, act: str | None, eps: float = 1e-5) -> None:
        super().__init__()
        self.conv1 = ConvNorm(dim, dim, 3, 1, padding=1, eps=eps)
        self.conv2 = ConvNorm(dim, dim, 1, 1, padding=0, eps=eps)
        self.act = activation(act)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # (B, dim, h, w)
        return self.act(self.conv1(x) + self.conv2(x))


class CSPRepLayer(nn.Module):
    def __init__(self, cin: int, cout: int, num_blocks: int = 3, expansion: float = 1.0, act: str | None = "silu",
                 eps: float = 1e-5) -> None:
        super().__init__()
        hidden = int(cout * expansion)
        self.conv1 = ConvNorm(cin, hidden, 1, 1, act=act, eps=eps)
        self.conv2 = ConvNorm(cin, hidden, 1, 1, act=act, eps=eps)
        self.bottlenecks = nn.Sequential(*[RepVggBlock(hidden, act, eps) for _ in range(num_blocks)])
        self.conv3 = ConvNorm(hidden, cout, 1, 1, act=act, eps=eps) if hidden != cout else nn.Identity()

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # (B, cout, h, w)
        return self.conv3(self.bottlenecks(self.conv1(x)) + self.conv2(x))


class CCFM(nn.Module):
    """Top-down then bottom-up fusion of ``num_levels`` maps of ``dim`` channels (module docstring)."""

    def __init__(self, dim: int = 256, num_levels: int = 3, *, num_blocks: int = 3, expansion: float = 1.0,
                 act: str | None = "silu", eps: float = 1e-5) -> None:
        super().__init__()
        if num_levels < 2:
            raise ValueError(f"num_levels={num_levels}: CCFM fuses at least 2 levels")
        n = num_levels - 1
        self.lateral_convs = nn.ModuleList(ConvNorm(dim, dim, 1, 1, act=act, eps=eps) for _ in range(n))
        self.fpn_blocks = nn.ModuleList(CSPRepLayer(2 * dim, dim, num_blocks, expansion, act, eps) for _ in range(n))
        self.downsample_convs = nn.ModuleList(ConvNorm(dim, dim, 3, 2, act=act, eps=eps) for _ in range(n))
        self.pan_blocks = nn.ModuleList(CSPRepLayer(2 * dim, dim, num_blocks, expansion, act, eps) for _ in range(n))

    def forward(self, maps: list[torch.Tensor]) -> list[torch.Tensor]:
        """Maps finest first [(B, dim, h_l, w_l)] -> fused maps, same shapes."""
        if len(maps) != len(self.fpn_blocks) + 1:
            raise ValueError(f"{len(maps)} maps: this CCFM fuses {len(self.fpn_blocks) + 1} levels")
        n = len(self.fpn_blocks)
        inner = [maps[-1]]
        for i, (lateral, block) in enumerate(zip(self.lateral_convs, self.fpn_blocks)):
            top = lateral(inner[-1])
            inner[-1] = top
            up = F.interpolate(top, scale_factor=2.0, mode="nearest")  # (B, dim, 2h, 2w)
            inner.append(block(self.fuse(up, maps[n - i - 1])))
        inner.reverse()  # finest first
        outs = [inner[0]]
        for i, (down, block) in enumerate(zip(self.downsample_convs, self.pan_blocks)):
            outs.append(block(self.fuse(down(outs[-1]), inner[i + 1])))
        return outs

    def fuse(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        """Two maps of one level -> a block's input: concatenated (RT-DETR, D-FINE; DEIMv2 sums).  # (B, 2 dim, h, w)"""
        return torch.cat([a, b], 1)
