"""Cosine similarity of each position's code with every other position (the ViT paper's Fig. 7
centre panel), and the same encoding at its trained grid and at a larger one.

``similarity_figure(pe, shape)``: an h x w mosaic; tile (y, x) is the h x w map of the similarity of
token (y, x) with every token. ``resolution_figure(pe, trained, larger)``: rows = the two grids,
columns = reference cells (corner, edge, centre, at the same relative place), each the map of that
cell's similarity with the whole grid: how a learned table resampled, a fixed code recomputed or a
RoPE extended behaves when the grid grows.
"""
from __future__ import annotations

import numpy as np

from vispe.analysis.codes import encoding_name as _name, reference_positions, similarity_matrix


def mosaic(sim: np.ndarray, shape: tuple[int, int]) -> np.ndarray:
    """(N, N) -> (h*(h+1)-1, w*(w+1)-1) image of h x w tiles separated by NaN lines."""
    h, w = shape
    out = np.full((h * (h + 1) - 1, w * (w + 1) - 1), np.nan)
    tiles = sim.reshape(h, w, h, w)
    for y in range(h):
        for x in range(w):
            out[y * (h + 1): y * (h + 1) + h, x * (w + 1): x * (w + 1) + w] = tiles[y, x]
    return out


def similarity_figure(pe, shape: tuple[int, int], title: str | None = None):
    """Mosaic of every position's similarity map; returns the Figure (its image is ``mosaic(...)``)."""
    import matplotlib.pyplot as plt

    sim = similarity_matrix(pe, shape).numpy()
    bias = pe.family == "bias"
    fig, ax = plt.subplots(figsize=(4.6, 4.2))
    im = ax.imshow(mosaic(sim, shape), cmap="viridis", vmin=None if bias else -1, vmax=None if bias else 1)
    ax.set_xticks([(w_ + 0.5) * (shape[1] + 1) - 1 for w_ in range(shape[1])], range(shape[1]))
    ax.set_yticks([(h_ + 0.5) * (shape[0] + 1) - 1 for h_ in range(shape[0])], range(shape[0]))
    ax.set_xlabel("input patch column (x)")
    ax.set_ylabel("input patch row (y)")
    fig.colorbar(im, ax=ax, label="bias (mean over heads)" if bias else "cosine similarity")
    ax.set_title(title or f"{_name(pe)} {shape[0]}x{shape[1]}")
    fig.tight_layout()
    return fig


def reference_maps(pe, shape: tuple[int, int], refs: dict[str, tuple[float, float]]) -> dict[str, np.ndarray]:
    """Similarity map (h, w) of each reference cell, given as relative (y, x) in [0, 1]."""
    h, w = shape
    sim = similarity_matrix(pe, shape).numpy()
    out = {}
    for name, (ry, rx) in refs.items():
        y, x = min(int(round(ry * (h - 1))), h - 1), min(int(round(rx * (w - 1))), w - 1)
        out[name] = sim[y * w + x].reshape(h, w)
    return out


def resolution_figure(pe, trained: tuple[int, int], larger: tuple[int, int], title: str | None = None):
    """Reference cells' similarity maps at the trained grid (top) and at ``larger`` (bottom)."""
    import matplotlib.pyplot as plt

    th, tw = trained
    refs = {k: (y / max(th - 1, 1), x / max(tw - 1, 1)) for k, (y, x) in reference_positions(trained).items()}
    rows = [(trained, reference_maps(pe, trained, refs)), (larger, reference_maps(pe, larger, refs))]
    bias = pe.family == "bias"
    fig, axes = plt.subplots(2, len(refs), figsize=(2.6 * len(refs), 5.2), squeeze=False)
    for r, (shape, maps) in enumerate(rows):
        for c, (name, m) in enumerate(maps.items()):
            ax = axes[r, c]
            im = ax.imshow(m, cmap="viridis", vmin=None if bias else -1, vmax=None if bias else 1)
            ax.set_title(f"{name}, grid {shape[0]}x{shape[1]}", fontsize=8)
            ax.set_xticks([])
            ax.set_yticks([])
    fig.colorbar(im, ax=axes, shrink=0.7, label="bias" if bias else "cosine similarity")
    fig.suptitle(title or f"{_name(pe)}: trained {th}x{tw} vs {larger[0]}x{larger[1]}")
    return fig
