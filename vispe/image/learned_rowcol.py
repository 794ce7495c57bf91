"""DETR's learned row and column tables (Carion et al., 2020, ``PositionEmbeddingLearned``).

Two learned 1D tables, ``R`` (rows, max_size[0] x dim/2) and ``C`` (columns, max_size[1] x dim/2)::

    PE(y, x) = [ R[y] , C[x] ]        y channels FIRST                    # (dim,)

Note: DETR's own module concatenates [C[x], R[y]] (x first) while its sine puts y first; vispe
puts y first in both. Tokens at (y, x) = divmod(i, w), y in 0..h-1, x in 0..w-1.

Grid change: a grid within ``max_size`` reads the first h rows / w columns (DETR). Past it, DETR
hits a device-side assert (detr#76); here ``overflow="interpolate"`` resamples the whole 1D table
to the needed length by target size (``vispe.axis.learned.resize_table_1d``, ``resize_mode``), and
``overflow="error"`` raises a ValueError. ``resize_((h, w))`` does at load time what ``forward``
does at run time: a table shorter than the grid is resampled to it (``max_size`` grows), a longer
one is kept, so the code at (h, w) does not change (rebuild optimizers after it). Loading a
state_dict of another ``max_size`` (``vispe.encoding``): a longer table keeps its first rows, a
shorter one is resampled (``overflow="interpolate"``) or refused (``"error"``).

Padding mask: not mask-aware (positions are grid indices), but with DETR's bottom/right padding
the indices on an image's valid area do not depend on the padding. Output ``(B|1, h*w, dim)``.
"""
from __future__ import annotations

import torch
from torch import nn

from vispe import _checks
from vispe.axis.learned import LearnedTable1d
from vispe.image._additive import AdditiveBase, fit_axis_tables, float32_math
from vispe.registry import register

INITS = ("uniform", "trunc_normal")


@register("learned_rowcol")
class LearnedRowColEncoding(AdditiveBase):
    """Learned row / column tables of ``dim/2`` channels each (y first).

    Args:
        dim: channels, even.
        max_size: (rows, columns) the tables hold (DETR: 50 x 50).
        overflow: "interpolate" or "error" past ``max_size``.
        resize_mode: 1D resampling past ``max_size``: "linear" (default), "bicubic" or "nearest".
        init: "uniform" (DETR's ``nn.init.uniform_``, U(0, 1)) or "trunc_normal" (std 0.02).
        num_prefix_tokens: learned prefix vectors returned by ``prefix()`` (0: none).
    """

    def __init__(self, dim: int, *, max_size=(50, 50), overflow: str = "interpolate",
                 resize_mode: str = "linear", init: str = "uniform", num_prefix_tokens: int = 0) -> None:
        _checks.divisible("dim", dim, 2, "dim/2 channels per axis")
        super().__init__(dim, num_prefix_tokens)
        rows, cols = _checks.grid_shape("max_size", max_size)
        _checks.choice("init", init, INITS)
        self.init = init
        self.row = LearnedTable1d(rows, dim // 2, overflow=overflow, resize_mode=resize_mode)  # y table
        self.col = LearnedTable1d(cols, dim // 2, overflow=overflow, resize_mode=resize_mode)  # x table
        for table in (self.row, self.col):
            if init == "uniform":
                nn.init.uniform_(table.weight)
            else:
                nn.init.trunc_normal_(table.weight, std=0.02)

    @property
    def max_size(self) -> tuple[int, int]:
        return self.row.length, self.col.length

    def forward(self, shape, mask=None, *, device=None, dtype=None) -> torch.Tensor:  # (B|1, h*w, dim)
        (h, w), mask, device, dtype = self._inputs(shape, mask, device, dtype, self.row.weight.dtype)
        with float32_math(device):
            ey = _axis_table(self.row, h, "rows", device)  # (h, dim/2)
            ex = _axis_table(self.col, w, "columns", device)  # (w, dim/2)
            table = torch.cat([ey[:, None].expand(h, w, -1), ex[None].expand(h, w, -1)], dim=-1)  # (h, w, dim)
        return self._output(table.reshape(1, h * w, self.dim), mask, dtype)

    def resize_(self, shape) -> "LearnedRowColEncoding":
        """Make the tables cover grid ``shape`` = (h, w) at load time, as ``forward`` does at run time.

        A table shorter than the grid is resampled to the grid's length (``max_size`` grows); a
        longer one is kept (the grid reads its first entries), so the code at ``shape`` is unchanged.
        """
        h, w = _checks.grid_shape("shape", shape)
        for table, n in ((self.row, h), (self.col, w)):
            if n > table.length:
                table.resize_(n)
        self._cache.clear()
        return self

    def table_grid(self):
        return self.max_size

    def infer_grid(self, state_dict, prefix):
        r, c = state_dict.get(prefix + "row.weight"), state_dict.get(prefix + "col.weight")
        return None if r is None or c is None else (r.shape[0], c.shape[0])

    def load_grid_(self, state_dict, prefix, saved) -> None:  # first rows, or resampled past them
        fit_axis_tables(state_dict, prefix, saved, {"row.weight": self.row, "col.weight": self.col}, keep_first=True)

    def extra_repr(self) -> str:
        return (f"dim={self.dim}, max_size={self.max_size}, overflow={self.row.overflow!r}, "
                f"resize_mode={self.row.resize_mode!r}, num_prefix_tokens={self.num_prefix_tokens}")


def _axis_table(table: LearnedTable1d, n: int, what: str, device) -> torch.Tensor:
    """The first n entries of ``table`` when it holds them (DETR), else the table resampled to n."""
    if n <= table.length:
        return table.weight[:n].to(device)  # (n, C)
    if table.overflow == "error":
        raise ValueError(f"shape has {n} {what}: the learned table holds {table.length} "
                         "(max_size) and overflow='error'; use overflow='interpolate' or a larger max_size")
    return table.table(n).to(device)  # (n, C), resampled by target size

