"""Learned absolute 1D table (Gehring et al., 2017; BERT; ViT) with resize by interpolation.

``PE(p) = E[p]`` for integer p in [0, length); a table learned at one length is brought to
another by interpolating along the position axis, by target size (never a scale factor, whose
rounding gives off-by-one lengths, pytorch#96236), with antialias when shrinking.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from vispe import _checks

RESIZE_MODES = ("linear", "nearest", "bicubic")


def resize_table_1d(table: torch.Tensor, length: int, mode: str = "linear") -> torch.Tensor:
    """Resample a (L, C) table to (length, C) along L, aligning the end points' centres.

    Resizing to its own length is the identity. Computed in float32, cast back.
    """
    _checks.positive_int("length", length)
    _checks.choice("mode", mode, RESIZE_MODES)
    if table.dim() != 2:
        raise ValueError(f"table has shape {tuple(table.shape)}: expected (length, channels)")
    if table.shape[0] == length:
        return table
    x = table.float().t()[None, :, None, :]  # (1, C, 1, L)
    kw = {} if mode == "nearest" else {"align_corners": False, "antialias": length < table.shape[0]}
    m = {"linear": "bilinear", "bicubic": "bicubic", "nearest": "nearest"}[mode]
    out = F.interpolate(x, size=(1, length), mode=m, **kw)  # (1, C, 1, length)
    return out[0, :, 0].t().to(table.dtype)  # (length, C)


class LearnedTable1d(nn.Module):
    """A learned (length, dim) table, read at integer positions.

    Positions at or past ``length`` are resampled (``overflow="interpolate"``, the table is resized
    to cover them) or refused (``overflow="error"``) with a ValueError, never a device-side assert.
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
        if length == self.length:
            return self.weight
        if self.overflow == "error" and length > self.length:
            raise ValueError(f"length={length}: the learned table holds {self.length} positions and "
                             "overflow='error'; use overflow='interpolate' or a larger table")
        return resize_table_1d(self.weight, length, self.resize_mode)

    def forward(self, pos: torch.Tensor, length: int | None = None) -> torch.Tensor:
        """Look up integer positions ``pos`` (any shape) in the table at ``length`` entries."""
        length = self.length if length is None else length
        if pos.numel() and (pos.min() < 0 or pos.max() >= length):
            raise ValueError(f"pos spans [{int(pos.min())}, {int(pos.max())}]: expected integers in [0, {length})")
        return self.table(length)[pos.long()]  # pos.shape + (dim,)

    def resize_(self, length: int) -> "LearnedTable1d":
        """Replace the stored table by its resampling at ``length`` (at load time)."""
        with torch.no_grad():
            self.weight = nn.Parameter(resize_table_1d(self.weight.data, length, self.resize_mode))
        self.length = length
        return self
