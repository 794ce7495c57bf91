"""Rotary position embedding (RoPE; Su et al., 2021, "RoFormer").

The channels of q and k are grouped in d/2 pairs; pair i at position m is rotated by the angle
``theta_i(m) = m * base^(-2i/d)``. Then ``<R(m) q, R(n) k>`` depends on m - n only.

Two pairings (``layout``), both in use and easy to mix up (timm#2692):

* ``"half"``: pair i = channels (i, i + d/2), "rotate-half" (GPT-NeoX, EVA, timm, LLaMA-HF).
* ``"interleaved"``: pair i = channels (2i, 2i + 1) (RoFormer, Meta LLaMA, rope-vit).

Real cos/sin arithmetic only (no complex tensors), so ONNX, CoreML and XLA export work.
Angles are always computed in float32; q/k are rotated in float32 and cast back (float64 inputs
are kept in float64, for reference checks of the relative property).
"""
from __future__ import annotations

import torch

from vispe import _checks
from vispe.axis._util import compute_dtype

LAYOUTS = ("half", "interleaved")


def rope_frequencies(dim: int, base: float = 10000.0, *, device=None,
                     dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """Frequencies of the d/2 pairs, ``base^(-2i/dim)``.  # (dim/2,)"""
    _checks.divisible("dim", dim, 2, "RoPE rotates channel pairs")
    _checks.positive_float("base", base)
    i = torch.arange(dim // 2, device=device, dtype=dtype)
    return base ** (-2.0 * i / dim)


def rope_angles(pos: torch.Tensor, dim: int, base: float = 10000.0) -> torch.Tensor:
    """Angles ``pos * base^(-2i/dim)`` of each pair.  # pos.shape + (dim/2,), float32

    float64 ``pos`` gives float64 angles; anything else (ints, bf16, fp16) float32.
    """
    wd = compute_dtype(pos)
    return pos.to(wd)[..., None] * rope_frequencies(dim, base, device=pos.device, dtype=wd)


def apply_rope(x: torch.Tensor, angles: torch.Tensor, layout: str = "half") -> torch.Tensor:
    """Rotate ``x`` (..., d) by ``angles`` (broadcastable to (..., d/2)); returns x's dtype.

    Computed in float32 (float64 if ``x`` or ``angles`` is float64) and cast back.
    """
    _checks.choice("layout", layout, LAYOUTS)
    d = x.shape[-1]
    if d % 2:
        raise ValueError(f"x has shape {tuple(x.shape)}: expected an even last dimension (channel pairs)")
    if angles.shape[-1] * 2 != d:
        raise ValueError(f"angles has last dimension {angles.shape[-1]}: expected x.shape[-1] / 2 = {d // 2}")
    wd = compute_dtype(x, angles)
    cos, sin = angles.to(wd).cos(), angles.to(wd).sin()  # (..., d/2)
    xf = x.to(wd)
    if layout == "half":
        x1, x2 = xf[..., : d // 2], xf[..., d // 2:]
        out = torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1)
    else:
        x1, x2 = xf[..., 0::2], xf[..., 1::2]
        out = torch.stack([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1).flatten(-2)
    return out.to(x.dtype)


def half_to_interleaved(x: torch.Tensor) -> torch.Tensor:
    """Reorder channels (last dim) from rotate-half pairing to interleaved pairing."""
    d = _even_last_dim(x)
    return torch.stack([x[..., : d // 2], x[..., d // 2:]], dim=-1).flatten(-2)


def interleaved_to_half(x: torch.Tensor) -> torch.Tensor:
    """Reorder channels (last dim) from interleaved pairing to rotate-half pairing."""
    _even_last_dim(x)
    return torch.cat([x[..., 0::2], x[..., 1::2]], dim=-1)


def _even_last_dim(x: torch.Tensor) -> int:
    if x.dim() == 0 or x.shape[-1] % 2:
        raise ValueError(f"x has shape {tuple(x.shape)}: expected an even last dimension (channel pairs)")
    return x.shape[-1]
