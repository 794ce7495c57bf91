"""Joint 2D relative position bias (Swin, Liu et al., ICCV 2021; BEiT; timm's ``RelPosBias``).

A learned table ``T`` ((2h-1)(2w-1), heads) for a window ``grid=(h, w)``; the logit bias of query
token i at (y_i, x_i) and key token j is

    bias[head, i, j] = T[(y_i - y_j + h - 1) * (2w - 1) + (x_i - x_j + w - 1), head]

(query minus key, row-major over (dy, dx): the index of timm's ``gen_relative_position_index``).
Table init: truncated normal, std 0.02, as Swin.

Grid change: at another (h', w') the table, seen as an image (heads, 2h-1, 2w-1), is resized
by target size to (2h'-1, 2w'-1) (``resize_mode`` "bicubic", default, or "bilinear";
align_corners=False; antialias when shrinking), as timm's ``resize_rel_pos_bias_table_simple``:
at run time (differentiable, the stored table unchanged) or for good with ``resize_(shape)``.
The same grid uses the table as is. A state_dict saved for another window is resized the same way
on load (its grid is recorded, ``vispe.encoding``), never read with swapped axes (3x5 vs 5x3).

Output ``(1, heads, P+N, P+N)``. Padding mask: the bias does not depend on it (not mask-aware);
padded keys are hidden by the attention's key-padding mask. Prefix tokens: ``vispe.image._bias``.
"""
from __future__ import annotations

import math

import torch
from torch import nn

from vispe import _checks, _tracing
from vispe.coords import grid_coords
from vispe.image._bias import BiasBase, gather_bias
from vispe.registry import register

RESIZE_MODES = ("bicubic", "bilinear")


def relative_position_index(h: int, w: int, *, device=None) -> torch.Tensor:
    """Swin/timm joint relative index into a ((2h-1)(2w-1),) table.  # (h*w, h*w) long"""
    c = grid_coords(h, w, device=device, dtype=torch.long)  # (N, 2) as (y, x)
    d = c[:, None, :] - c[None, :, :]  # (N, N, 2) query minus key
    return (d[..., 0] + h - 1) * (2 * w - 1) + (d[..., 1] + w - 1)  # (N, N)


def resize_relative_table(table: torch.Tensor, src: tuple[int, int], dst: tuple[int, int],
                          mode: str = "bicubic") -> torch.Tensor:
    """Resample a ((2h-1)(2w-1), C) table of window ``src`` to window ``dst``, by target size.

    Float32 math, returns the table's dtype; ``src == dst`` returns ``table`` itself. ``dst`` may
    be symbolic (torch.export): ``vispe._tracing.resize`` records no branch on it.
    """
    _checks.choice("resize_mode", mode, RESIZE_MODES)
    (sh, sw), (dh, dw) = src, dst
    if _tracing.known(sh == dh) and _tracing.known(sw == dw):
        return table
    C = table.shape[-1]
    img = table.float().t().reshape(1, C, 2 * sh - 1, 2 * sw - 1)  # (1, C, 2h-1, 2w-1)
    out = _tracing.resize(img, (2 * dh - 1, 2 * dw - 1), mode=mode, antialias="shrink",
                          align_corners=False)  # (1, C, 2h'-1, 2w'-1)
    return out.reshape(C, -1).t().to(table.dtype)  # ((2h'-1)(2w'-1), C)


@register("relbias")
class RelBias(BiasBase):
    """Swin's joint relative position bias for a window ``grid`` (required).

    Args: ``num_heads``, ``num_prefix_tokens``, ``grid`` (h, w), ``resize_mode`` ("bicubic" |
    "bilinear"), and ``dim`` / ``head_dim`` (checked only).
    """

    def __init__(self, num_heads: int, num_prefix_tokens: int = 0, *, grid=None,
                 resize_mode: str = "bicubic", dim: int | None = None, head_dim: int | None = None) -> None:
        if grid is None:
            raise ValueError("grid=None: expected the (h, w) window the relative table is built for")
        super().__init__(num_heads, num_prefix_tokens, dim=dim, head_dim=head_dim, grid=grid)
        self.resize_mode = _checks.choice("resize_mode", resize_mode, RESIZE_MODES)
        h, w = self.grid
        self.table = nn.Parameter(torch.empty((2 * h - 1) * (2 * w - 1), num_heads))  # (L, heads)
        nn.init.trunc_normal_(self.table, std=0.02)

    def table_for(self, shape: tuple[int, int]) -> torch.Tensor:
        """The table at grid ``shape``, resized from the stored one if needed.  # (L', heads)"""
        return resize_relative_table(self.table, self.grid, shape, self.resize_mode)

    def grid_bias(self, shape, device, q=None) -> torch.Tensor:
        h, w = shape
        index = self.cached(("relbias_index", h, w, device, torch.long),
                            lambda: relative_position_index(h, w, device=device))  # (N, N)
        table = self.table_for(shape).to(device, torch.float32)  # (L', heads)
        return gather_bias(table, index)  # (1, heads, N, N)

    @torch.no_grad()
    def resize_(self, shape) -> RelBias:
        """Resize the stored table to window ``shape`` for good (load time)."""
        shape = _checks.grid_shape("shape", shape)
        self.table = nn.Parameter(self.table_for(shape).detach().clone())
        self.grid = shape
        return self

    def table_grid(self):
        return self.grid

    def infer_grid(self, state_dict, prefix):
        """No record (older checkpoints): this window when the size matches, else a square one."""
        table = state_dict.get(prefix + "table")
        if table is None:
            return None
        rows, (h, w) = table.shape[0], self.grid
        side = (math.isqrt(rows) + 1) // 2
        if rows == (2 * h - 1) * (2 * w - 1):
            return self.grid
        if (2 * side - 1) ** 2 == rows:
            return side, side
        raise ValueError(f"{prefix}table has {rows} rows and no grid record, neither this encoding's window "
                         f"{self.grid} ({(2 * h - 1) * (2 * w - 1)} rows) nor a square one: build it with its grid")

    def load_grid_(self, state_dict, prefix, saved) -> None:
        """Resize a table saved for window ``saved`` to this window (as at run time)."""
        table = state_dict.get(prefix + "table")
        if table is None:
            return
        want = (2 * saved[0] - 1) * (2 * saved[1] - 1)
        if table.shape[0] != want:
            raise ValueError(f"{prefix}table_grid says grid {saved} ({want} rows), but {prefix}table has "
                             f"{table.shape[0]} rows")
        state_dict[prefix + "table"] = resize_relative_table(table, saved, self.grid, self.resize_mode)

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, grid={self.grid}, resize_mode={self.resize_mode!r}"
