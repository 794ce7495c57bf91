"""Heat maps of learned position tables: relative-bias tables per head, learned row / column tables.

Both are read through the encoding's forward pass, not its parameters, so what is drawn is what
the model uses (and a convention slip, e.g. key - query instead of query - key, shows):

* ``bias_table_figure(pe, shape)``: per head, the bias at each offset (dy, dx) = query - key over
  the grid, ``(2h-1, 2w-1)``. For Swin's ``relbias`` at its own grid this is its table.
* ``rowcol_figure(pe, shape)``: the first half of the channels (y) down column x = 0, ``(h, dim/2)``,
  and the second half (x) along row y = 0, ``(w, dim/2)``: DETR's learned row and column tables for
  ``learned_rowcol`` (y channels first), and the same view of any encoding that concatenates a y
  code and an x code (``sine``, ``sincos2d``).
"""
from __future__ import annotations

import numpy as np

from vispe.analysis.codes import bias_matrix, encoding_name, offset_map, position_codes


def bias_tables(pe, shape: tuple[int, int]) -> np.ndarray:
    """Per-head bias by offset (query - key); NaN-free for every offset of the grid.  # (heads, 2h-1, 2w-1)"""
    bias = bias_matrix(pe, shape)  # (heads, N, N)
    return np.stack([offset_map(b, shape)[0].numpy() for b in bias])


def bias_table_figure(pe, shape: tuple[int, int], title: str | None = None):
    """One heat map per head (images in head order); returns the Figure."""
    import matplotlib.pyplot as plt

    h, w = shape
    tables = bias_tables(pe, shape)
    heads = len(tables)
    fig, axes = plt.subplots(1, heads, figsize=(2.8 * heads, 3.0), squeeze=False)
    for i, (ax, t) in enumerate(zip(axes[0], tables)):
        im = ax.imshow(t, cmap="coolwarm", extent=(-(w - 1) - 0.5, w - 0.5, h - 0.5, -(h - 1) - 0.5))
        ax.set_title(f"head {i}", fontsize=9)
        ax.set_xlabel("dx")
        if i == 0:
            ax.set_ylabel("dy (query - key)")
        fig.colorbar(im, ax=ax, shrink=0.8)
    fig.suptitle(title or f"{encoding_name(pe)}: attention bias by offset ({h}x{w})")
    fig.tight_layout()
    return fig


def rowcol_tables(pe, shape: tuple[int, int]) -> tuple[np.ndarray, np.ndarray]:
    """(y table (h, C/2), x table (w, C/2)) as the encoding produces them."""
    h, w = shape
    code = position_codes(pe, shape)  # (N, C)
    C = code.shape[-1]
    if C % 2:
        raise ValueError(f"the encoding has {C} channels: expected an even number (y half, x half)")
    grid = code.reshape(h, w, C)
    return grid[:, 0, : C // 2].numpy(), grid[0, :, C // 2:].numpy()


def rowcol_figure(pe, shape: tuple[int, int], title: str | None = None):
    """Row (y) and column (x) tables as heat maps (channels along x); returns the Figure."""
    import matplotlib.pyplot as plt

    rows, cols = rowcol_tables(pe, shape)
    fig, axes = plt.subplots(2, 1, figsize=(7, 1.2 + 0.25 * (len(rows) + len(cols))))
    for ax, t, name in zip(axes, (rows, cols), ("row table: y", "column table: x")):
        im = ax.imshow(t, cmap="coolwarm", aspect="auto", interpolation="nearest")
        ax.set_ylabel(name.split(": ")[1])
        ax.set_title(name, fontsize=9)
        fig.colorbar(im, ax=ax)
    axes[-1].set_xlabel("channel")
    fig.suptitle(title or f"{encoding_name(pe)} {shape[0]}x{shape[1]}")
    fig.tight_layout()
    return fig

