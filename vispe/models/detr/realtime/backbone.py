"""RT-DETR's ResNet-vd backbone (PResNet, He et al.'s "bag of tricks" D variant) as a timm ``resnet*d``.

lyuwenyu's PResNet and transformers' ``RTDetrResNetBackbone`` (bottleneck layers) are timm's
ResNet with ``stem_type="deep"`` (three 3x3 convolutions, ``stem_width`` = half the stem's
output), ``avg_down=True`` (a stride-2 shortcut is 2x2 average pooling, ceil mode, then a 1x1
convolution) and the stride in the 3x3 convolution: ``resnet50d`` is R50-vd. Batch norm is
frozen (torchvision's ``FrozenBatchNorm2d``, eps 1e-5, as transformers' ``RTDetrFrozenBatchNorm2d``).
The outputs are the stages in ``out_indices`` (1 = layer1 ... 4 = layer4; RT-DETR: 2, 3, 4, strides
8, 16, 32). Basic-block variants (R18/R34-vd) are not timm's: their first stage has a 1x1 shortcut
convolution timm does not build, so ``load_detr`` refuses them by name.
"""
from __future__ import annotations

from collections.abc import Sequence
from typing import cast

import torch
from timm.models.resnet import Bottleneck, ResNet
from torch import nn
from torchvision.ops.misc import FrozenBatchNorm2d

from vispe import _checks


def _frozen(channels: int, **_: object) -> FrozenBatchNorm2d:  # timm passes device / dtype
    return FrozenBatchNorm2d(channels, eps=1e-5)


class ResNetVd(nn.Module):
    """timm ResNet-vd (bottleneck) returning the stages ``out_indices`` (module docstring)."""

    def __init__(self, depths: Sequence[int] = (3, 4, 6, 3), widths: Sequence[int] = (64, 128, 256, 512), *,
                 stem_width: int = 32, out_indices: Sequence[int] = (2, 3, 4), frozen_bn: bool = True) -> None:
        super().__init__()
        if len(depths) != 4 or len(widths) != 4:
            raise ValueError(f"depths={tuple(depths)}, widths={tuple(widths)}: expected four stages each")
        bad = [i for i in out_indices if i not in (1, 2, 3, 4)]
        if bad or not out_indices:
            raise ValueError(f"out_indices={tuple(out_indices)}: expected stage numbers in 1..4")
        _checks.positive_int("stem_width", stem_width)
        norm = _frozen if frozen_bn else nn.BatchNorm2d
        self.body = ResNet(Bottleneck, tuple(depths),  # type: ignore[arg-type]  # timm annotates the class as an instance
                           num_classes=0, global_pool="", stem_width=stem_width,
                           stem_type="deep", avg_down=True, channels=tuple(widths), norm_layer=norm)
        self.out_indices = tuple(out_indices)
        self.channels = [4 * widths[i - 1] for i in self.out_indices]
        self.strides = [2 ** (i + 1) for i in self.out_indices]

    def forward(self, images: torch.Tensor) -> list[torch.Tensor]:
        """Images (B, 3, H, W) -> the maps of ``out_indices`` [(B, c_l, H / s_l, W / s_l)]."""
        b = self.body
        x = b.maxpool(b.act1(b.bn1(b.conv1(images))))
        outs = []
        stages = [cast(nn.Module, s) for s in (b.layer1, b.layer2, b.layer3, b.layer4)]
        for i, stage in enumerate(stages, start=1):
            x = stage(x)
            if i in self.out_indices:
                outs.append(x)
            if i == max(self.out_indices):
                break
        return outs
