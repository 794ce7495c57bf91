"""Multi-scale features for deformable attention: backbone levels, each with its own mask, and the
per-level input projections of Deformable DETR (Zhu et al., 2021).

A multi-scale backbone has ``num_channels`` and ``strides`` (one entry per level, fine to coarse) and
``forward(images, mask) -> [(features (B, C_l, h_l, w_l), mask (B, h_l, w_l))]``, each mask the
pixel mask brought to its level with ``vispe.coords.resize_mask`` (nearest), True = padding:

* ``MultiScaleResNet``: DETR's frozen-BN torchvision ResNet (``ResNetBackbone``: same parameter names
  ``body.conv1``, ``body.layer2.0...``, so torchvision, timm, the papers' and transformers' weights
  load) returning layer2-4 (C3-C5, strides 8/16/32, the paper's) or the ``layers`` asked; with
  ``mask_aware=True`` the padded cells are zeroed after every normalisation (``resnet_mask``), so
  every level is mask-aware.
* ``MultiScaleCNN``: the last ``num_levels`` stages of ``SmallCNN`` (mask-aware at every stage).
* ``vispe.models.detr.backbone.vit_pyramid.SimpleFeaturePyramid``: a vispe ViT's one map made into several.
* ``build_multiscale_backbone(name, num_levels)``: one of these by name (``backbone_levels`` of the
  ``num_levels`` from the backbone, the rest from ``InputProjection``).

``InputProjection`` (``input_proj.{l}.0`` conv, ``input_proj.{l}.1`` GroupNorm(32), the papers' and
transformers' names): a 1x1 conv per backbone level, then ``num_levels - len(levels)`` extra levels,
each a 3x3 stride-2 conv (the first on the last backbone map, the next on the previous extra
level's output), every one followed by GroupNorm; an extra level's mask is the pixel mask resized
to it. GroupNorm's statistics run over the whole map, padding included (the papers'), so a padded
image's features depend on the batch; ``mask_aware=True`` takes them over each image's valid cells
only and zeroes the padded cells of every level (the input of the next stride-2 conv included), so
an image alone and the same image padded in a batch (valid size a multiple of the coarsest stride)
get the same tokens on their valid area. Without padding both are GroupNorm.
"""
from __future__ import annotations

import torch
from torch import nn
from torchvision.models._utils import IntermediateLayerGetter

from vispe import _checks
from vispe.coords import resize_mask
from vispe.models.detr.backbone.cnn import RESNETS, ResNetBackbone, SmallCNN

_CHANNELS = {"resnet18": (64, 128, 256, 512), "resnet34": (64, 128, 256, 512),  # layer1..layer4
             "resnet50": (256, 512, 1024, 2048), "resnet101": (256, 512, 1024, 2048)}
PAPER_LAYERS = (2, 3, 4)  # C3-C5


class MultiScaleResNet(ResNetBackbone):
    """``ResNetBackbone`` returning several layers (``layers``: indices 1-4 of layer1..layer4, default C3-C5)."""

    def __init__(self, name: str = "resnet50", *, layers=PAPER_LAYERS, **kwargs) -> None:
        super().__init__(name, **kwargs)
        layers = tuple(layers)
        if not layers or any(i not in (1, 2, 3, 4) for i in layers) or list(layers) != sorted(set(layers)):
            raise ValueError(f"layers={layers!r}: expected increasing indices among 1, 2, 3, 4 (layer1..layer4; "
                             f"the paper's C3-C5 is {PAPER_LAYERS})")
        self.body = IntermediateLayerGetter(self.body, return_layers={f"layer{i}": str(k) for k, i in enumerate(layers)})
        last = self.stride  # 32, or 16 with dilation (DC5)
        self.layers = layers
        self.num_channels = [_CHANNELS[name][i - 1] for i in layers]
        self.strides = [2 ** (i + 1) if i < 4 else last for i in layers]

    def forward(self, images: torch.Tensor, mask: torch.Tensor) -> list[tuple[torch.Tensor, torch.Tensor]]:
        if self._zeroing is None:  # DETR's: padding leaks into the valid border
            outs = self.body(images)
        else:
            self._zeroing.mask = mask
            try:
                outs = self.body(images * (~mask)[:, None].to(images.dtype))
            finally:
                self._zeroing.mask = None
        return [(x, resize_mask(mask, x.shape[-2:])) for x in outs.values()]  # [(B, C_l, h_l, w_l), (B, h_l, w_l)]


