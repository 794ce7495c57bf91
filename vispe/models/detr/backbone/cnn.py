"""Backbones of the DETR-style detector: images (B, 3, H, W) + padding mask -> features + mask.

Every backbone has ``num_channels``, ``stride`` and ``forward(images, mask) -> (features (B, C,
h, w), mask (B, h, w))``; the mask (True = padding) is brought to the feature grid with
``vispe.coords.resize_mask`` (nearest), as DETR does.

* ``ResNetBackbone``: torchvision's ResNet-18/34/50/101 with ``FrozenBatchNorm2d`` (DETR's
  backbone: batch-norm statistics and affine frozen; the stem and layer1 frozen, layer2-4
  trained), returning layer4 (stride 32; 16 with ``dilation=True``, DETR-DC5). Parameter names
  are torchvision's, which are also timm's (``conv1``, ``bn1``, ``layer1.0.conv1``, ...), so
  torchvision, timm, DETR and transformers' (timm backbone) weights load. ``weights`` is a local
  file (a state_dict, or a dict holding one under "model" / "state_dict"); nothing downloads.
  Like DETR's, its convolutions see padded pixels through the normalisation biases, so near the
  border of a padded image its features depend on the padding (transformers#23218): batch
  invariance holds from the projection on, not through this backbone.
* ``SmallCNN``: a light mask-aware CNN for CPU-scale runs (four stride-2 stages, stride 16,
  per-pixel channel LayerNorm, no batch statistics). Padded features are set to zero after
  every convolution, which is what the convolution's own zero padding gives an image alone, so an
  image alone and the same image padded in a batch (padded to a multiple of the stride) get
  the same features on their valid area.
"""
from __future__ import annotations

from pathlib import Path

import torch
import torchvision
from timm.layers import LayerNorm2d
from torch import nn
from torchvision.models._utils import IntermediateLayerGetter
from torchvision.ops.misc import FrozenBatchNorm2d

from vispe import _checks
from vispe.coords import resize_mask
from vispe.models.detr.backbone.resnet_mask import MaskZeroing
from vispe.models.detr.backbone.vit import ViTBackbone
from vispe.models.vit import PRESETS as VIT_PRESETS

RESNETS = {"resnet18": 512, "resnet34": 512, "resnet50": 2048, "resnet101": 2048}
BACKBONES = (*RESNETS, "small_cnn")


