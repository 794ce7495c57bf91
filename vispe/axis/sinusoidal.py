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


def sinusoid_frequencies(dim: int, temperature: float = 10000.0, *, endpoint: bool = False, device=None,
                         dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """The n = dim/2 frequencies of Vaswani et al.: ``omega_i = temperature^(-i/n)``.  # (dim/2,)

    ``endpoint=True`` spaces the exponents up to and including 1 (the lowest frequency is exactly
    1/temperature): ``omega_i = temperature^(-i/(n-1))``, big_vision's ``posemb_sincos_2d``
    (needs n >= 2). The default (MAE, timm, Vaswani) stops one step short of it.
    """
    _checks.divisible("dim", dim, 2, "sin/cos pairs")
    _checks.positive_float("temperature", temperature)
    if not isinstance(endpoint, bool):
        raise ValueError(f"endpoint={endpoint!r}: expected True or False")
    n = dim // 2
    if endpoint and n < 2:
        raise ValueError(f"dim={dim} with endpoint=True: expected at least 2 frequencies (dim >= 4)")
    i = torch.arange(n, device=device, dtype=dtype)
    return temperature ** (-i / (n - 1 if endpoint else n))


def sinusoidal(pos: torch.Tensor, dim: int, temperature: float = 10000.0,
               layout: str = "concat", *, endpoint: bool = False) -> torch.Tensor:
    """Multi-frequency sinusoidal encoding (Vaswani et al., 2017, "Attention Is All You Need").

    ``PE(p)[2i] = sin(p * omega_i)``, ``PE(p)[2i+1] = cos(p * omega_i)``,
    ``omega_i = temperature^(-2i/dim)``.

    ``layout="interleaved"`` gives the paper's order [sin w0, cos w0, sin w1, cos w1, ...] (as in
    DETR's stacked sin/cos); ``layout="concat"`` gives [sin w0..w_{d/2-1}, cos w0..w_{d/2-1}]
    (MAE, big_vision, timm). ``endpoint``: see ``sinusoid_frequencies`` (big_vision: True).
    Returns ``pos.shape + (dim,)`` float32 (float64 for float64 ``pos``).
    """
    _checks.choice("layout", layout, LAYOUTS)
    wd = compute_dtype(pos)
    omega = sinusoid_frequencies(dim, temperature, endpoint=endpoint, device=pos.device, dtype=wd)  # (dim/2,)
    angles = pos.to(wd)[..., None] * omega  # (..., dim/2)
    if layout == "concat":
        return torch.cat([angles.sin(), angles.cos()], dim=-1)  # (..., dim)
    return torch.stack([angles.sin(), angles.cos()], dim=-1).flatten(-2)  # (..., dim)
