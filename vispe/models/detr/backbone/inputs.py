"""The detectors' input side, shared by the single-scale and the multi-scale detector: checked images
and mask, the backbone outside any compiled graph, the image channels a backbone takes."""
from __future__ import annotations

import torch
from torch import nn

from vispe import _checks


@torch.compiler.disable
def eager_backbone(backbone, images, mask):
    """The backbone, outside any torch.compile graph. Inductor (torch 2.14) fails on the stride-2
    convolutions of a batch whose size changed (symbolic H, W): "cannot determine truth value of
    Relational: 1 < (((s54 - 1)//2)) + 1" while ordering strides, and hints on the sizes
    (torch._check) do not help; detection batches change size at every step. The transformer,
    where the encodings are, is still compiled (bench/compile_step.py, results/bench_compile.md)."""
    return backbone(images, mask)


def image_channels(backbone: nn.Module) -> int | None:
    """The channels the backbone's first convolution takes (ResNets, small_cnn, ViT patch embedding)."""
    conv = next((m for m in backbone.modules() if isinstance(m, nn.Conv2d)), None)
    return conv.in_channels if conv is not None else None


def check_inputs(images, mask, in_chans: int | None = None, check_finite: bool = False) -> torch.Tensor:
    """Checked images and mask (the rules of every vispe model, ``vispe._checks.images``); a missing
    mask means no padding.  # mask (B, H, W) bool"""
    _checks.images("images", images, mask, in_chans=in_chans, check_finite=check_finite)
    if mask is None:
        B, _, H, W = images.shape
        return torch.zeros(B, H, W, dtype=torch.bool, device=images.device)
    return mask.to(images.device)