class ResNetBackbone(nn.Module):
    """torchvision ResNet with frozen batch norm, returning layer4 (DETR's backbone)."""

    def __init__(self, name: str = "resnet50", *, weights: str | Path | None = None, dilation: bool = False,
                 train_backbone: bool = True, mask_aware: bool = False) -> None:
        super().__init__()
        if not isinstance(mask_aware, bool):
            raise ValueError(f"backbone_mask_aware={mask_aware!r}: expected True or False")
        _checks.choice("backbone", name, tuple(RESNETS))
        net = getattr(torchvision.models, name)(weights=None, norm_layer=FrozenBatchNorm2d,
                                                replace_stride_with_dilation=[False, False, bool(dilation)])
        if weights is not None:
            load_backbone_weights(net, weights)
        for pname, p in net.named_parameters():  # DETR trains layer2-4 only
            if not train_backbone or not pname.startswith(("layer2", "layer3", "layer4")):
                p.requires_grad_(False)
        self.body = IntermediateLayerGetter(net, return_layers={"layer4": "out"})
        self.num_channels = RESNETS[name]
        self.stride = 16 if dilation else 32
        self.mask_aware = mask_aware
        self._zeroing = MaskZeroing(self.body) if mask_aware else None

    def forward(self, images: torch.Tensor, mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        if self._zeroing is None:  # DETR's: padding leaks into the valid border
            x = self.body(images)["out"]  # (B, C, h, w)
            return x, resize_mask(mask, x.shape[-2:])  # (B, h, w)
        self._zeroing.mask = mask
        try:
            x = self.body(images * (~mask)[:, None].to(images.dtype))["out"]  # (B, C, h, w)
        finally:
            self._zeroing.mask = None
        return x, resize_mask(mask, x.shape[-2:])  # (B, h, w)


def load_backbone_weights(net: nn.Module, weights: str | Path) -> None:
    """Load a local torchvision/timm ResNet state_dict into ``net`` (the classifier ``fc`` is optional)."""
    path = Path(weights)
    if not path.is_file():
        raise ValueError(f"backbone_weights={str(path)!r}: no such file (expected a local ResNet state_dict; "
                         "vispe downloads nothing)")
    state = torch.load(path, map_location="cpu", weights_only=True)
    for key in ("model", "state_dict"):
        if isinstance(state, dict) and key in state and isinstance(state[key], dict):
            state = state[key]
    state = {k.removeprefix("module."): v for k, v in state.items() if not k.startswith("fc.")}
    own = {k: v for k, v in net.state_dict().items() if not k.startswith("fc.")}
    missing, unexpected = sorted(set(own) - set(state)), sorted(set(state) - set(own))
    shapes = [f"{k}: file {tuple(state[k].shape)} vs model {tuple(own[k].shape)}"
              for k in sorted(set(own) & set(state)) if state[k].shape != own[k].shape]
    if missing or unexpected or shapes:
        raise ValueError(f"backbone_weights={str(path)!r} does not fit the ResNet: missing {missing[:4]}, "
                         f"unexpected {unexpected[:4]}, shapes {shapes[:4]}")
    net.load_state_dict(state, strict=False)


class SmallCNN(nn.Module):
    """Stride-2 stages (conv 3x3 s2 -> LayerNorm2d -> ReLU, conv 3x3 -> ReLU), mask-aware.

    Args:
        widths: channels of the four stages (the last is ``num_channels``).
        in_chans: image channels.
    """

    def __init__(self, widths: tuple[int, ...] = (32, 64, 128, 256), in_chans: int = 3) -> None:
        super().__init__()
        widths = tuple(widths)
        if not widths or any(not isinstance(c, int) or c <= 0 for c in widths):
            raise ValueError(f"widths={widths!r}: expected a non-empty tuple of positive integers")
        layers, c_in = [], in_chans
        for c in widths:  # each stage: a stride-2 conv block, then a stride-1 one
            layers.append(nn.Sequential(nn.Conv2d(c_in, c, 3, stride=2, padding=1), LayerNorm2d(c), nn.ReLU(inplace=True)))
            layers.append(nn.Sequential(nn.Conv2d(c, c, 3, padding=1), nn.ReLU(inplace=True)))
            c_in = c
        self.layers = nn.ModuleList(layers)
        self.num_channels = widths[-1]
        self.stride = 2 ** len(widths)

    def forward(self, images: torch.Tensor, mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return self.forward_levels(images, mask)[-1]

    def forward_levels(self, images: torch.Tensor, mask: torch.Tensor) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """The output of every stage (strides 2, 4, 8, ...) with its mask: [(B, C_s, h_s, w_s), (B, h_s, w_s)]."""
        x, out = images * (~mask)[:, None].to(images.dtype), []  # (B, 3, H, W), padding zeroed
        for i, layer in enumerate(self.layers):  # padded cells zeroed after every convolution, as its own zero padding
            x = layer(x)  # (B, C, h, w)
            mask_h = resize_mask(mask, x.shape[-2:])  # (B, h, w)
            x = x * (~mask_h)[:, None].to(x.dtype)
            if i % 2:  # the end of a stage
                out.append((x, mask_h))
        return out


def build_backbone(name, *, weights=None, dilation: bool = False, train_backbone: bool = True,
                   widths=None, kwargs: dict | None = None, mask_aware: bool = False) -> nn.Module:
    """The backbone ``name``: one of ``BACKBONES``, a vispe ViT preset (``kwargs`` go to
    ``create_vit``, plus ``layers`` for ``ViTBackbone``), a vispe ViT module, or a module with the
    backbone interface (``num_channels``, ``stride``, ``forward(images, mask)``). Options that do
    not apply to it are refused."""
    kwargs = dict(kwargs or {})
    if isinstance(name, nn.Module) or (isinstance(name, str) and name in VIT_PRESETS):
        for opt, value, default in (("backbone_weights", weights, None), ("dilation", dilation, False),
                                    ("train_backbone", train_backbone, True), ("backbone_widths", widths, None),
                                    ("backbone_mask_aware", mask_aware, False)):
            if value != default:
                raise ValueError(f"{opt}={value!r}: not an option of a ViT or module backbone")
    if isinstance(name, nn.Module):
        if all(hasattr(name, a) for a in ("num_channels", "stride")) and not hasattr(name, "forward_tokens"):
            if kwargs:
                raise ValueError(f"backbone_kwargs={kwargs!r}: not an option of a ready backbone module")
            return name
        unknown = sorted(set(kwargs) - {"layers"})
        if unknown:
            raise ValueError(f"backbone_kwargs={kwargs!r}: a ViT module takes only 'layers' (got {unknown})")
        return ViTBackbone(name, **kwargs)
    if isinstance(name, str) and name in VIT_PRESETS:
        from vispe.models.vit import create_vit
        layers = kwargs.pop("layers", 1)
        if "num_classes" in kwargs:
            raise ValueError(f"backbone_kwargs={kwargs!r}: num_classes is not an option (the head is unused)")
        return ViTBackbone(create_vit(name, num_classes=0, **kwargs), layers=layers)
    _checks.choice("backbone", name, BACKBONES + tuple(VIT_PRESETS))
    if kwargs:
        raise ValueError(f"backbone_kwargs={kwargs!r}: only ViT backbones take backbone_kwargs")
    if name == "small_cnn":
        why = {"backbone_weights": "it is trained from scratch: there are no weights to load",
               "dilation": "it has no last stage to dilate (DC5 is a ResNet option)",
               "train_backbone": "it is trained from scratch: frozen, it would stay random",
               "backbone_mask_aware": "it is mask-aware already: it zeroes the padding after every convolution"}
        for opt, value, default in (("backbone_weights", weights, None), ("dilation", dilation, False),
                                    ("train_backbone", train_backbone, True), ("backbone_mask_aware", mask_aware, False)):
            if value != default:
                raise ValueError(f"{opt}={value!r}: not an option of backbone='small_cnn' ({why[opt]})")
        return SmallCNN(widths) if widths is not None else SmallCNN()
    if widths is not None:
        raise ValueError(f"backbone_widths={widths!r}: only backbone='small_cnn' takes widths")
    return ResNetBackbone(name, weights=weights, dilation=dilation, train_backbone=train_backbone,
                          mask_aware=mask_aware)
