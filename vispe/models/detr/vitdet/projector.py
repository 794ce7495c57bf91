"""The multi-scale projector of LW-DETR and RF-DETR: the ViT's feature grids resampled to each scale and
fused by a C2f block (YOLOv8's "CSP bottleneck with 2 convolutions", RT-DETR's CSP layer's cousin).

Per scale factor s (LW-DETR's ``projector_scale_factors``, e.g. (2.0, 0.5) or (1.0,); RF-DETR: 1.0)::

    every ViT grid (B, C, h, w) -> sample_s: s = 2: [1x1 ConvNorm to C/2 if C > 512] + 2x2 transposed conv
                                             s = 1: identity;  s = 0.5: 3x3 stride-2 ConvNorm
      -> concat over the grids -> C2f: 1x1 ConvNorm to 2e, split in two halves (a, b), b through
         ``num_blocks`` pairs of 3x3 ConvNorms, each output kept -> concat [a, b, b1, .., bk]
         -> 1x1 ConvNorm to d_model -> LayerNorm over channels                    (B, d, s h, s w)

ConvNorm = conv (no bias) + BatchNorm (LW-DETR) or a LayerNorm over channels (RF-DETR) + activation
(SiLU by default). Parameter names follow transformers' ``LwDetrMultiScaleProjector`` (``scale_layers.{i}
.sampling_layers.{j}.layers.{k}``, ``.projector_layer.{conv1, conv2, bottlenecks.{b}.{conv1, conv2}}``,
``.layer_norm``) so its state_dict loads by name.

``mask`` (B, h, w) True = padding, with ``mask_aware``: padded cells are zeroed after every ConvNorm,
so a 3x3 convolution at the valid area's border reads zeros as it does at an image's own border (an
image alone equals it padded where its valid size is even, for the stride-2 scale).
"""
from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

SCALES = (2.0, 1.0, 0.5)
ACTIVATIONS = {"silu": nn.SiLU, "relu": nn.ReLU, "gelu": nn.GELU}


