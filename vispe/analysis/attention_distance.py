"""Mean attention distance per layer and head of a ViT (Dosovitskiy et al. 2021, Fig. 7 right).

For query token i and head h, ``sum_j a[h, i, j] * |p_i - p_j|`` (Euclidean, in pixels: token
offsets times the patch size), with ``a`` the attention probabilities over the grid keys
(renormalised after dropping prefix tokens), averaged over grid queries and images. Low values =
local attention, high = global.

The probabilities are the ones the model computes: ``capture_attention`` wraps torch's
``scaled_dot_product_attention`` during one forward pass and computes ``softmax(q k^T / sqrt(d) +
mask)`` from the very q, k and mask (rotated, biased, padded) that the fused kernel receives.
"""
from __future__ import annotations

import contextlib
import math

import numpy as np
import torch
import torch.nn.functional as F

from vispe.coords import grid_coords


@contextlib.contextmanager
def _recording(store: list):
    original = F.scaled_dot_product_attention

    def sdpa(q, k, v, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, **kw):
        logits = (q.float() @ k.float().transpose(-2, -1)) * (scale if scale is not None else 1 / math.sqrt(q.shape[-1]))
        if attn_mask is not None:
            if attn_mask.dtype == torch.bool:
                logits = logits.masked_fill(~attn_mask, float("-inf"))
            else:
                logits = logits + attn_mask.float()
        if is_causal:
            L, S = logits.shape[-2:]
            logits = logits.masked_fill(torch.ones(L, S, dtype=torch.bool, device=q.device).triu(1), float("-inf"))
        store.append(logits.softmax(-1).detach().cpu())  # (B, heads, L, L)
        return original(q, k, v, attn_mask=attn_mask, dropout_p=dropout_p, is_causal=is_causal, scale=scale, **kw)

    F.scaled_dot_product_attention = sdpa
    try:
        yield store
    finally:
        F.scaled_dot_product_attention = original


@torch.no_grad()
def capture_attention(model: torch.nn.Module, images: torch.Tensor) -> list[torch.Tensor]:
    """Attention probabilities of every attention call of one forward, in call order (block 0 first).  # [(B, heads, L, L)]"""
    was_training = model.training
    model.eval()
    store: list = []
    try:
        with _recording(store):
            model(images)
    finally:
        model.train(was_training)
    return store


def mean_attention_distance(probs: torch.Tensor, shape: tuple[int, int], num_prefix_tokens: int = 0,
                            patch_size: float = 1.0) -> np.ndarray:
    """Mean distance per head, grid queries and keys only, in pixels.  # (heads,)"""
    h, w = shape
    P, N = num_prefix_tokens, h * w
    if probs.shape[-1] != P + N or probs.shape[-2] != P + N:
        raise ValueError(f"probs has shape {tuple(probs.shape)}: expected (B, heads, {P + N}, {P + N}) "
                         f"for grid {tuple(shape)} and {P} prefix tokens")
    a = probs[..., P:, P:].double()  # (B, heads, N, N)
    a = a / a.sum(-1, keepdim=True).clamp_min(1e-12)
    c = grid_coords(h, w, dtype=torch.float64) * patch_size  # (N, 2)
    dist = torch.cdist(c, c)  # (N, N)
    return (a * dist).sum(-1).mean(dim=(0, 2)).numpy()  # (heads,)


def attention_distances(model, images: torch.Tensor) -> np.ndarray:
    """Mean attention distance of a vispe ViT for ``images``, one row per block.  # (blocks, heads)"""
    ps = model.patch_embed.patch_size
    if ps[0] != ps[1]:
        raise ValueError(f"patch size {tuple(ps)}: expected square patches (distance in pixels)")
    shape = (images.shape[-2] // ps[0], images.shape[-1] // ps[1])
    probs = capture_attention(model, images)
    return np.stack([mean_attention_distance(p, shape, model.num_prefix_tokens, ps[0]) for p in probs])


def attention_distance_figure(models: dict, images: torch.Tensor, title: str | None = None):
    """Mean attention distance (pixels) against block for each model ``{label: vispe ViT}``: one dot
    per head, a line through the head mean; returns the Figure."""
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(5.6, 3.8))
    for i, (label, model) in enumerate(models.items()):
        d = attention_distances(model, images)  # (blocks, heads)
        x = np.arange(len(d)) + (i - (len(models) - 1) / 2) * 0.08
        (line,) = ax.plot(x, d.mean(1), marker="", label=label)
        ax.scatter(np.repeat(x, d.shape[1]), d.ravel(), s=10, color=line.get_color())
    H, W = images.shape[-2:]
    ax.axhline(_uniform_distance(models, images), color="grey", ls=":", lw=1, label="uniform attention")
    ax.set_xlabel("block")
    ax.set_ylabel("mean attention distance (px)")
    ax.set_title(title or f"attention distance, {H}x{W} images", fontsize=10)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    fig.tight_layout()
    return fig


def _uniform_distance(models: dict, images: torch.Tensor) -> float:
    """The mean distance of uniform attention over the grid (the 'global' reference line)."""
    model = next(iter(models.values()))
    ps = model.patch_embed.patch_size[0]
    shape = (images.shape[-2] // ps, images.shape[-1] // ps)
    n = shape[0] * shape[1]
    return float(mean_attention_distance(torch.full((1, 1, n, n), 1.0 / n), shape, 0, ps)[0])
