"""Shared plumbing of the additive image encodings (private): inputs, coordinates, prefix, output.

* ``AdditiveBase``: checks ``shape`` / ``mask`` / ``device`` / ``dtype`` the same way for every
  additive encoding, owns the optional learned prefix vectors (``num_prefix_tokens``) and turns a
  float32 table ``(1|B, h*w, dim)`` into the contract's output (expanded to B when a mask is given,
  cast to ``dtype`` at the very end).
* ``axis_positions``: per-axis token positions of a grid or of each image's valid area.
* ``centred``: a fixed code minus its mean over each image's valid area (``center=True`` of the fixed
  codes ``sine``, ``sincos2d``, ``axis2d`` with a sinusoidal axis, ``normidx2d``).

Why centre (FIELD-NOTES, measured 2026-11-24 on ``digits_content_position``): a fixed sin-cos code
on a small grid is mostly a constant. At an 8x8 grid with temperature 10000 and 64 channels
(``sincos2d``), 40 channels barely vary over the grid (standard deviation below 0.05: the low
frequencies, positions 0..7 times frequencies down to 1e-4), so the code adds to every token a
constant part of RMS 0.65 against 0.28 for the part that varies with position; models then fit the training set far worse than with a learned table (train
accuracy 0.49-0.89 against 0.98-1.00). Subtracting the code's mean over the grid leaves only the
part that carries position and made the same runs fit 0.98-0.99 (test 0.78 against 0.60-0.69), as a
learned table does. (A lower temperature did not reliably help: it left a constant part of RMS 0.60.)

The rule of ``center=True``: the mean is taken over the tokens the code is a function of. A
mask-aware encoding given a padding mask: over each image's valid (unpadded) tokens, and padding
tokens get 0 (the centred code's "no position"; the attention's key-padding mask hides them), so an
image alone and the same image padded in a batch keep the same code on their valid area. Otherwise
(no mask, or an encoding that ignores the mask): over the whole grid, the same for every image.
"""
from __future__ import annotations

import torch
from torch import nn

from vispe import _checks
from vispe.axis.learned import resize_table_1d
from vispe.coords import VALID_MODES as COORD_MODES, float32_math, grid_coords, valid_coords  # noqa: F401
from vispe.encoding import AdditiveEncoding


