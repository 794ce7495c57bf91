"""Learned absolute 1D table (Gehring et al., 2017; BERT; ViT) with resize by interpolation.

``PE(p) = E[p]`` for integer p in [0, length); a table learned at one length is brought to
another by interpolating along the position axis, by target size (never a scale factor, whose
rounding gives off-by-one lengths, pytorch#96236), with antialias when shrinking. Fractional
positions read the table by linear interpolation between the two neighbouring rows.
"""
from __future__ import annotations

import math

import torch
from torch import nn

from vispe import _checks, _tracing
from vispe.axis._util import compute_dtype

RESIZE_MODES = ("linear", "nearest", "bicubic")


def resize_table_1d(table: torch.Tensor, length: int, mode: str = "linear") -> torch.Tensor:
    """Resample a (L, C) table to (length, C) along L (half-pixel convention, align_corners=False).

    Each entry is the value at the centre of its cell when [0, L) is stretched to [0, length), as
    in timm/DeiT. Resizing to its own length is the identity. Computed in float32 (float64 for a
    float64 table), cast back.
    """
    if not isinstance(length, torch.SymInt):  # a symbolic length (torch.export) is kept as is
        _checks.positive_int("length", length)
    _checks.choice("mode", mode, RESIZE_MODES)
    if table.dim() != 2:
        raise ValueError(f"table has shape {tuple(table.shape)}: expected (length, channels)")
    if _tracing.known(table.shape[0] == length):
        return table
    x = table.to(compute_dtype(table)).t()[None, :, None, :]  # (1, C, 1, L)
    m = {"linear": "bilinear", "bicubic": "bicubic", "nearest": "nearest"}[mode]
    out = _tracing.resize(x, (1, length), mode=m, antialias="shrink", align_corners=False)  # (1, C, 1, length)
    return out[0, :, 0].t().to(table.dtype)  # (length, C)


def interpolate_rows(table: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
    """Read a (L, C) table at positions ``pos`` in [0, L - 1] (any shape).  # pos.shape + (C,)

    Integer positions are exact rows; a fractional p gives ``(1 - t) E[floor p] + t E[floor p + 1]``
    with ``t = p - floor p``. Positions outside [0, L - 1] raise a ValueError.
    """
    if table.dim() != 2:
        raise ValueError(f"table has shape {tuple(table.shape)}: expected (length, channels)")
    n = table.shape[0]
    if pos.numel() and (pos.min() < 0 or pos.max() > n - 1):
        lo, hi = float(pos.detach().min()), float(pos.detach().max())
        raise ValueError(f"pos spans [{lo:g}, {hi:g}]: expected positions in [0, {n - 1}] (the table's length={n})")
    if not pos.is_floating_point():
        return table[pos.long()]  # pos.shape + (C,)
    lo = pos.detach().floor().long().clamp(max=n - 1)  # pos.shape
    hi = (lo + 1).clamp(max=n - 1)  # pos.shape
    t = (pos - lo).to(table.dtype)[..., None]  # pos.shape + (1,)
    return table[lo] * (1 - t) + table[hi] * t  # pos.shape + (C,)


class LearnedTable1d(nn.Module):
    """A learned (length, dim) table ``PE(p) = E[p]``, read at (fractional) positions in [0, length).

    Positions past the table (``pos.max() > length - 1`` with no explicit ``length``) are served by
    resampling (``overflow="interpolate"``: the table is resized to ``ceil(pos.max()) + 1`` entries)
    or refused (``overflow="error"``) with a ValueError naming the length, never a device-side assert.
    """

    def __init__(self, length: int, dim: int, *, init_std: float = 0.02, overflow: str = "interpolate",
                 resize_mode: str = "linear") -> None:
        super().__init__()
        self.length = _checks.positive_int("length", length)
        self.dim = _checks.positive_int("dim", dim)
        self.overflow = _checks.choice("overflow", overflow, ("interpolate", "error"))
        self.resize_mode = _checks.choice("resize_mode", resize_mode, RESIZE_MODES)
        self.weight = nn.Parameter(torch.randn(length, dim) * init_std)  # (length, dim)

    def table(self, length: int) -> torch.Tensor:
        """The table at ``length`` entries: the stored one, or resampled to that length."""
        if _tracing.known(length == self.length):
            return self.weight
        if self.overflow == "error":
            _tracing.check(length <= self.length, f"length={length}: the learned table holds {self.length} "
                           "positions and overflow='error'; use overflow='interpolate' or a larger table")
        return resize_table_1d(self.weight, length, self.resize_mode)

    def forward(self, pos: torch.Tensor, length: int | None = None) -> torch.Tensor:
        """Read positions ``pos`` (any shape) in the table at ``length`` entries.  # pos.shape + (dim,)

        ``length=None`` reads the stored table, resized as ``overflow`` says when ``pos`` goes past it.
        Fractional positions interpolate linearly between rows (see ``interpolate_rows``).
        """
        if length is None:
            length = self.length
            top = float(pos.detach().max()) if pos.numel() else 0.0
            if top > self.length - 1:
                if self.overflow == "error":
                    raise ValueError(f"pos reaches {top:g}: the learned table holds length={self.length} "
                                     f"positions (0..{self.length - 1}) and overflow='error'; use "
                                     "overflow='interpolate' or a larger table")
                length = math.ceil(top) + 1
        _checks.positive_int("length", length)
        return interpolate_rows(self.table(length), pos)  # pos.shape + (dim,)

    def resize_(self, length: int) -> LearnedTable1d:
        """Replace the stored table by its resampling at ``length`` (at load time)."""
        with torch.no_grad():
            self.weight = nn.Parameter(resize_table_1d(self.weight.data, length, self.resize_mode))
        self.length = length
        return self
