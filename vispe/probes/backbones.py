"""CNN backbones whose padding is a parameter, for the padding-leakage experiment.

Islam, Jia & Bruce (ICLR 2020) read absolute position out of frozen VGG/ResNet features and trace
it to zero padding; Kayhan & van Gemert (CVPR 2020, "On Translation Invariance in CNNs: Convolutional
Layers can Exploit Absolute Spatial Location") show that borders let CNNs learn where things are.
Here the padding of a network is swapped so the same weights can be compared under each rule.

``swap_padding(model, mode)`` changes, in place, exactly this:

* every ``nn.Conv2d``: ``mode`` in ``zeros / reflect / replicate / circular`` sets
  ``conv.padding_mode = mode`` (the amount of padding is kept; torch then pads with ``F.pad``);
  ``mode="valid"`` sets ``conv.padding = (0, 0)`` (no padding, output maps shrink by k-1 per conv);
* every padded ``nn.MaxPool2d`` (torchvision's ResNet stem: 3x3, stride 2, padding 1): torch pads
  max-pooling with -inf, which after a ReLU equals zero padding, so ``zeros`` keeps it;
  ``reflect / replicate / circular`` replace it by ``PadPool`` (``F.pad`` in that mode, then the
  same pool with padding 0); ``valid`` sets its padding to 0;
* ``valid`` only: every torchvision ``BasicBlock`` / ``Bottleneck`` becomes ``CropResidual``
  (the same modules; the shortcut is centre-cropped to the shrunken main branch before the sum).

Backbones are ``StagedBackbone``: ``forward(x (B, 3, H, W)) -> [maps (B, C_i, h_i, w_i)]``, one map
per stage. A stage whose output would be empty (valid convolutions on a small image) or that would
reflect-pad a map smaller than its padding is skipped with all later ones (``stages_used``).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
import torchvision
from torch import nn
from torchvision.models.resnet import BasicBlock, Bottleneck

from vispe import _checks

PADDINGS = ("zeros", "reflect", "replicate", "circular", "valid")
BACKBONES = ("vgg", "resnet18")


class PadPool(nn.Module):
    """Max-pooling after explicit padding in ``mode`` (reflect / replicate / circular)."""

    def __init__(self, pool: nn.MaxPool2d, mode: str) -> None:
        super().__init__()
        p = pool.padding if isinstance(pool.padding, tuple) else (pool.padding, pool.padding)
        self.pad, self.mode = (p[1], p[1], p[0], p[0]), mode
        self.pool = nn.MaxPool2d(pool.kernel_size, pool.stride, 0, pool.dilation, ceil_mode=pool.ceil_mode)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.pool(F.pad(x, self.pad, mode=self.mode))

    def extra_repr(self) -> str:
        return f"pad={self.pad}, mode={self.mode!r}"


class CropResidual(nn.Module):
    """A torchvision ResNet block with valid convolutions: shortcut centre-cropped to the main branch."""

    def __init__(self, block: BasicBlock | Bottleneck) -> None:
        super().__init__()
        self.block = block
        names = ("conv1", "bn1", "conv2", "bn2") + (("conv3", "bn3") if isinstance(block, Bottleneck) else ())
        self.main = [(getattr(block, names[i]), getattr(block, names[i + 1])) for i in range(0, len(names), 2)]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = x
        for i, (conv, bn) in enumerate(self.main):
            out = bn(conv(out))
            if i < len(self.main) - 1:
                out = self.block.relu(out)
        short = x if self.block.downsample is None else self.block.downsample(x)  # (B, C, h', w')
        dh, dw = short.shape[-2] - out.shape[-2], short.shape[-1] - out.shape[-1]
        short = short[..., dh // 2: dh // 2 + out.shape[-2], dw // 2: dw // 2 + out.shape[-1]]
        return self.block.relu(out + short)


def swap_padding(model: nn.Module, mode: str) -> nn.Module:
    """Set the padding rule of every conv / pool of a freshly built ``model`` (see module docstring)."""
    _checks.choice("mode", mode, PADDINGS)
    for conv in [m for m in model.modules() if isinstance(m, nn.Conv2d)]:
        if isinstance(conv.padding, str):
            raise ValueError(f"a Conv2d has padding={conv.padding!r}: expected integer padding to swap")
        if mode == "valid":
            conv.padding, conv.padding_mode = (0, 0), "zeros"
            conv._reversed_padding_repeated_twice = [0, 0, 0, 0]
        else:
            conv.padding_mode = mode
    for parent in list(model.modules()):
        for name, child in parent.named_children():
            if isinstance(child, nn.AvgPool2d) and child.padding not in (0, (0, 0)):
                raise ValueError(f"{name} is a padded AvgPool2d: swap_padding handles Conv2d and MaxPool2d")
            if isinstance(child, nn.MaxPool2d) and child.padding not in (0, (0, 0)) and mode != "zeros":
                if mode == "valid":
                    child.padding = 0
                else:
                    setattr(parent, name, PadPool(child, mode))
            if mode == "valid" and isinstance(child, (BasicBlock, Bottleneck)):
                setattr(parent, name, CropResidual(child))
    return model


def _out(n: int, k: int, s: int, p: int, d: int = 1) -> int:
    return (n + 2 * p - d * (k - 1) - 1) // s + 1


def spatial_out(module: nn.Module, hw: tuple[int, int]) -> tuple[int, int]:
    """Output (h, w) of ``module`` on an (h, w) input; (0, 0) when it would be empty or invalid."""
    h, w = hw
    if h <= 0 or w <= 0:
        return 0, 0
    if isinstance(module, nn.Conv2d):
        ph, pw = module.padding
        if module.padding_mode == "reflect" and (ph >= h or pw >= w):
            return 0, 0  # reflect padding needs a map larger than the padding
        return (_out(h, module.kernel_size[0], module.stride[0], ph, module.dilation[0]),
                _out(w, module.kernel_size[1], module.stride[1], pw, module.dilation[1]))
    if isinstance(module, nn.MaxPool2d):
        if module.ceil_mode:
            raise ValueError("spatial_out: MaxPool2d with ceil_mode=True is not supported")
        k, s, p, d = (v if isinstance(v, int) else v[0]
                      for v in (module.kernel_size, module.stride, module.padding, module.dilation))
        return _out(h, k, s, p, d), _out(w, k, s, p, d)
    if isinstance(module, PadPool):
        return spatial_out(module.pool, (h + module.pad[2] + module.pad[3], w + module.pad[0] + module.pad[1]))
    if isinstance(module, CropResidual):
        for conv, _ in module.main:
            h, w = spatial_out(conv, (h, w))
        return (h, w) if h > 0 and w > 0 else (0, 0)
    if isinstance(module, (BasicBlock, Bottleneck)):
        for name in ("conv1", "conv2", "conv3"):
            if hasattr(module, name):
                h, w = spatial_out(getattr(module, name), (h, w))
        return h, w
    if isinstance(module, nn.Sequential):
        for m in module:
            h, w = spatial_out(m, (h, w))
        return h, w
    if isinstance(module, (nn.ReLU, nn.BatchNorm2d, nn.Identity)):
        return h, w
    raise ValueError(f"spatial_out: unsupported module {type(module).__name__}")


class StagedBackbone(nn.Module):
    """Stages run in turn; ``forward`` returns every stage's output map.  # [(B, C_i, h_i, w_i)]"""

    def __init__(self, stages: list[nn.Module], name: str, padding: str) -> None:
        super().__init__()
        self.stages = nn.ModuleList(stages)
        self.name, self.padding = name, padding
        self.stages_used = len(stages)

    def forward(self, x: torch.Tensor) -> list[torch.Tensor]:
        outs, hw = [], tuple(x.shape[-2:])
        for stage in self.stages:
            hw = spatial_out(stage, hw)
            if hw[0] <= 0 or hw[1] <= 0:
                break
            x = stage(x)
            outs.append(x)
        if not outs:
            raise ValueError(f"image size {tuple(x.shape[-2:])}: too small for {self.name} "
                             f"with padding={self.padding!r}")
        self.stages_used = len(outs)
        return outs


