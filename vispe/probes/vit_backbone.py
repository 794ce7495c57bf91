"""vispe ViTs as probe backbones: the patch tokens after every block, as maps.

A ViT is named by its encoding, ``"<pe>"`` or ``"<pe>:<padding>"`` for encodings with a padding
(PEG, Chu et al. 2023: ``"peg:zeros"``, ``"peg:circular"``)::

    model = build_vit_backbone("peg:circular", image_size=64)
    maps = model(x)          # [(B, C, h, w)] * depth, h = H / patch_size, prefix tokens dropped

Built with ``vispe.models.vit.create_vit`` (random init, frozen, eval) and read with timm's public
``forward_intermediates(x, indices=depth, output_fmt="NCHW", intermediates_only=True)``: block
outputs before the final norm. The patch embedding is a stride-``patch_size`` convolution without
padding, so any absolute position in these maps comes from the encoding (or, for PEG and attention
near the image edge, from the borders).
"""
from __future__ import annotations

import torch
from torch import nn

from vispe import _checks

VIT_ENCODINGS = ("none", "sine", "rope_axial", "peg:zeros", "peg:circular")
#: the encodings whose settings take a padding mode, and the name of that setting
PADDED = {"peg": "padding_mode"}


def parse_vit_spec(spec: str) -> tuple[str, dict, str]:
    """``"peg:circular"`` -> ``("peg", {"padding_mode": "circular"}, "circular")``; padding "-" if none."""
    if not isinstance(spec, str) or not spec:
        raise ValueError(f"spec={spec!r}: expected an encoding name, optionally '<pe>:<padding>' (e.g. 'peg:zeros')")
    pe, _, padding = spec.partition(":")
    if padding and pe not in PADDED:
        raise ValueError(f"spec={spec!r}: only {', '.join(PADDED)} take a padding, {pe!r} does not")
    return pe, ({PADDED[pe]: padding} if padding else {}), (padding or "-")


class ViTBlocks(nn.Module):
    """A frozen ViT returning the grid tokens of each block as maps.  # [(B, C, h, w)] * depth"""

    def __init__(self, model: nn.Module, spec: str) -> None:
        super().__init__()
        self.model, self.spec = model, spec
        self.name, self.padding = "vit", parse_vit_spec(spec)[2]
        self.stages_used = len(model.blocks)

    def forward(self, x: torch.Tensor) -> list[torch.Tensor]:
        return list(self.model.forward_intermediates(x, indices=len(self.model.blocks), output_fmt="NCHW",
                                                     intermediates_only=True))


def build_vit_backbone(spec: str, *, image_size=64, patch_size: int = 8, preset: str = "vit_pico",
                       seed: int = 0, **timm_kwargs) -> ViTBlocks:
    """A random-init, frozen vispe ViT with the encoding ``spec`` (see the module docstring)."""
    from vispe.models.vit import create_vit

    pe, pe_kwargs, _ = parse_vit_spec(spec)
    _checks.grid_shape("image_size", image_size)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = create_vit(preset, pe=pe, img_size=image_size, patch_size=patch_size, num_classes=0,
                           pe_kwargs=pe_kwargs or None, **timm_kwargs)
    return ViTBlocks(model, spec).eval().requires_grad_(False)
