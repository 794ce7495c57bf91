"""ViT's learned absolute table over the whole grid (Dosovitskiy et al., 2021, "An Image is Worth
16x16 Words"; DeiT's resampling at fine-tuning resolution).

One learned vector per grid cell, ``PE(y, x) = E[y * w + x]``, stored as ``(1, h*w, dim)`` for the
grid ``grid = (h, w)`` it was built for, initialised as timm: ``trunc_normal_(std=0.02)`` (whose
default bounds, +-2, are absolute, so in effect a normal of std 0.02).
Prefix tokens (class, register): ``num_prefix_tokens`` own learned vectors ``(1, P, dim)``.

Grid change (square or not): the table is reshaped to (dim, h, w) and resampled to the target
SIZE as ``timm.layers.resample_abs_pos_embed`` does (never a scale factor: pytorch#96236),
``interpolation`` "bicubic" (default, DeiT/timm), "bilinear", or "bucket" (NaViT's fractional
positions, Idefics3's: cell i of n reads row ``bucket(i / n)`` of the table, ``bucket_index``; no
interpolation, ``antialias`` does not apply). ``antialias``: True (default)
antialiases only when an axis shrinks (torch's antialiased bicubic uses another kernel, a=-0.5
instead of -0.75, so growing keeps the plain one); "always" antialiases also when growing, as
timm's ``resample_abs_pos_embed`` and so its ``dynamic_img_size`` ViTs do (use it to reproduce a
timm ViT at a larger size); False never. The same size returns the table itself (exact identity). ``overflow="error"``
refuses a grid larger than ``grid`` along an axis with a ValueError. At run time the resampled table is
recomputed every call (it learns); ``resize_((h, w))`` rewrites the parameter at load time.
``align_corners`` (False by default, DeiT/timm's) is ``F.interpolate``'s: True maps the corner cells of
both grids onto each other (source index ``i * (n_old - 1) / (n_new - 1)``, the ``linspace(0, n_old - 1,
n_new)`` of Qwen3-VL's vision tower, whose 48 x 48 table is resized this way, bilinear, without
antialias: ``interpolation="bilinear", align_corners=True, antialias=False``).
A state_dict saved at another grid is resampled the same way on load (its grid is recorded,
``vispe.encoding``; timm's checkpoints have no record: the grid is this one when the token count
matches, else a square, as timm assumes).

Padding mask: by default not mask-aware (the table is resampled to the whole grid and indexed by
grid cell). ``mask_aware=True`` resamples it per image to that image's valid extent (h_b, w_b) and
reads it at each token's position counted over the valid area (``vispe.coords.valid_coords``), so an
image alone and the same image padded in a batch (padding anywhere) get the same code on their valid
tokens: NaFlex's rule (SigLIP-2, Tschannen et al., 2025; timm ``NaFlexEmbeds``, which resamples its
learned table to each image's grid; ``vispe.models.naflex``). One resampling per distinct extent in
the batch (a Python loop over the extents: not for ``torch.export`` with a mask). What padding
tokens get is ``pad_value``: "edge" (default) the code of the last valid cell of their row/column;
"first" the first vector of the image's resampled table, its top-left cell's code (transformers'
``Siglip2VisionEmbeddings.resize_positional_embeddings`` fills its padded slots so); "zeros" none.
Padding tokens are hidden from attention, so the choice shows only in their own outputs (and in a
padding-leakage probe). Output ``(B|1, h*w, dim)``.
"""
from __future__ import annotations

import math

import torch
from torch import nn

from vispe import _checks, _tracing
from vispe.coords import valid_coords
from vispe.image._additive import AdditiveBase, float32_math
from vispe.registry import register

INTERPOLATIONS = ("bicubic", "bilinear", "bucket")
PAD_VALUES = ("edge", "first", "zeros")


def resample_grid_table(table: torch.Tensor, old: tuple[int, int], new: tuple[int, int], *,
                        interpolation: str = "bicubic", antialias: bool = True,
                        align_corners: bool = False) -> torch.Tensor:
    """Resample a (1, oh*ow, C) table to (1, nh*nw, C) by target size; same size is the identity.

    ``antialias``: True = only when an axis shrinks, "always" = timm's rule, False = never.
    Computed in float32, cast back. ``new`` may be symbolic (torch.export): no branch on it.
    ``interpolation="bucket"``: NaViT's fractional buckets (``bucket_index``), not the identity at the same size.
    """
    if interpolation == "bucket":
        rows, cols = bucket_index(new[0], old[0], table.device), bucket_index(new[1], old[1], table.device)
        grid = table.reshape(old[0], old[1], table.shape[-1])  # (oh, ow, C)
        return grid[rows][:, cols].reshape(1, -1, table.shape[-1])  # (1, nh*nw, C)
    if _tracing.known(old[0] == new[0]) and _tracing.known(old[1] == new[1]):
        return table
    C = table.shape[-1]
    rule = "shrink" if antialias is True else antialias == "always"
    with float32_math(table.device):
        # contiguous: torch 2.14's antialiased bilinear on this channels-last view is wrong for an output one
        # cell wide (a (9, 1) resize differed from the contiguous one by 2.3; tests/test_towers_packed.py)
        grid = table.float().reshape(1, old[0], old[1], C).permute(0, 3, 1, 2).contiguous()  # (1, C, oh, ow)
        out = _tracing.resize(grid, new, mode=interpolation, antialias=rule, align_corners=align_corners)  # (1, C, nh, nw)
        return out.permute(0, 2, 3, 1).reshape(1, -1, C).to(table.dtype)  # (1, nh*nw, C)


