"""CPVT's conditional position encoding generator, PEG (Chu et al., 2023, "Conditional Positional
Encodings for Vision Transformers"; ``PosCNN``).

A depthwise convolution of the token features seen as an image::

    PEG(x) = DWConv_k(x)      x (B, C, h, w) -> (B, C, h, w), added to x by the model (x + PEG(x))

Position is inferred from the borders: with zero padding the convolution sees where the image ends
(Islam et al., 2020), which is why ``padding_mode`` is an option:

* "zeros" (CPVT, default), "reflect", "replicate", "circular": ``nn.Conv2d(dim, dim, k,
  padding=k//2, groups=dim, padding_mode=...)``. Circular padding has no border, so a constant
  input gives the same output everywhere (no absolute position at all). "reflect" refuses a grid
  of k//2 cells or fewer along an axis (torch cannot reflect it) with a ValueError.
* "none": a valid convolution (no padding); the (h-k+1, w-k+1) result is zero-padded back to
  (h, w), centred, i.e. tokens within k//2 of the border get a zero term (no position from
  padding). A grid smaller than k along an axis gets a zero term everywhere.

Padding mask (B, h, w), True = padding: padded features are zeroed before the convolution and the
output is zeroed on padding. With "zeros" this makes PEG batch-invariant (the padding of a batch
looks like the zero padding of the image alone); other modes are not mask-aware.
Prefix tokens pass through unchanged (the model applies PEG to the grid tokens only).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from vispe import _checks
from vispe.encoding import ConditionalEncoding
from vispe.registry import register

PADDING_MODES = ("zeros", "reflect", "replicate", "circular", "none")


@register("peg")
class PEG(ConditionalEncoding):
    """Depthwise ``k x k`` convolution returning the term to add to ``x``.

    Args:
        dim: channels C of x.
        kernel_size: odd k (CPVT: 3).
        padding_mode: "zeros" (default), "reflect", "replicate", "circular" or "none".
        bias: convolution bias (CPVT: True).
    """

    mask_aware_option = "padding_mode='zeros', the default"

    def __init__(self, dim: int, *, kernel_size: int = 3, padding_mode: str = "zeros", bias: bool = True) -> None:
        super().__init__()
        self.dim = _checks.positive_int("dim", dim)
        k = _checks.positive_int("kernel_size", kernel_size)
        if k % 2 == 0:
            raise ValueError(f"kernel_size={k}: expected an odd integer (the output stays centred)")
        self.padding_mode = _checks.choice("padding_mode", padding_mode, PADDING_MODES)
        if not isinstance(bias, bool):
            raise ValueError(f"bias={bias!r}: expected True or False")
        self.kernel_size = k
        self.mask_aware = padding_mode == "zeros"
        valid = padding_mode == "none"
        self.proj = nn.Conv2d(dim, dim, k, padding=0 if valid else k // 2, groups=dim, bias=bias,
                              padding_mode="zeros" if valid else padding_mode)

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:  # (B, C, h, w)
        if not isinstance(x, torch.Tensor) or x.dim() != 4 or x.shape[1] != self.dim:
            got = tuple(x.shape) if isinstance(x, torch.Tensor) else type(x).__name__
            raise ValueError(f"x has shape {got}: expected (B, {self.dim}, h, w)")
        h, w = x.shape[-2:]
        mask = _checks.mask_for("mask", mask, (h, w))
        keep = None
        if mask is not None:
            if mask.shape[0] != x.shape[0]:
                raise ValueError(f"mask has batch {mask.shape[0]}: expected x's batch {x.shape[0]}")
            keep = (~mask)[:, None].to(x.dtype)  # (B, 1, h, w)
            x = x * keep  # padded features zeroed
        k = self.kernel_size
        if self.padding_mode == "reflect" and min(h, w) <= k // 2:
            raise ValueError(f"x has grid {(h, w)}: padding_mode='reflect' needs more than kernel_size//2 = "
                             f"{k // 2} cells per axis; use 'replicate', 'zeros' or a smaller kernel_size")
        if self.padding_mode != "none":
            out = self.proj(x)  # (B, C, h, w)
        elif h >= k and w >= k:
            p = k // 2
            out = F.pad(self.proj(x), (p, p, p, p))  # (B, C, h, w), zero on the k//2 border
        else:
            # no full window fits: a zero term, kept in the graph so the weights get (zero) gradients
            out = x.new_zeros(x.shape) + 0 * self.proj.weight.sum()  # (B, C, h, w)
        return out if keep is None else out * keep

    def extra_repr(self) -> str:
        return f"dim={self.dim}, kernel_size={self.kernel_size}, padding_mode={self.padding_mode!r}"
