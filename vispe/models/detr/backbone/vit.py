"""A vispe ViT as the detector's backbone: images (B, 3, H, W) + padding mask -> patch-token map.

The ViT (``create_vit`` / ``convert_vit``, any registered encoding inside) receives the pixel
padding mask; a patch is padding when all its pixels are (the ViT's rule, ``patch_mask``), and its
tokens are hidden from attention there. The patch tokens of the final (normed) output, i.e.
``forward_features`` without its prefix tokens, are reshaped to the feature map (B, C, h, w) with
h = H / p, w = W / p (ViTDet's simple single-scale map, Li et al. 2022). With ``layers=k > 1`` the
outputs of the last k blocks (each after the ViT's final norm) are summed:

    F = sum_{i = L-k}^{L-1} norm(x_i)[P:]  reshaped to (C, h, w)

Default: k = 1, a single scale from the last block. Padded cells of the map are set to zero
(the detector hides them anyway); with no padding the map equals forward_features exactly.
"""
from __future__ import annotations

import torch
from torch import nn

from vispe import _checks
from vispe.models._vit_inputs import patch_mask


def _check_vit(vit) -> None:
    need = ("forward_tokens", "forward_intermediates", "patch_embed", "num_prefix_tokens", "embed_dim")
    missing = [a for a in need if not hasattr(vit, a)]
    if not isinstance(vit, nn.Module) or missing:
        raise ValueError(f"backbone={type(vit).__name__}: expected a vispe ViT from create_vit/convert_vit "
                         f"(missing {missing}) or a backbone name")
    ps = getattr(vit.patch_embed, "patch_size", None)
    if ps is None or getattr(vit.patch_embed, "proj", None) is None:
        raise ValueError(f"backbone={type(vit).__name__}: expected a ViT with patch tokens (patch_embed.proj "
                         "and patch_size)")


class ViTBackbone(nn.Module):
    """Patch tokens of a vispe ViT as a feature map (stride = patch size).

    Args:
        vit: a vispe ViT (``create_vit`` / ``convert_vit``); its head is not used.
        layers: sum the outputs of the last ``layers`` blocks (1 = the final output only).
    """

    def __init__(self, vit: nn.Module, *, layers: int = 1) -> None:
        super().__init__()
        _check_vit(vit)
        _checks.positive_int("layers", layers)
        if layers > len(vit.blocks):
            raise ValueError(f"layers={layers}: expected at most the ViT's depth {len(vit.blocks)}")
        self.vit, self.layers = vit, layers
        self.patch_size = tuple(vit.patch_embed.patch_size)  # (ph, pw)
        ph, pw = self.patch_size
        self.stride = ph if ph == pw else self.patch_size
        self.num_channels = vit.embed_dim

    def forward(self, images: torch.Tensor, mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        B, _, H, W = images.shape
        ph, pw = self.patch_size
        if H % ph or W % pw:
            raise ValueError(f"images: size {(H, W)}: expected multiples of the ViT's patch_size {(ph, pw)} "
                             "(pad with size_divisibility)")
        h, w = H // ph, W // pw
        if self.layers == 1:
            x, _ = self.vit.forward_tokens(images, mask)  # (B, P+N, C)
            feats = x[:, self.vit.num_prefix_tokens:].reshape(B, h, w, -1).permute(0, 3, 1, 2)  # (B, C, h, w)
        else:
            n = len(self.vit.blocks)
            outs = self.vit.forward_intermediates(images, indices=list(range(n - self.layers, n)), norm=True,
                                                  intermediates_only=True, mask=mask)
            feats = torch.stack(outs).sum(0)  # (B, C, h, w)
        fmask = patch_mask(mask, self.patch_size)  # (B, h, w)
        return feats * (~fmask)[:, None].to(feats.dtype), fmask
