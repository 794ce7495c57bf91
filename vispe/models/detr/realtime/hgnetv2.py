"""D-FINE's backbone: transformers' own (HGNetV2 by default), wrapped, not re-implemented.

``TransformersBackbone(config)`` builds the backbone a transformers detector config names
(``transformers.backbone_utils.load_backbone``: D-FINE's ``HGNetV2Backbone``) and, as transformers'
``DFineConvEncoder`` does when ``freeze_backbone_batch_norms``, replaces every ``BatchNorm2d`` with a frozen
one (torchvision's ``FrozenBatchNorm2d``, eps 1e-5). timm's ``hgnetv2_*`` models come from the same
PaddleDetection network; whether their weights map one to one onto transformers' was not checked, so
vispe wraps the module that equals transformers' by construction. Output: the maps of the config's
``out_indices``, finest first; ``channels`` their channel counts.
"""
from __future__ import annotations

from typing import Any

import torch
from torch import nn
from torchvision.ops.misc import FrozenBatchNorm2d


def freeze_batch_norm(module: nn.Module) -> None:
    """Every ``BatchNorm2d`` below ``module`` replaced in place by a ``FrozenBatchNorm2d`` with its statistics."""
    for name, child in module.named_children():
        if isinstance(child, nn.BatchNorm2d):
            frozen = FrozenBatchNorm2d(child.num_features, eps=1e-5)
            with torch.no_grad():
                for key in ("weight", "bias", "running_mean", "running_var"):
                    getattr(frozen, key).copy_(getattr(child, key))
            setattr(module, name, frozen)
        else:
            freeze_batch_norm(child)


class TransformersBackbone(nn.Module):
    def __init__(self, config: Any, *, frozen_bn: bool = True) -> None:
        super().__init__()
        from transformers.backbone_utils import load_backbone

        self.model = load_backbone(config)
        if frozen_bn:
            freeze_batch_norm(self.model)
        self.channels = list(self.model.channels)

    def forward(self, images: torch.Tensor) -> list[torch.Tensor]:  # [(B, c_l, h_l, w_l)]
        return list(self.model(images).feature_maps)
