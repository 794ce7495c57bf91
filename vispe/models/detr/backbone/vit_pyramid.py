"""ViTDet's simple feature pyramid (Li et al., ECCV 2022) on a vispe ViT backbone: several levels from
the one patch map, for multi-scale (deformable) detectors.

The ViT (``ViTBackbone``, any vispe encoding inside) gives one map at stride p (its patch size).
Each level resamples it by a scale and projects it, as ViTDet's ``SimpleFeaturePyramid``::

    scale 2   ConvTranspose2d(C, C/2, 2, stride 2)            stride p/2
    scale 1   identity                                         stride p
    scale 1/2 MaxPool2d(2)                                     stride 2p
    then      Conv 1x1 -> LayerNorm2d -> Conv 3x3 -> LayerNorm2d   (``out_channels``, no conv bias)

(ViTDet's scale 4 is two transposed convs with a LayerNorm and GELU between; ``scales`` takes 4.0
too.) Mask-aware: every level's mask is the pixel mask resized to it (nearest), and padded cells
are zeroed after every op, so the 3x3 conv reads zeros beyond the valid area as an image alone
does; the transposed conv (kernel = stride) and the 2x2 pool (valid size a multiple of 2p) never
mix valid and padded cells. Interface as ``vispe.models.detr.neck.multiscale``: ``num_channels``,
``strides``, ``forward(images, mask) -> [(features, mask)]``.
"""
from __future__ import annotations

import torch
from timm.layers import LayerNorm2d
from torch import nn

from vispe import _checks
from vispe.coords import resize_mask
from vispe.models.detr.backbone.vit import ViTBackbone

SCALES = (4.0, 2.0, 1.0, 0.5)


class SimpleFeaturePyramid(nn.Module):
    """Levels at ``scales`` (fine to coarse, from ``SCALES``) of a ``ViTBackbone``'s map (module docstring).

    Args:
        backbone: a ``ViTBackbone`` (square patches).
        scales: the levels' scales relative to the patch map (default 2, 1, 1/2: strides p/2, p, 2p).
        out_channels: channels of every level (default: the ViT's width).
    """

    def __init__(self, backbone: ViTBackbone, scales=(2.0, 1.0, 0.5), out_channels: int | None = None) -> None:
        super().__init__()
        if not isinstance(backbone, ViTBackbone):
            raise ValueError(f"backbone is a {type(backbone).__name__}: expected a ViTBackbone")
        if not isinstance(backbone.stride, int):
            raise ValueError(f"backbone patch size {backbone.patch_size}: expected square patches")
        scales = tuple(float(s) for s in scales)
        if not scales or any(s not in SCALES for s in scales) or list(scales) != sorted(set(scales), reverse=True):
            raise ValueError(f"scales={scales!r}: expected decreasing values among {SCALES}")
        C = backbone.num_channels
        out = C if out_channels is None else _checks.positive_int("out_channels", out_channels)
        self.backbone, self.scales = backbone, scales
        self.stages = nn.ModuleList(_stage(C, out, s) for s in scales)
        self.num_channels = [out] * len(scales)
        self.strides = [int(backbone.stride / s) for s in scales]
        for p, s in zip(self.strides, scales):
            if p * s != backbone.stride:
                raise ValueError(f"scale {s} of patch size {backbone.stride}: expected a whole stride")

    def forward(self, images: torch.Tensor, mask: torch.Tensor) -> list[tuple[torch.Tensor, torch.Tensor]]:
        x, _ = self.backbone(images, mask)  # (B, C, h, w), padded cells zeroed
        out = []
        for stage, stride in zip(self.stages, self.strides):
            H, W = images.shape[-2:]
            m = resize_mask(mask, (H // stride, W // stride))  # (B, h_l, w_l)
            keep = (~m)[:, None].to(x.dtype)  # (B, 1, h_l, w_l)
            y = x
            for op in stage:
                y = op(y)
                if y.shape[-2:] == m.shape[-2:]:
                    y = y * keep  # padded cells back to zero after every op at this level's size
                else:
                    y = y * (~resize_mask(mask, y.shape[-2:]))[:, None].to(y.dtype)
            out.append((y, m))
        return out


def _stage(C: int, out: int, scale: float) -> nn.Sequential:
    if scale == 4.0:
        ops, c = [nn.ConvTranspose2d(C, C // 2, 2, stride=2), LayerNorm2d(C // 2), nn.GELU(),
                  nn.ConvTranspose2d(C // 2, C // 4, 2, stride=2)], C // 4
    elif scale == 2.0:
        ops, c = [nn.ConvTranspose2d(C, C // 2, 2, stride=2)], C // 2
    elif scale == 1.0:
        ops, c = [], C
    else:
        ops, c = [nn.MaxPool2d(2, stride=2)], C
    return nn.Sequential(*ops, nn.Conv2d(c, out, 1, bias=False), LayerNorm2d(out),
                         nn.Conv2d(out, out, 3, padding=1, bias=False), LayerNorm2d(out))
