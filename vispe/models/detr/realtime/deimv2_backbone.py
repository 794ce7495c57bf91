"""DEIMv2's DINOv3 backbone: a DINOv3 ViT (vispe's conversion, ``vispe.models.dinov3``: its RoPE is vispe's
``rope_axial`` and can be swapped by name) beside a small CNN, the spatial tuning adapter (STA).

transformers' ``Deimv2DINOv3ConvEncoder``: for images (B, 3, H, W), patch p, (h, w) = (H // p, W // p):

    semantic_l = bilinear(norm(block_{k_l} tokens) as (B, C, h, w), (h, w) * 2^(1 - l))   l = 0, 1, 2
    detail     = STA(images): strides 8, 16, 32 with 2i, 4i, 4i channels (i = ``inplanes``)
    out_l      = cat[semantic_l, detail_l]          (B, C + 2i | 4i, H / 8 * 2^-l, W / 8 * 2^-l)

transformers then projects each ``out_l`` by a 1x1 conv + BN (``fusion_proj``): in vispe that is the hybrid
encoder's ``input_proj``, the same operation. ``blocks`` are the ViT blocks whose outputs are taken
(transformers' ``out_indices`` minus one: its stage 0 is the patch embedding), each through the final norm
(``norm_all``, transformers' ``apply_layernorm``) or, with ``norm_all=False`` (DEIMv2's distilled ViT-Tiny
variants), only the last block's, as transformers. STA (parameter names transformers'): ``stem_conv`` (3x3 s2, GELU), max pool
3x3 s2, then ``conv2``, ``conv3``, ``conv4`` (3x3 s2 + BN, a GELU between them).
"""
from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from vispe.models.detr.realtime.ccfm import ConvNorm
from vispe.models.eva import VispeEva


class SpatialTuningAdapter(nn.Module):
    def __init__(self, inplanes: int = 16, eps: float = 1e-5) -> None:
        super().__init__()
        self.stem_conv = ConvNorm(3, inplanes, 3, 2, act="gelu", eps=eps)
        self.stem_pool = nn.MaxPool2d(kernel_size=3, stride=2, padding=1)
        self.conv2 = ConvNorm(inplanes, 2 * inplanes, 3, 2, eps=eps)
        self.conv3 = ConvNorm(2 * inplanes, 4 * inplanes, 3, 2, eps=eps)
        self.conv4 = ConvNorm(4 * inplanes, 4 * inplanes, 3, 2, eps=eps)
        self.act_fn = nn.GELU()

    def forward(self, images: torch.Tensor) -> list[torch.Tensor]:  # [(B, 2i | 4i | 4i, H/8 | H/16 | H/32, ...)]
        x8 = self.conv2(self.stem_pool(self.stem_conv(images)))
        x16 = self.conv3(self.act_fn(x8))
        return [x8, x16, self.conv4(self.act_fn(x16))]


class DINOv3Backbone(nn.Module):
    def __init__(self, vit: VispeEva, blocks: Sequence[int], *, inplanes: int = 16, eps: float = 1e-5,
                 norm_all: bool = True) -> None:
        super().__init__()
        self.norm_all = bool(norm_all)
        if len(blocks) != 3 or not all(0 <= b < len(vit.blocks) for b in blocks):
            raise ValueError(f"blocks={list(blocks)}: expected three block indices in [0, {len(vit.blocks)})")
        self.vit = vit
        self.blocks = [int(b) for b in blocks]
        self.sta = SpatialTuningAdapter(inplanes, eps)
        C = vit.embed_dim
        self.channels = [C + 2 * inplanes, C + 4 * inplanes, C + 4 * inplanes]
        self.strides = [8, 16, 32]
        self.patch = tuple(vit.patch_embed.patch_size)

    def set_encoding(self, name: str, **kwargs: Any) -> None:
        """The ViT's position encoding by name (``VispeEva.setup_pe``), e.g. "rope_mixed"."""
        self.vit.setup_pe(name, kwargs)

    def forward(self, images: torch.Tensor) -> list[torch.Tensor]:  # [(B, channels_l, H/s_l, W/s_l)]
        h, w = images.shape[-2] // self.patch[0], images.shape[-1] // self.patch[1]
        tokens = self.vit.forward_intermediates(images, indices=self.blocks, output_fmt="NLC", intermediates_only=True)
        last = len(self.vit.blocks) - 1
        maps = [(self.vit.norm(t) if self.norm_all or b == last else t).transpose(1, 2).reshape(t.shape[0], -1, h, w)
                for t, b in zip(tokens, self.blocks)]  # (B, C, h, w)
        semantic = [F.interpolate(m, size=(int(h * 2.0 ** (1 - i)), int(w * 2.0 ** (1 - i))), mode="bilinear",
                                  align_corners=False) for i, m in enumerate(maps)]  # (B, C, h 2^(1-l), w 2^(1-l))
        return [torch.cat([s, d], 1) for s, d in zip(semantic, self.sta(images))]