def bucket_index(n: int, length: int, device=None) -> torch.Tensor:
    """NaViT's (Dehghani et al., 2023) fractional position of cell i of n, i / n (its top-left corner, in
    float32, clamped below 1), bucketed into ``length`` equal buckets by the boundaries
    ``arange(1/length, 1, 1/length)`` (``right=True``): the table row read by cell i, as transformers'
    ``Idefics3VisionEmbeddings`` computes it.  # (n,) long"""
    step = 1.0 / torch.tensor(n, dtype=torch.float32, device=device)
    coords = (torch.arange(n, dtype=torch.float32, device=device) * step).clamp(max=1.0 - 1e-6)  # (n,)
    boundaries = torch.arange(1 / length, 1.0, 1 / length, device=device)  # float32, as the reference
    return torch.bucketize(coords, boundaries, right=True)


@register("learned_abs")
class LearnedAbsEncoding(AdditiveBase):
    """A learned ``(1, h*w, dim)`` table for ``grid``, resampled to other grids.

    Args:
        dim: channels.
        grid: (h, w) of the stored table (an int n means (n, n)).
        num_prefix_tokens: learned prefix vectors returned by ``prefix()`` (0: none).
        init_std: std of the truncated-normal initialisation (timm: 0.02).
        interpolation: "bicubic" (default), "bilinear" or "bucket" (NaViT / Idefics3, module docstring).
        antialias: True (default): antialias when an axis shrinks; "always": also when growing
            (timm's ``resample_abs_pos_embed``); False: never.
        overflow: "interpolate" (default) or "error" for a grid larger than ``grid``.
        mask_aware: with a padding mask, resample per image to its valid extent (module docstring).
        pad_value: with ``mask_aware``, the code of padding tokens: "edge" (default), "first"
            (SigLIP2's) or "zeros" (module docstring); another value than "edge" needs mask_aware=True.
        align_corners: ``F.interpolate``'s corner convention (module docstring; True: Qwen3-VL).
    """

    learned_prefix = True  # in a ViT, class/register tokens get learned vectors (timm's pos_embed)
    mask_aware_option = "mask_aware=True"

    def __init__(self, dim: int, *, grid, num_prefix_tokens: int = 0,
                 init_std: float = 0.02, interpolation: str = "bicubic", antialias: bool = True,
                 overflow: str = "interpolate", mask_aware: bool = False, align_corners: bool = False,
                 pad_value: str = "edge") -> None:
        super().__init__(dim, num_prefix_tokens)
        self.grid = _checks.grid_shape("grid", grid)
        _checks.positive_float("init_std", init_std)
        self.interpolation = _checks.choice("interpolation", interpolation, INTERPOLATIONS)
        if not (isinstance(antialias, bool) or antialias == "always"):
            raise ValueError(f"antialias={antialias!r}: expected True, False or 'always'")
        self.antialias = antialias
        if interpolation == "bucket" and antialias is not True:
            raise ValueError(f"antialias={antialias!r} with interpolation='bucket': buckets read table rows, "
                             "nothing is filtered (leave antialias at its default)")
        self.overflow = _checks.choice("overflow", overflow, ("interpolate", "error"))
        if not isinstance(mask_aware, bool):
            raise ValueError(f"mask_aware={mask_aware!r}: expected True or False")
        self.mask_aware = mask_aware
        self.pad_value = _checks.choice("pad_value", pad_value, PAD_VALUES)
        if pad_value != "edge" and not mask_aware:
            raise ValueError(f"pad_value={pad_value!r} with mask_aware=False: padding tokens get a value of their own "
                             "only when the table is resampled per image (mask_aware=True)")
        if not isinstance(align_corners, bool):
            raise ValueError(f"align_corners={align_corners!r}: expected True or False")
        if align_corners and interpolation == "bucket":
            raise ValueError("align_corners=True with interpolation='bucket': buckets read table rows, no corners "
                             "are aligned (leave align_corners=False)")
        self.align_corners = align_corners
        h, w = self.grid
        self.pos_embed = nn.Parameter(torch.zeros(1, h * w, dim))  # (1, h*w, dim)
        nn.init.trunc_normal_(self.pos_embed, std=init_std)

    def forward(self, shape, mask=None, *, device=None, dtype=None) -> torch.Tensor:  # (B|1, h*w, dim)
        shape, mask, device, dtype = self._inputs(shape, mask, device, dtype, self.pos_embed.dtype)
        if mask is not None and self.mask_aware:
            return self._per_image(shape, mask, device).to(dtype)
        return self._output(self._resampled(shape).to(device), mask, dtype)

    def _per_image(self, shape, mask: torch.Tensor, device) -> torch.Tensor:
        """The table resampled to each image's valid extent, read at its valid-area index.  # (B, N, dim)"""
        index = valid_coords(shape, mask, "index", device=device).long()  # (B, N, 2)
        valid = ~mask.to(device)  # (B, h, w)
        extent = torch.stack([valid.any(2).sum(1), valid.any(1).sum(1)], -1).clamp(min=1)  # (B, 2)
        out = self.pos_embed.new_zeros(mask.shape[0], shape[0] * shape[1], self.dim).to(device)  # (B, N, dim)
        for hw in torch.unique(extent, dim=0).tolist():
            rows = (extent == extent.new_tensor(hw)).all(1)  # (B,)
            table = self._resampled(tuple(hw)).to(device)[0]  # (h_b*w_b, dim)
            flat = index[rows, :, 0] * hw[1] + index[rows, :, 1]  # (b, N)
            out[rows] = table[flat]
            if self.pad_value != "edge":
                pad = mask[rows].flatten(1).to(device)[..., None]  # (b, N, 1)
                fill = table[:1] if self.pad_value == "first" else torch.zeros_like(table[:1])  # (1, dim)
                out[rows] = torch.where(pad, fill, out[rows])
        return out

    def _resampled(self, shape: tuple[int, int]) -> torch.Tensor:
        if self.overflow == "error":
            _tracing.check((shape[0] <= self.grid[0]) & (shape[1] <= self.grid[1]),
                           f"shape={shape}: larger than the learned table's grid {self.grid} and "
                           "overflow='error'; use overflow='interpolate' or resize_() the table")
        return resample_grid_table(self.pos_embed, self.grid, shape, interpolation=self.interpolation,
                                   antialias=self.antialias, align_corners=self.align_corners)  # (1, h*w, dim)

    def resize_(self, shape) -> LearnedAbsEncoding:
        """Replace the stored table by its resampling at ``shape`` = (h, w) (load time)."""
        shape = _checks.grid_shape("shape", shape)
        with torch.no_grad():
            table = resample_grid_table(self.pos_embed.data, self.grid, shape, interpolation=self.interpolation,
                                        antialias=self.antialias, align_corners=self.align_corners)
        if shape != self.grid:
            self.pos_embed = nn.Parameter(table.clone())
        self.grid = shape
        self._cache.clear()
        return self

    def table_grid(self):
        return self.grid

    def infer_grid(self, state_dict, prefix):
        """No record (timm's checkpoints): this grid when the size matches, else a square (timm)."""
        table = state_dict.get(prefix + "pos_embed")
        if table is None:
            return None
        n = table.shape[1]
        side = math.isqrt(n)
        if n == self.grid[0] * self.grid[1] or side * side != n:
            if n != self.grid[0] * self.grid[1]:
                raise ValueError(f"{prefix}pos_embed has {n} grid positions and no grid record, neither this "
                                 f"encoding's grid {self.grid} nor a square: load it with "
                                 "load_pos_embed(pos_embed, grid=(h, w)) naming its grid")
            return self.grid
        return side, side

    def load_grid_(self, state_dict, prefix, saved) -> None:
        """Resample a table saved for grid ``saved`` to this grid (``overflow="error"``: only shrink)."""
        table = state_dict.get(prefix + "pos_embed")
        if table is None:
            return
        if table.shape[1] != saved[0] * saved[1]:
            raise ValueError(f"{prefix}table_grid says grid {saved}, but {prefix}pos_embed has {table.shape[1]} rows")
        if self.overflow == "error" and (saved[0] < self.grid[0] or saved[1] < self.grid[1]):
            raise ValueError(f"{prefix}pos_embed was saved for grid {saved}, smaller than this encoding's grid "
                             f"{self.grid} and overflow='error': build it with grid={saved}, or use overflow='interpolate'")
        state_dict[prefix + "pos_embed"] = resample_grid_table(table, saved, self.grid, interpolation=self.interpolation,
                                                               antialias=self.antialias,
                                                               align_corners=self.align_corners)

    def extra_repr(self) -> str:
        return (f"dim={self.dim}, grid={self.grid}, num_prefix_tokens={self.num_prefix_tokens}, "
                f"interpolation={self.interpolation!r}, antialias={self.antialias}, overflow={self.overflow!r}, "
                f"mask_aware={self.mask_aware}" + (", align_corners=True" if self.align_corners else "")
                + (f", pad_value={self.pad_value!r}" if self.pad_value != "edge" else ""))
