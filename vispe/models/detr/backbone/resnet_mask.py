"""Mask-aware ResNet: the padded area zeroed after every normalisation and the stem's max pool.

DETR's ResNet lets padding leak: a convolution near the valid border reads padded pixels, which
after (frozen) batch norm carry its bias, so an image padded into a larger batch gets other
features than alone (transformers#23218). Zeroing the padded cells after every normalisation
(stem ``bn1``, each block's ``bn1..bn3`` and ``downsample`` norm) makes every later convolution
read zeros there, which is what its own zero padding gives the image alone; residual sums and
ReLU keep zeros. The stem's max pool needs it too: its window (3, stride 2, padding 1) at the first
padded cell reaches back into the valid area and carries a valid maximum into the padding, which
layer1's convolutions would read (the image alone has no such cell); after it is zeroed the valid
maxima are the same (values >= 0 after ReLU, so zeros never win over the image alone's -inf pad).
The mask is brought to each layer's grid by the detector's rule (``resize_mask``, nearest). Exact
when the valid size is a multiple of the stride and the padding is at the bottom/right.
"""
from __future__ import annotations

import torch
from torch import nn
from torchvision.ops.misc import FrozenBatchNorm2d

from vispe.coords import resize_mask


class MaskZeroing:
    """Forward hooks on every ``FrozenBatchNorm2d`` and ``MaxPool2d`` of ``net`` that zero the padded cells
    of their output."""

    def __init__(self, net: nn.Module) -> None:
        self.mask: torch.Tensor | None = None  # (B, H, W) pixel mask during a forward
        self.handles = [m.register_forward_hook(self._hook) for m in net.modules() if isinstance(m, (FrozenBatchNorm2d, nn.MaxPool2d))]

    def _hook(self, module, inputs, out: torch.Tensor) -> torch.Tensor | None:
        if self.mask is None:
            return None
        m = resize_mask(self.mask, out.shape[-2:])  # (B, h, w)
        return out * (~m)[:, None].to(out.dtype)  # (B, C, h, w)
