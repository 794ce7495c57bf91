"""Per-axis relative position bias, summed over the two axes: the 1D relative indices of Shaw et
al. (NAACL 2018, clipped offsets) and T5 (Raffel et al., JMLR 2020, log buckets) applied to y and
to x separately (iRPE's "cross" method is the same sum with its piecewise index).

Two learned tables, one per axis, each (num_index, heads):

    bias[head, i, j] = T_y[idx(y_j - y_i), head] + T_x[idx(x_j - x_i), head]

with offsets key minus query (``vispe.axis.relative.relative_offsets``) and ``index``:

* ``"shaw"``: ``clip(d, -K, K) + K`` (``vispe.axis.relative.clipped_index``), K = ``max_distance``,
  2K + 1 entries per axis.
* ``"t5"``: T5's bidirectional buckets (``vispe.axis.relative.t5_bucket``), ``num_buckets``
  entries per axis (default 32), logarithmic up to ``max_distance``.

Tables: truncated normal, std 0.02. Grid change: indices recompute at any (h, w), nothing to
resize (offsets past the range share the last entry). Output ``(1, heads, P+N, P+N)``. Padding
mask: the bias does not depend on it. Prefix tokens: ``vispe.image._bias``.
"""
from __future__ import annotations

import torch
from torch import nn

from vispe import _checks
from vispe.axis.relative import clipped_index, relative_offsets, t5_bucket
from vispe.image._bias import BiasBase
from vispe.registry import register

INDEX_MODES = ("shaw", "t5")


@register("relbias_axis")
class AxisRelBias(BiasBase):
    """Sum of a y-table and an x-table of 1D relative biases.

    Args: ``num_heads``, ``num_prefix_tokens``, ``index`` ("shaw" | "t5"), ``max_distance``
    (default 16), ``num_buckets`` (t5 only, default 32), and ``dim`` / ``head_dim`` / ``grid``
    (checked only: the tables do not depend on the grid).
    """

    def __init__(self, num_heads: int, num_prefix_tokens: int = 0, *, index: str = "shaw",
                 max_distance: int = 16, num_buckets: int | None = None, dim: int | None = None,
                 head_dim: int | None = None, grid=None) -> None:
        super().__init__(num_heads, num_prefix_tokens, dim=dim, head_dim=head_dim, grid=grid)
        self.index = _checks.choice("index", index, INDEX_MODES)
        self.max_distance = _checks.positive_int("max_distance", max_distance)
        if index == "shaw":
            if num_buckets is not None:
                raise ValueError(f"num_buckets={num_buckets!r}: expected None with index='shaw' "
                                 "(its table has 2 * max_distance + 1 entries)")
            size = 2 * max_distance + 1
        else:
            num_buckets = 32 if num_buckets is None else num_buckets
            t5_bucket(torch.zeros(1, dtype=torch.long), num_buckets=num_buckets, max_distance=max_distance)  # checks
            size = num_buckets
        self.num_buckets = num_buckets
        self.table_y = nn.Parameter(torch.empty(size, num_heads))  # (num_index, heads)
        self.table_x = nn.Parameter(torch.empty(size, num_heads))  # (num_index, heads)
        nn.init.trunc_normal_(self.table_y, std=0.02)
        nn.init.trunc_normal_(self.table_x, std=0.02)

    def axis_index(self, n: int, device) -> torch.Tensor:
        """Table index of every (query, key) pair of an axis of length n.  # (n, n) long"""
        pos = torch.arange(n, device=device)  # (n,)
        off = relative_offsets(pos, pos)  # (n, n) key minus query
        if self.index == "shaw":
            return clipped_index(off, self.max_distance)
        return t5_bucket(off, bidirectional=True, num_buckets=self.num_buckets, max_distance=self.max_distance)

    def relative_table(self, shape, device) -> torch.Tensor:
        """T_y at -dy plus T_x at -dx for every offset (dy, dx) (query minus key).  # ((2h-1)(2w-1), heads)"""
        h, w = shape
        iy = self.cached(("relbias_axis_dy", h, device, torch.long), lambda: self.offset_index(h, device))  # (2h-1,)
        ix = self.cached(("relbias_axis_dx", w, device, torch.long), lambda: self.offset_index(w, device))  # (2w-1,)
        ty = self.table_y.to(device, torch.float32)[iy]  # (2h-1, heads)
        tx = self.table_x.to(device, torch.float32)[ix]  # (2w-1, heads)
        return (ty[:, None, :] + tx[None, :, :]).reshape(-1, self.num_heads)

    def offset_index(self, n: int, device) -> torch.Tensor:
        """Table index of the key-minus-query offsets n-1 .. -(n-1), i.e. of query-minus-key offsets
        -(n-1) .. n-1 in order.  # (2n-1,) long"""
        off = torch.arange(n - 1, -n, -1, device=device)  # key minus query
        if self.index == "shaw":
            return clipped_index(off, self.max_distance)
        return t5_bucket(off, bidirectional=True, num_buckets=self.num_buckets, max_distance=self.max_distance)

    def grid_bias(self, shape, device, q=None) -> torch.Tensor:
        h, w = shape
        iy = self.cached(("relbias_axis_y", h, device, torch.long), lambda: self.axis_index(h, device))  # (h, h)
        ix = self.cached(("relbias_axis_x", w, device, torch.long), lambda: self.axis_index(w, device))  # (w, w)
        by = self.table_y.to(device, torch.float32)[iy].permute(2, 0, 1).contiguous()  # (heads, h, h) [y_i, y_j]
        bx = self.table_x.to(device, torch.float32)[ix].permute(2, 0, 1).contiguous()  # (heads, w, w) [x_i, x_j]
        bias = by[:, :, None, :, None] + bx[:, None, :, None, :]  # (heads, h, w, h, w), contiguous
        return bias.reshape(1, -1, h * w, h * w)  # (1, heads, N, N)

    def extra_repr(self) -> str:
        extra = f", num_buckets={self.num_buckets}" if self.index == "t5" else ""
        return f"{super().extra_repr()}, index={self.index!r}, max_distance={self.max_distance}{extra}"