class MultiScaleCNN(nn.Module):
    """The last ``num_levels`` stages of a ``SmallCNN`` (strides 2^s), mask-aware."""

    def __init__(self, cnn: SmallCNN | None = None, num_levels: int = 3) -> None:
        super().__init__()
        self.cnn = cnn if cnn is not None else SmallCNN()
        stages = len(self.cnn.layers) // 2
        if not 1 <= _checks.positive_int("num_levels", num_levels) <= stages:
            raise ValueError(f"num_levels={num_levels}: expected at most the CNN's {stages} stages")
        widths = [self.cnn.layers[2 * s][0].out_channels for s in range(stages)]
        self.num_levels = num_levels
        self.num_channels = widths[-num_levels:]
        self.strides = [2 ** (s + 1) for s in range(stages)][-num_levels:]

    def forward(self, images: torch.Tensor, mask: torch.Tensor) -> list[tuple[torch.Tensor, torch.Tensor]]:
        return self.cnn.forward_levels(images, mask)[-self.num_levels:]


def masked_group_norm(x: torch.Tensor, mask: torch.Tensor, norm: nn.GroupNorm) -> torch.Tensor:
    """``norm`` with each image's statistics over its valid cells only, padded cells set to 0.  # (B, C, h, w)"""
    B, C, h, w = x.shape
    G = norm.num_groups
    valid = (~mask).to(x.dtype)[:, None, None]  # (B, 1, 1, h, w)
    xg = x.view(B, G, C // G, h, w)  # (B, G, C/G, h, w)
    n = valid.sum((2, 3, 4), keepdim=True).clamp(min=1) * (C // G)  # (B, 1, 1, 1, 1) values per group
    mean = (xg * valid).sum((2, 3, 4), keepdim=True) / n  # (B, G, 1, 1, 1)
    var = ((xg - mean).square() * valid).sum((2, 3, 4), keepdim=True) / n
    y = ((xg - mean) * torch.rsqrt(var + norm.eps)).view(B, C, h, w)
    if norm.affine:
        y = y * norm.weight.view(1, C, 1, 1) + norm.bias.view(1, C, 1, 1)
    return y * valid.view(B, 1, h, w)


class _Level(nn.Sequential):
    """conv (``.0``) then GroupNorm (``.1``); masked statistics when given a mask."""

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:  # (B, d, h, w)
        x = self[0](x)
        return self[1](x) if mask is None else masked_group_norm(x, mask, self[1])


class InputProjection(nn.ModuleList):
    """Per-level projections to ``d_model`` and the extra stride-2 levels (module docstring).

    Args:
        in_channels: channels of the backbone's levels, fine to coarse.
        d_model: output channels.
        num_levels: levels out, at least ``len(in_channels)``; the rest are stride-2 convs.
        groups: GroupNorm groups (the papers' 32; ``d_model`` a multiple of it).
        mask_aware: GroupNorm statistics over the valid cells, padded cells zeroed (default False: the papers').
    """

    def __init__(self, in_channels, d_model: int, num_levels: int, *, groups: int = 32, mask_aware: bool = False) -> None:
        in_channels = [_checks.positive_int("in_channels", c) for c in in_channels]
        if not in_channels or num_levels < len(in_channels):
            raise ValueError(f"num_levels={num_levels}: expected at least the backbone's {len(in_channels)} levels")
        _checks.divisible("d_model", d_model, _checks.positive_int("groups", groups), "GroupNorm groups")
        if not isinstance(mask_aware, bool):
            raise ValueError(f"mask_aware={mask_aware!r}: expected True or False")
        levels = [_Level(nn.Conv2d(c, d_model, kernel_size=1), nn.GroupNorm(groups, d_model)) for c in in_channels]
        c = in_channels[-1]
        for _ in range(num_levels - len(in_channels)):
            levels.append(_Level(nn.Conv2d(c, d_model, kernel_size=3, stride=2, padding=1), nn.GroupNorm(groups, d_model)))
            c = d_model
        super().__init__(levels)
        self.num_backbone_levels, self.mask_aware = len(in_channels), mask_aware
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """The papers' initialisation: Xavier-uniform conv weights (gain 1), zero conv biases."""
        for level in self:
            nn.init.xavier_uniform_(level[0].weight, gain=1)
            nn.init.zeros_(level[0].bias)

    def forward(self, feats, pixel_mask: torch.Tensor) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
        """Backbone levels [(B, C_l, h_l, w_l), (B, h_l, w_l)] and the pixel mask (B, H, W) -> maps
        [(B, d, h_l, w_l)] and masks [(B, h_l, w_l)] of all ``len(self)`` levels."""
        if len(feats) != self.num_backbone_levels:
            raise ValueError(f"feats has {len(feats)} levels: expected the backbone's {self.num_backbone_levels}")
        masked = self.mask_aware and bool(pixel_mask.any())
        maps, masks = [], []
        for level, (x, m) in zip(self, feats):
            maps.append(level(x, m if masked else None))
            masks.append(m)
        src = feats[-1][0]  # the first extra level reads the last backbone map
        for level in list(self)[self.num_backbone_levels:]:
            if masked:
                src = src * (~masks[-1])[:, None].to(src.dtype)  # zeros beyond the valid area, as an image alone
            x = level[0](src)  # (B, d, h, w)
            m = resize_mask(pixel_mask, x.shape[-2:])  # (B, h, w)
            maps.append(level[1](x) if not masked else masked_group_norm(x, m, level[1]))
            masks.append(m)
            src = maps[-1]
        return maps, masks


def backbone_levels(num_levels: int, from_backbone: int | None = None) -> int:
    """How many of ``num_levels`` come from the backbone (the rest are ``InputProjection``'s stride-2
    convs): ``from_backbone`` when given (1 to min(num_levels, 3): its last ones), else 1 for one level
    (transformers' C5) and up to 3 otherwise (the paper's C3-C5 + extra levels)."""
    _checks.positive_int("num_levels", num_levels)
    if from_backbone is None:
        return 1 if num_levels == 1 else min(num_levels, 3)
    if isinstance(from_backbone, bool) or not isinstance(from_backbone, int) or \
            not 1 <= from_backbone <= min(num_levels, 3):
        raise ValueError(f"backbone_levels={from_backbone!r}: expected 1 to {min(num_levels, 3)} of the "
                         f"num_feature_levels={num_levels} levels from the backbone (its last ones)")
    return from_backbone


def build_multiscale_backbone(name, num_levels: int = 4, *, weights=None, dilation: bool = False,
                              train_backbone: bool = True, mask_aware: bool = False, widths=None,
                              kwargs: dict | None = None, from_backbone: int | None = None) -> nn.Module:
    """The multi-scale backbone for ``num_levels`` levels (``backbone_levels(num_levels, from_backbone)`` of
    them its own):

    * a ResNet name: ``MultiScaleResNet`` returning the last k of layer2-4 (C5 alone for one level);
    * "small_cnn": ``MultiScaleCNN`` over the last k stages (``widths`` as ``SmallCNN``'s);
    * a vispe ViT preset (``kwargs`` to ``create_vit``, plus ``layers`` for ``ViTBackbone``) or a ViT
      module: ``SimpleFeaturePyramid`` of its patch map at the last k of the scales (2, 1, 1/2) ((1,)
      for one level);
    * a module with ``num_channels`` and ``strides`` lists: itself (it must give k levels).

    Options that do not apply are refused (``vispe.models.detr.backbone.cnn.build_backbone``'s rules).
    """
    from vispe.models.detr.backbone.cnn import build_backbone
    from vispe.models.detr.backbone.vit import ViTBackbone
    from vispe.models.detr.backbone.vit_pyramid import SimpleFeaturePyramid

    k = backbone_levels(num_levels, from_backbone)
    if isinstance(name, nn.Module) and isinstance(getattr(name, "strides", None), (list, tuple)):
        if len(name.strides) != k:
            raise ValueError(f"backbone gives {len(name.strides)} levels: num_levels={num_levels} takes {k} from it")
        return name
    if isinstance(name, str) and name in RESNETS:
        for opt, value in (("backbone_widths", widths), ("backbone_kwargs", kwargs or None)):
            if value is not None:
                raise ValueError(f"{opt}={value!r}: not an option of backbone={name!r}")
        return MultiScaleResNet(name, layers=PAPER_LAYERS[-k:] if k > 1 else (4,), weights=weights,
                                dilation=dilation, train_backbone=train_backbone, mask_aware=mask_aware)
    single = build_backbone(name, weights=weights, dilation=dilation, train_backbone=train_backbone, widths=widths,
                            kwargs=kwargs, mask_aware=mask_aware)  # checks the options of the others
    if isinstance(single, SmallCNN):
        return MultiScaleCNN(single, num_levels=k)
    if isinstance(single, ViTBackbone):
        return SimpleFeaturePyramid(single, scales=(2.0, 1.0, 0.5)[-k:] if k > 1 else (1.0,))
    raise ValueError(f"backbone={type(name).__name__}: a single-scale module; expected a ResNet name, 'small_cnn', "
                     "a vispe ViT, or a module with num_channels and strides lists")
