"""How the position term changes with the 2D offset between two tokens (decay, anisotropy).

``offset_figure(pe, shape)``: left, the mean similarity (additive / rotary: cosine of the codes;
bias: the bias, mean over heads) at each offset (dy, dx) = query - key; right, the same against
the Euclidean distance |(dy, dx)| with the spread over pairs of equal offset as a band (zero for a
translation-invariant encoding such as RoPE or a relative bias, not for absolute codes).
"""
from __future__ import annotations

import numpy as np

from vispe.analysis.codes import encoding_name as _name, offset_map, similarity_matrix


def offset_figure(pe, shape: tuple[int, int], title: str | None = None):
    """Heat map over (dy, dx) and profile against distance; returns the Figure (image = mean map)."""
    import matplotlib.pyplot as plt

    h, w = shape
    mean, spread = (t.numpy() for t in offset_map(similarity_matrix(pe, shape), shape))
    fig, (a, b) = plt.subplots(1, 2, figsize=(9, 3.8))
    im = a.imshow(mean, cmap="viridis", extent=(-(w - 1) - 0.5, w - 0.5, h - 0.5, -(h - 1) - 0.5))
    a.set_xlabel("dx (query - key)")
    a.set_ylabel("dy (query - key)")
    fig.colorbar(im, ax=a, label="bias" if pe.family == "bias" else "mean cosine similarity")
    dy, dx = np.meshgrid(np.arange(-(h - 1), h), np.arange(-(w - 1), w), indexing="ij")
    dist = np.hypot(dy, dx).ravel()
    order = np.argsort(dist, kind="stable")
    b.scatter(dist[order], mean.ravel()[order], s=8, label="mean over pairs")
    b.errorbar(dist[order], mean.ravel()[order], yerr=spread.ravel()[order] / 2, fmt="none", alpha=0.3,
               label="spread over pairs (max - min)")
    b.set_xlabel("|offset| (tokens)")
    b.set_ylabel("similarity" if pe.family != "bias" else "bias")
    b.grid(alpha=0.3)
    b.legend(fontsize=7)
    fig.suptitle(title or f"{_name(pe)}: position term vs 2D offset ({h}x{w})")
    fig.tight_layout()
    return fig
