"""Position targets of Islam, Jia & Bruce (ICLR 2020, "How Much Position Information Do
Convolutional Neural Networks Encode?"), at any resolution, values in [0, 1].

With ``y = i / (h - 1)`` and ``x = j / (w - 1)`` the normalised row / column of pixel (i, j)
(the ``"normalized"`` mode of ``vispe.coords.grid_coords``; 0 on a length-1 axis):

| name | map | varies along |
|---|---|---|
| ``H`` | ``x`` | x (left 0 -> right 1), constant down each column |
| ``V`` | ``y`` | y (top 0 -> bottom 1), constant along each row |
| ``G`` | ``exp(-((y-.5)^2 + (x-.5)^2) / (2 sigma^2))``, min-max scaled to [0, 1] | both (centre 1) |
| ``HS`` | ``(1 + cos(2 pi k y)) / 2`` | y: horizontal stripes (each row constant), k periods |
| ``VS`` | ``(1 + cos(2 pi k x)) / 2`` | x: vertical stripes (each column constant), k periods |

The paper names the gradients by the direction they run in (H runs horizontally) and the stripes
by the direction the stripes lie in (HS: horizontal bands, so the value changes from row to row);
this is the reading of its Figure 3 used by public reproductions, pinned by the tests.

Maps are computed in float64 and rounded to multiples of 2**-24 before the cast, so values that
are equal in exact arithmetic (mirror positions of G and the stripes) are equal bit for bit: their
ranks tie, and the Spearman correlation of a map with its inverse ``1 - t`` is exactly -1.
"""
from __future__ import annotations

import math

import torch

from vispe import _checks

TARGETS = ("H", "V", "G", "HS", "VS")


def target_map(name: str, shape, *, sigma: float = 0.25, periods: int = 2,
               device=None, dtype=torch.float32) -> torch.Tensor:
    """One target map ``name`` (see the module docstring) on an (h, w) grid.  # (h, w) in [0, 1]

    ``sigma`` is the Gaussian's standard deviation in units of the image side; ``periods`` the
    number of cosine periods of the stripes across the image.
    """
    _checks.choice("name", name, TARGETS)
    h, w = _checks.grid_shape("shape", shape)
    _checks.positive_float("sigma", sigma)
    _checks.positive_int("periods", periods)
    y = _axis(h, device)[:, None].expand(h, w)  # (h, w) float64
    x = _axis(w, device)[None, :].expand(h, w)  # (h, w) float64
    if name == "H":
        out = x
    elif name == "V":
        out = y
    elif name == "G":
        g = torch.exp(-((y - 0.5) ** 2 + (x - 0.5) ** 2) / (2 * sigma ** 2))  # (h, w)
        span = g.max() - g.min()
        out = (g - g.min()) / span if span > 0 else torch.ones_like(g)
    elif name == "HS":
        out = (1 + torch.cos(2 * math.pi * periods * y)) / 2
    else:  # VS
        out = (1 + torch.cos(2 * math.pi * periods * x)) / 2
    return (torch.round(out * 2.0 ** 24) / 2.0 ** 24).to(dtype)  # (h, w)


def _axis(n: int, device) -> torch.Tensor:
    i = torch.arange(n, device=device, dtype=torch.float64)  # (n,)
    return i / (n - 1) if n > 1 else torch.zeros_like(i)


def target_stack(names=TARGETS, shape=(32, 32), **kwargs) -> torch.Tensor:
    """Several target maps stacked in the order of ``names``.  # (T, h, w)"""
    names = tuple(names)
    if not names:
        raise ValueError("names=(): expected at least one of " + ", ".join(TARGETS))
    return torch.stack([target_map(n, shape, **kwargs) for n in names])  # (T, h, w)