def small_vgg(padding: str = "zeros", widths=(16, 32, 64, 64), convs_per_stage: int = 2) -> StagedBackbone:
    """A small VGG: stages of ``convs_per_stage`` x (3x3 conv + ReLU), 2x2 max-pool between stages.

    Kaiming-normal (fan_out, ReLU) weights and zero biases, as torchvision's VGG.
    Stage i has ``widths[i]`` channels at stride 2**i.
    """
    stages, cin = [], 3
    for i, cout in enumerate(widths):
        layers: list[nn.Module] = [nn.MaxPool2d(2)] if i else []
        for _ in range(convs_per_stage):
            conv = nn.Conv2d(cin, cout, 3, padding=1)
            nn.init.kaiming_normal_(conv.weight, mode="fan_out", nonlinearity="relu")
            nn.init.zeros_(conv.bias)
            layers += [conv, nn.ReLU()]
            cin = cout
        stages.append(nn.Sequential(*layers))
    return StagedBackbone([swap_padding(s, padding) for s in stages], "vgg", padding)


def resnet18_stages(padding: str = "zeros") -> StagedBackbone:
    """torchvision ``resnet18(weights=None)`` (random init) with padding swapped, as 5 stages:
    stem (conv1-bn-relu, stride 2), maxpool+layer1 (4), layer2 (8), layer3 (16), layer4 (32).
    BatchNorm is in eval mode with its initial statistics (an identity)."""
    net = swap_padding(torchvision.models.resnet18(weights=None), padding)
    stem = nn.Sequential(net.conv1, net.bn1, net.relu)
    return StagedBackbone([stem, nn.Sequential(net.maxpool, net.layer1), net.layer2, net.layer3, net.layer4],
                          "resnet18", padding)


def build_backbone(name: str, padding: str = "zeros", *, seed: int = 0) -> StagedBackbone:
    """A frozen (eval, no grad) CNN backbone ``name`` in ``BACKBONES``, seeded initialisation."""
    _checks.choice("name", name, BACKBONES)
    _checks.choice("padding", padding, PADDINGS)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = small_vgg(padding) if name == "vgg" else resnet18_stages(padding)
    return model.eval().requires_grad_(False)
