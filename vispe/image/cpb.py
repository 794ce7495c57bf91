"""Log-spaced continuous position bias (Swin Transformer V2, Liu et al., CVPR 2022).

A small MLP maps log-spaced relative coordinates to a per-head bias, so the bias exists at any
window size without a table to resize. For a window (h, w) and offsets dy in [-(h-1), h-1]
(query minus key, as Swin), dx likewise:

    u = dy / (H0 - 1) * 8,  v = dx / (W0 - 1) * 8          (H0, W0) = pretrained_window or (h, w)
    c = sign(t) * log2(1 + |t|) / log2(8)   for t in (u, v)   # in [-1, 1] within the window
    T(dy, dx) = 16 * sigmoid(MLP(c))                          MLP: 2 -> hidden (ReLU) -> heads, no last bias
    bias[head, i, j] = T(y_i - y_j, x_i - x_j)[head]

(H0 - 1 is taken as 1 for a window of length 1, where Swin's formula divides 0 by 0.)

``pretrained_window=None`` normalises by the current grid (Swin-V2 pre-training); a fixed
``pretrained_window`` keeps the coordinates of the window the MLP was trained at, so a larger grid
extrapolates to |t| > 8 (Swin-V2 transfer). Grid change: coordinates recompute at any (h, w).
Output ``(1, heads, P+N, P+N)``. Padding mask: the bias does not depend on it. Prefix tokens:
``vispe.image._bias``.
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint

from vispe import _checks, _tracing
from vispe.image._bias import BiasBase, gather_bias
from vispe.image.relbias import relative_position_index
from vispe.registry import register


def log_relative_coords(h: int, w: int, pretrained_window: tuple[int, int] | None = None, *,
                        device=None) -> torch.Tensor:
    """Swin-V2 log-spaced relative coordinates (dy, dx), float32.  # (2h-1, 2w-1, 2)"""
    h0, w0 = pretrained_window if pretrained_window is not None else (h, w)
    dy = torch.arange(-(h - 1), h, device=device, dtype=torch.float32) / torch.sym_max(h0 - 1, 1)  # (2h-1,)
    dx = torch.arange(-(w - 1), w, device=device, dtype=torch.float32) / torch.sym_max(w0 - 1, 1)  # (2w-1,)
    t = torch.stack(torch.meshgrid(dy, dx, indexing="ij"), dim=-1) * 8  # (2h-1, 2w-1, 2)
    return torch.sign(t) * torch.log2(1.0 + t.abs()) / math.log2(8)


#: offsets per chunk of a checkpointed table (``LogCPB.table``): 2,048 x 512 hidden floats, 4 MiB
CHECKPOINT_ROWS = 2048


@register("log_cpb")
class LogCPB(BiasBase):
    """Swin-V2 continuous position bias from log-spaced coordinates.

    Args: ``num_heads``, ``num_prefix_tokens``, ``hidden_dim`` (default 512, as Swin-V2),
    ``pretrained_window`` ((h, w) or None), and ``dim`` / ``head_dim`` / ``grid`` (checked only).
    """

    def __init__(self, num_heads: int, num_prefix_tokens: int = 0, *, hidden_dim: int = 512,
                 pretrained_window=None, dim: int | None = None, head_dim: int | None = None,
                 grid=None) -> None:
        super().__init__(num_heads, num_prefix_tokens, dim=dim, head_dim=head_dim, grid=grid)
        self.hidden_dim = _checks.positive_int("hidden_dim", hidden_dim)
        self.pretrained_window = (None if pretrained_window is None
                                  else _checks.grid_shape("pretrained_window", pretrained_window))
        self.mlp = nn.Sequential(nn.Linear(2, hidden_dim), nn.ReLU(), nn.Linear(hidden_dim, num_heads, bias=False))

    def table(self, coords: torch.Tensor) -> torch.Tensor:
        """16 * sigmoid(MLP(coords)) in float32 (the weights are read in float32).  # coords.shape[:-1] + (heads,)

        A table of more than ``CHECKPOINT_ROWS`` offsets is computed in chunks, so that the hidden
        layer exists for one chunk at a time; with gradients each chunk keeps nothing of it for the
        backward pass (``torch.utils.checkpoint``: each chunk recomputes its own). At 64x64 tokens
        the (16,129 x 512) hidden activations of every layer otherwise took 1.8x the training step's
        memory of a ViT without position, and 2.25x its inference memory."""
        flat = coords.reshape(-1, coords.shape[-1])  # (R, 2)
        if flat.shape[0] > CHECKPOINT_ROWS and not _tracing.is_tracing():
            if torch.is_grad_enabled():
                parts = [checkpoint(self._mlp, c, use_reentrant=False) for c in flat.split(CHECKPOINT_ROWS)]
            else:
                parts = [self._mlp(c) for c in flat.split(CHECKPOINT_ROWS)]
            return torch.cat(parts).reshape(*coords.shape[:-1], -1)
        return self._mlp(coords)

    def _mlp(self, coords: torch.Tensor) -> torch.Tensor:  # (..., 2) -> (..., heads)
        fc1, fc2 = self.mlp[0], self.mlp[2]
        f32 = dict(device=coords.device, dtype=torch.float32)
        x = F.relu(F.linear(coords, fc1.weight.to(**f32), fc1.bias.to(**f32)))  # (..., hidden)
        return 16 * torch.sigmoid(F.linear(x, fc2.weight.to(**f32)))  # (..., heads)

    def relative_table(self, shape, device) -> torch.Tensor:
        h, w = shape
        coords = self.cached(("log_cpb_coords", h, w, device, torch.float32),
                             lambda: log_relative_coords(h, w, self.pretrained_window, device=device))
        return self.table(coords).reshape(-1, self.num_heads)  # ((2h-1)(2w-1), heads)

    def grid_bias(self, shape, device, q=None) -> torch.Tensor:
        h, w = shape
        index = self.cached(("relbias_index", h, w, device, torch.long),
                            lambda: relative_position_index(h, w, device=device))  # (N, N)
        return gather_bias(self.relative_table(shape, device), index)  # (1, heads, N, N)

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, hidden_dim={self.hidden_dim}, pretrained_window={self.pretrained_window}"