class ChannelNorm(nn.LayerNorm):
    """LayerNorm over the channels of (B, C, h, w)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # (B, C, h, w)
        return super().forward(x.permute(0, 2, 3, 1)).permute(0, 3, 1, 2)


def _zero(x: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
    if mask is None:
        return x
    m = F.interpolate(mask[:, None].float(), size=x.shape[-2:], mode="nearest").bool()  # (B, 1, h, w)
    return x.masked_fill(m, 0.0)


class ConvNorm(nn.Module):
    def __init__(self, cin: int, cout: int, k: int, stride: int = 1, *, norm: str, act: str | None,
                 eps: float) -> None:
        super().__init__()
        self.conv = nn.Conv2d(cin, cout, k, stride, padding=k // 2, bias=False)
        self.norm = nn.BatchNorm2d(cout, eps=eps) if norm == "batch" else ChannelNorm(cout, eps=eps)
        self.act = nn.Identity() if act is None else ACTIVATIONS[act]()

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
        return _zero(self.act(self.norm(self.conv(x))), mask)


class _Pair(nn.Module):
    def __init__(self, c: int, **kw: Any) -> None:
        super().__init__()
        self.conv1, self.conv2 = ConvNorm(c, c, 3, **kw), ConvNorm(c, c, 3, **kw)

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
        return self.conv2(self.conv1(x, mask), mask)


class C2f(nn.Module):
    """The C2f block (module docstring): ``cin`` -> ``cout`` channels, hidden ``e = cout * expansion``."""

    def __init__(self, cin: int, cout: int, num_blocks: int, expansion: float, **kw: Any) -> None:
        super().__init__()
        self.hidden = int(cout * expansion)
        self.conv1 = ConvNorm(cin, 2 * self.hidden, 1, **kw)
        self.bottlenecks = nn.ModuleList(_Pair(self.hidden, **kw) for _ in range(num_blocks))
        self.conv2 = ConvNorm((2 + num_blocks) * self.hidden, cout, 1, **kw)

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
        parts = list(self.conv1(x, mask).split(self.hidden, 1))
        y = parts[-1]
        for b in self.bottlenecks:
            y = b(y, mask)
            parts.append(y)
        return self.conv2(torch.cat(parts, 1), mask)


class _Sampling(nn.Module):
    def __init__(self, c: int, scale: float, *, eps: float, norm: str) -> None:
        super().__init__()
        layers: list[nn.Module] = []
        if scale == 2.0:
            if c > 512:
                layers += [ConvNorm(c, c // 2, 1, norm=norm, act="relu", eps=eps), nn.ConvTranspose2d(c // 2, c // 4, 2, 2)]
            else:
                layers.append(nn.ConvTranspose2d(c, c // 2, 2, 2))
        elif scale == 0.5:
            layers.append(ConvNorm(c, c, 3, 2, norm=norm, act="relu", eps=eps))
        self.layers = nn.ModuleList(layers)
        self.out_channels = c // 4 if scale == 2.0 and c > 512 else c // 2 if scale == 2.0 else c

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
        for layer in self.layers:
            x = layer(x, mask) if isinstance(layer, ConvNorm) else _zero(layer(x), mask)
        return x


class ScaleProjector(nn.Module):
    def __init__(self, in_channels: Sequence[int], d_model: int, scale: float, *, num_blocks: int,
                 expansion: float, act: str, norm: str, eps: float, sampling: bool) -> None:
        super().__init__()
        samplers = [_Sampling(c, scale, eps=eps, norm=norm) for c in in_channels] if sampling else None
        self.sampling_layers = nn.ModuleList(samplers) if samplers is not None else None
        cin = sum(s.out_channels for s in samplers) if samplers is not None else sum(in_channels)
        self.projector_layer = C2f(cin, d_model, num_blocks, expansion, norm=norm, act=act, eps=eps)
        self.layer_norm = ChannelNorm(d_model, eps=1e-6)

    def forward(self, feats: Sequence[torch.Tensor], mask: torch.Tensor | None = None) -> torch.Tensor:
        if self.sampling_layers is not None:
            feats = [s(f, mask) for s, f in zip(self.sampling_layers, feats)]
        return _zero(self.layer_norm(self.projector_layer(torch.cat(list(feats), 1), mask)), mask)


class MultiScaleProjector(nn.Module):
    """One ``ScaleProjector`` per scale factor (``scale_layers.{i}``); RF-DETR's single one without
    sampling layers is ``sampling=False`` with ``scales=(1.0,)``.

    ``forward(feats, mask)``: the ViT's grids [(B, C, h, w)] -> [(B, d, s h, s w)] per scale."""

    def __init__(self, in_channels: Sequence[int], d_model: int, scales: Sequence[float] = (1.0,), *,
                 num_blocks: int = 3, expansion: float = 0.5, act: str = "silu", norm: str = "batch",
                 eps: float = 1e-5, sampling: bool = True, mask_aware: bool = False) -> None:
        super().__init__()
        bad = [s for s in scales if s not in SCALES]
        if bad or not scales:
            raise ValueError(f"scales={list(scales)}: expected one or more of {SCALES}")
        if norm not in ("batch", "layer"):
            raise ValueError(f"norm={norm!r}: expected 'batch' (LW-DETR) or 'layer' (RF-DETR)")
        if act not in ACTIVATIONS:
            raise ValueError(f"act={act!r}: expected one of {sorted(ACTIVATIONS)}")
        self.scales, self.mask_aware = list(scales), mask_aware
        self.scale_layers = nn.ModuleList(ScaleProjector(in_channels, d_model, s, num_blocks=num_blocks,
                                                         expansion=expansion, act=act, norm=norm, eps=eps,
                                                         sampling=sampling) for s in scales)

    def forward(self, feats: Sequence[torch.Tensor], mask: torch.Tensor | None = None) -> list[torch.Tensor]:
        m = mask if self.mask_aware else None
        return [layer(feats, m) for layer in self.scale_layers]
