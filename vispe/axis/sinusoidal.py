"""Fixed absolute 1D encodings: raw index, normalised index, single- and multi-frequency sinusoids.

All take a tensor of positions ``pos`` of any shape (float, fractional positions allowed) and
return ``pos.shape + (dim,)`` in float32 (compute in float32, cast later; float64 positions keep
float64, for reference checks). Under autocast the result stays float32.
"""
from __future__ import annotations

import torch

from vispe import _checks
from vispe.axis._util import compute_dtype

LAYOUTS = ("concat", "interleaved")


def raw_index(pos: torch.Tensor) -> torch.Tensor:
    """The position itself as a 1-channel code: ``PE(p) = p``.  # (..., 1)"""
    return pos.to(compute_dtype(pos))[..., None]


def normalized_index(pos: torch.Tensor, length: int) -> torch.Tensor:
    """Index divided by the last index: ``PE(p) = p / (T - 1)``, in [0, 1] on 0..T-1.  # (..., 1)

    ``length`` is T; for T = 1 the code is 0.
    """
    _checks.positive_int("length", length)
    return (pos.to(compute_dtype(pos)) / max(length - 1, 1))[..., None]


def single_sinusoid(pos: torch.Tensor, frequency: float = 1.0, phase: float = 0.0) -> torch.Tensor:
    """One sinusoid ``PE(p) = sin(frequency * p + phase)``.  # (..., 1)"""
    return torch.sin(pos.to(compute_dtype(pos)) * frequency + phase)[..., None]


def sinusoid_frequencies(dim: int, temperature: float = 10000.0, *, device=None,
                         dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """The dim/2 frequencies of Vaswani et al.: ``omega_i = temperature^(-2i/dim)``.  # (dim/2,)"""
    _checks.divisible("dim", dim, 2, "sin/cos pairs")
    _checks.positive_float("temperature", temperature)
    i = torch.arange(dim // 2, device=device, dtype=dtype)
    return temperature ** (-2.0 * i / dim)


def sinusoidal(pos: torch.Tensor, dim: int, temperature: float = 10000.0,
               layout: str = "concat") -> torch.Tensor:
    """Multi-frequency sinusoidal encoding (Vaswani et al., 2017, "Attention Is All You Need").

    ``PE(p)[2i] = sin(p * omega_i)``, ``PE(p)[2i+1] = cos(p * omega_i)``,
    ``omega_i = temperature^(-2i/dim)``.

    ``layout="interleaved"`` gives the paper's order [sin w0, cos w0, sin w1, cos w1, ...] (as in
    DETR's stacked sin/cos); ``layout="concat"`` gives [sin w0..w_{d/2-1}, cos w0..w_{d/2-1}]
    (MAE, big_vision, timm). Returns ``pos.shape + (dim,)`` float32 (float64 for float64 ``pos``).
    """
    _checks.choice("layout", layout, LAYOUTS)
    wd = compute_dtype(pos)
    omega = sinusoid_frequencies(dim, temperature, device=pos.device, dtype=wd)  # (dim/2,)
    angles = pos.to(wd)[..., None] * omega  # (..., dim/2)
    if layout == "concat":
        return torch.cat([angles.sin(), angles.cos()], dim=-1)  # (..., dim)
    return torch.stack([angles.sin(), angles.cos()], dim=-1).flatten(-2)  # (..., dim)