def axis_positions(shape: tuple[int, int], mask: torch.Tensor | None, mode: str, *,
                   mask_aware: bool, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """Float32 positions ``(py, px)`` of the tokens along y and along x, broadcastable to (B, h, w).

    Without a mask (or when not ``mask_aware``): ``py`` is (1, h, 1), ``px`` is (1, 1, w), the
    ``vispe.coords.grid_coords`` convention ``mode``. With a mask and ``mask_aware``: both are
    (B, h, w), ``vispe.coords.valid_coords`` (counted over each image's valid area), so an image
    alone and the same image padded in a batch get the same positions on their valid area.
    """
    h, w = shape
    if mask is None or not mask_aware:
        yx = grid_coords(h, w, mode, device=device).view(h, w, 2)  # (h, w, 2)
        return yx[:, :1, 0].reshape(1, h, 1), yx[:1, :, 1].reshape(1, 1, w)
    yx = valid_coords(shape, mask, mode, device=device).view(mask.shape[0], h, w, 2)  # (B, h, w, 2)
    return yx[..., 0], yx[..., 1]  # (B, h, w) each


def centred(table: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
    """``table`` (B|1, N, C) minus its mean over each image's valid tokens (``mask`` (B, h, w), True =
    padding; None: all N tokens), padding tokens set to 0 (module docstring).  # (B|1, N, C)"""
    if mask is None:
        return table - table.mean(1, keepdim=True)
    valid = (~mask).flatten(1)[..., None].to(table.dtype)  # (B, N, 1)
    mean = (table * valid).sum(1, keepdim=True) / valid.sum(1, keepdim=True).clamp(min=1)  # (B, 1, C)
    return (table - mean) * valid  # (B, N, C)


def check_center(center) -> bool:
    if not isinstance(center, bool):
        raise ValueError(f"center={center!r}: expected True or False")
    return center


def fit_axis_tables(state_dict: dict, prefix: str, saved: tuple[int, int], tables: dict, *,
                    keep_first: bool) -> None:
    """Load-time rule of per-axis learned tables saved for grid ``saved`` (``table_grid``).

    ``tables`` maps a state_dict key (after ``prefix``) to this encoding's ``LearnedTable1d`` of
    the y then the x axis. A saved table longer than this one: ``keep_first`` keeps its first
    rows (tables read by index, DETR's row/col), else it is resampled (tables spanning the grid);
    shorter: resampled by target size (``resize_mode``), or a ValueError naming both grids when
    the table has ``overflow="error"``.
    """
    own = tuple(t.length for t in tables.values())
    for (key, table), n_saved, n_own in zip(tables.items(), saved, own):
        weight = state_dict.get(prefix + key)
        if weight is None:
            continue
        if weight.shape[0] != n_saved:
            raise ValueError(f"{prefix}table_grid says grid {saved}, but {prefix + key} has {weight.shape[0]} rows")
        if n_own > n_saved and table.overflow == "error":
            raise ValueError(f"{prefix + key} was saved for grid {saved}, shorter than this encoding's grid {own} "
                             "and overflow='error': build it with that grid, or use overflow='interpolate'")
        if keep_first and n_saved >= n_own:
            state_dict[prefix + key] = weight[:n_own]
        else:
            state_dict[prefix + key] = resize_table_1d(weight, n_own, table.resize_mode)  # (n_own, C)


class AdditiveBase(AdditiveEncoding):
    """Base of vispe's additive image encodings: common checks, prefix vectors, output.

    ``num_prefix_tokens`` P > 0 gives the encoding P learned prefix vectors ``(1, P, dim)``
    (truncated normal, std 0.02, as timm's ``cls_token`` position), returned by ``prefix()``;
    with P = 0 ``prefix()`` is None and prefix tokens get no position.
    """

    def __init__(self, dim: int, num_prefix_tokens: int = 0) -> None:
        super().__init__()
        self.dim = _checks.positive_int("dim", dim)
        self.num_prefix_tokens = _checks.positive_int("num_prefix_tokens", num_prefix_tokens, allow_zero=True)
        self.prefix_embed = None
        if num_prefix_tokens:
            self.prefix_embed = nn.Parameter(torch.zeros(1, num_prefix_tokens, dim))  # (1, P, dim)
            nn.init.trunc_normal_(self.prefix_embed, std=0.02)

    def prefix(self, *, device=None, dtype=None) -> torch.Tensor | None:  # (1, P, dim) or None
        if self.prefix_embed is None:
            return None
        return self.prefix_embed.to(device=device or self.prefix_embed.device,
                                    dtype=dtype or self.prefix_embed.dtype)

    def _inputs(self, shape, mask, device, dtype, default_dtype=torch.float32):
        """Checked ``(h, w), mask, device, dtype`` of a forward call."""
        shape = _checks.grid_shape("shape", shape)
        mask = _checks.mask_for("mask", mask, shape)
        device = self.resolve_device(device, mask)
        if dtype is None:
            dtype = default_dtype
        if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
            raise ValueError(f"dtype={dtype!r}: expected a floating torch.dtype")
        return shape, mask, device, dtype

    @staticmethod
    def _output(table: torch.Tensor, mask: torch.Tensor | None, dtype: torch.dtype) -> torch.Tensor:
        """A float32 table (1|B, N, C) as the contract's output: B rows when a mask is given."""
        if mask is not None and table.shape[0] != mask.shape[0]:
            table = table.expand(mask.shape[0], -1, -1)  # (B, N, C)
        return table.to(dtype)

    def extra_repr(self) -> str:
        return f"dim={self.dim}, num_prefix_tokens={self.num_prefix_tokens}"

