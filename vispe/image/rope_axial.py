"""2D axial RoPE (Heo et al., ECCV 2024, "Rotary Position Embedding for Vision Transformer";
also EVA-02 and timm's ``RotaryEmbeddingCat``).

The head_dim/2 channel pairs are split between the two axes, **y first**:

    angle_k(y, x) = y * f_k              for k = 0 .. head_dim/4 - 1
    angle_k(y, x) = x * f_(k - head_dim/4)  for k = head_dim/4 .. head_dim/2 - 1
    f_j = base^(-4 j / head_dim)         (``vispe.axis.rope.rope_frequencies(head_dim / 2, base)``)

so ``<R(p) q, R(p') k>`` depends only on the 2D offset p - p'. rope-vit puts x first
(``cat([freqs_x, freqs_y])``); vispe keeps its (y, x) order everywhere, so converting rope-vit
weights means swapping the two quarters of pairs. ``base`` defaults to 100, rope-vit's theta for
its axial variant (``compute_axial_cis(..., theta=100.0)``); RoFormer's 1D default is 10000.

Input: grid ``shape`` (h, w), optional padding mask (B, h, w). Output: float32 angles
``(B|1, 1, h*w, head_dim/2)`` (the same for every head). Grid change: angles recompute at any
(h, w), cached per (h, w, device). Prefix tokens: left unrotated (the attention prepends zeros).
Coordinates, mask handling and train-time shift/jitter: see ``vispe.image._rotary``.
"""
from __future__ import annotations

import torch

from vispe import _checks
from vispe.axis.rope import rope_frequencies
from vispe.image._rotary import RotaryBase
from vispe.registry import register


@register("rope_axial")
class RopeAxial(RotaryBase):
    """Axial 2D RoPE, y on the first head_dim/4 pairs, x on the next head_dim/4.

    Args: ``base`` (theta, default 100) and those of ``vispe.image._rotary.RotaryBase``:
    ``head_dim`` (multiple of 4), ``num_heads``, ``dim``, ``grid``, ``num_prefix_tokens``,
    ``layout`` ("half" | "interleaved"), ``coords`` ("index" | "normalized" | "centered"),
    ``scale``, ``shift``, ``jitter``.
    """

    def __init__(self, head_dim: int, num_heads: int, *, base: float = 100.0, dim: int | None = None,
                 grid=None, num_prefix_tokens: int = 0, layout: str = "half", coords: str = "index",
                 scale: float = 1.0, shift: float = 0.0, jitter: float = 0.0) -> None:
        super().__init__(head_dim, num_heads, dim=dim, grid=grid, num_prefix_tokens=num_prefix_tokens,
                         layout=layout, coords=coords, scale=scale, shift=shift, jitter=jitter)
        self.base = _checks.positive_float("base", base)

    def angles(self, coords: torch.Tensor) -> torch.Tensor:
        f = rope_frequencies(self.head_dim // 2, self.base, device=coords.device)  # (head_dim/4,)
        y = coords[..., 0, None] * f  # (B|1, N, head_dim/4)
        x = coords[..., 1, None] * f  # (B|1, N, head_dim/4)
        return torch.cat([y, x], dim=-1)[:, None]  # (B|1, 1, N, head_dim/2)

    def grid_angles(self, shape, mask, device) -> torch.Tensor:
        if mask is not None or self._augmenting():
            return super().grid_angles(shape, mask, device)
        key = ("rope_axial", shape[0], shape[1], device, torch.float32)
        return self.cached(key, lambda: super(RopeAxial, self).grid_angles(shape, None, device))

    def fixed_key(self) -> tuple | None:
        if self._augmenting():
            return None
        return ("rope_axial", self.head_dim, self.base, self.coords, self.scale)

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, base={self.base:g}"
