"""Decomposed relative position (MViTv2, Li et al., CVPR 2022; SAM's image encoder, Kirillov et al.,
2023: transformers ``SamVisionAttention.get_decomposed_rel_pos``, timm ``vision_transformer_sam``).

Two learned tables per layer, shared by the heads: ``rel_pos_h`` (2h-1, head_dim) along y and
``rel_pos_w`` (2w-1, head_dim) along x, for the grid ``grid=(h, w)`` they are built for. The logit
bias of query token i at (y_i, x_i) to key token j at (y_j, x_j) depends on the query itself::

    bias[b, head, i, j] = q_{b,head,i} . R_h[y_i - y_j + h - 1] + q_{b,head,i} . R_w[x_i - x_j + w - 1]

with ``q`` the query of that head as the attention projects it, before the 1/sqrt(head_dim) scale
(SAM adds ``einsum(q, R_h) + einsum(q, R_w)`` to ``q k^T * scale``). It is a bias family encoding
on the contextual path (``contextual`` is always True: ``forward`` needs ``q`` (B, heads, P+N,
head_dim)); output ``(B, heads, P+N, P+N)``.

Grid change, SAM's rule (``rel_pos_table``): along an axis of length n the table is resized by
linear interpolation (align_corners=False, no antialias) to 2n-1 rows when it has another length,
so a 64x64 global table serves a 40x60 grid as (79, d) and (119, d). With query and key lengths
apart (q != k, SAM's general formula, kept in ``rel_pos_table`` / ``decomposed_rel_pos``): the
table is resized to 2 max(q, k) - 1 rows and the coordinates of the shorter side are scaled by
max(k/q, 1) and max(q/k, 1) (then truncated), as SAM does. ``resize_(shape)`` applies the rule to
the stored tables for good, and a state_dict saved for another grid is resized by it on load (the
table lengths tell the grid: ``infer_grid``).

Padding mask: not mask-aware. The bias depends on each query and on the grid's size: an image
padded into a larger canvas gets tables resized to the canvas, so its valid tokens do not get the
bias they get alone unless the canvas is the grid the tables are built for (then relative offsets
of valid tokens are unchanged and padded keys are hidden by the attention's key-padding mask).
Prefix tokens (class, register): the bias family's rule (``vispe.image._bias``: learned per-head
scalars); SAM has none. Tables are zero-initialised as SAM and timm do (``init_std`` > 0: a
truncated normal instead). Float32 math, cast at the end.
"""
from __future__ import annotations

import torch
from torch import nn

from vispe import _checks, _tracing
from vispe.image._bias import BiasBase
from vispe.registry import register


def rel_pos_table(q_size: int, k_size: int, rel_pos: torch.Tensor) -> torch.Tensor:
    """SAM's ``get_rel_pos``: the rows of ``rel_pos`` (L, C) for every (query, key) pair of one
    axis with ``q_size`` queries and ``k_size`` keys (module docstring).  # (q_size, k_size, C)"""
    if rel_pos.dim() != 2:
        raise ValueError(f"rel_pos has shape {tuple(rel_pos.shape)}: expected (2 n - 1, head_dim)")
    n = 2 * max(q_size, k_size) - 1
    table = resize_rel_pos(rel_pos, n)  # (n, C)
    if isinstance(q_size, int) and isinstance(k_size, int) and q_size != k_size:
        q = torch.arange(q_size, dtype=torch.float32)[:, None] * max(k_size / q_size, 1.0)  # (q, 1)
        k = torch.arange(k_size, dtype=torch.float32)[None, :] * max(q_size / k_size, 1.0)  # (1, k)
        index = (q - k + (k_size - 1) * max(q_size / k_size, 1.0)).long()  # (q, k), truncated as SAM
    else:  # one length (self-attention): integer offsets, symbolic-size friendly
        r = torch.arange(q_size, device=rel_pos.device)  # (n,)
        index = r[:, None] - r[None, :] + (q_size - 1)  # (n, n) query minus key
    return table[index.to(table.device)]  # (q, k, C)


def resize_rel_pos(rel_pos: torch.Tensor, length) -> torch.Tensor:
    """A (L, C) relative table linearly resized to ``length`` rows (align_corners=False, no antialias,
    as SAM's ``F.interpolate(mode="linear")``); the same length returns it as is.  # (length, C)"""
    if _tracing.known(rel_pos.shape[0] == length):
        return rel_pos
    x = rel_pos.float().t()[None, :, None, :]  # (1, C, 1, L): bilinear over a height of 1 = linear
    out = _tracing.resize(x, (1, length), mode="bilinear", antialias=False, align_corners=False)  # (1, C, 1, length)
    return out[0, :, 0].t().to(rel_pos.dtype)  # (length, C)


def decomposed_rel_pos(q: torch.Tensor, rel_pos_h: torch.Tensor, rel_pos_w: torch.Tensor,
                       q_size: tuple[int, int], k_size: tuple[int, int]) -> torch.Tensor:
    """SAM's decomposed bias of queries ``q`` (..., qh*qw, C), row-major over ``q_size``, to keys on
    ``k_size``.  # (..., qh*qw, kh*kw)"""
    (qh, qw), (kh, kw) = q_size, k_size
    Rh = rel_pos_table(qh, kh, rel_pos_h).to(q.dtype)  # (qh, kh, C)
    Rw = rel_pos_table(qw, kw, rel_pos_w).to(q.dtype)  # (qw, kw, C)
    lead = q.shape[:-2]
    rq = q.reshape(*lead, qh, qw, q.shape[-1])  # (..., qh, qw, C)
    rel_h = torch.einsum("...hwc,hkc->...hwk", rq, Rh)  # (..., qh, qw, kh)
    rel_w = torch.einsum("...hwc,wkc->...hwk", rq, Rw)  # (..., qh, qw, kw)
    bias = rel_h[..., :, None] + rel_w[..., None, :]  # (..., qh, qw, kh, kw)
    return bias.reshape(*lead, qh * qw, kh * kw)


@register("relpos_decomposed")
class RelPosDecomposed(BiasBase):
    """SAM / MViTv2 decomposed relative position, a query-dependent per-axis bias (module docstring).

    Args:
        num_heads: attention heads (the tables are shared by them, as SAM).
        num_prefix_tokens: prefix tokens with learned bias scalars (the bias family's rule).
        grid: (h, w) the tables are built for (required): ``rel_pos_h`` (2h-1, head_dim),
            ``rel_pos_w`` (2w-1, head_dim). A windowed SAM block's grid is its window.
        head_dim / dim: channels per head (one of them is required).
        init_std: 0 (default) zero tables as SAM; > 0 a truncated normal of that std.
    """

    def __init__(self, num_heads: int, num_prefix_tokens: int = 0, *, grid=None, dim: int | None = None,
                 head_dim: int | None = None, init_std: float = 0.0) -> None:
        if grid is None:
            raise ValueError("grid=None: expected the (h, w) grid the relative tables are built for")
        super().__init__(num_heads, num_prefix_tokens, dim=dim, head_dim=head_dim, grid=grid, contextual=True)
        if isinstance(init_std, bool) or not isinstance(init_std, (int, float)) or init_std < 0:
            raise ValueError(f"init_std={init_std!r}: expected a number >= 0 (0: zero tables, as SAM)")
        h, w = self.grid
        self.rel_pos_h = nn.Parameter(torch.zeros(2 * h - 1, self.head_dim))  # (2h-1, head_dim)
        self.rel_pos_w = nn.Parameter(torch.zeros(2 * w - 1, self.head_dim))  # (2w-1, head_dim)
        if init_std:
            nn.init.trunc_normal_(self.rel_pos_h, std=init_std)
            nn.init.trunc_normal_(self.rel_pos_w, std=init_std)

    def grid_bias(self, shape, device, q=None) -> torch.Tensor:
        h, w = shape
        qg = q[:, :, self.num_prefix_tokens:].float()  # (B, heads, N, head_dim)
        rh = self.rel_pos_h.to(device, torch.float32)
        rw = self.rel_pos_w.to(device, torch.float32)
        return decomposed_rel_pos(qg, rh, rw, (h, w), (h, w))  # (B, heads, N, N)

    @torch.no_grad()
    def resize_(self, shape) -> "RelPosDecomposed":
        """Resize the stored tables to grid ``shape`` for good, by SAM's rule (load time)."""
        h, w = _checks.grid_shape("shape", shape)
        if (h, w) != self.grid:
            self.rel_pos_h = nn.Parameter(resize_rel_pos(self.rel_pos_h.detach(), 2 * h - 1).clone())
            self.rel_pos_w = nn.Parameter(resize_rel_pos(self.rel_pos_w.detach(), 2 * w - 1).clone())
        self.grid = (h, w)
        return self

    def table_grid(self):
        return self.grid

    def infer_grid(self, state_dict, prefix):
        """The grid the table lengths tell: (2h-1, .) and (2w-1, .) rows (SAM's checkpoints)."""
        rh, rw = state_dict.get(prefix + "rel_pos_h"), state_dict.get(prefix + "rel_pos_w")
        if rh is None or rw is None:
            return None
        for key, t in (("rel_pos_h", rh), ("rel_pos_w", rw)):
            if t.dim() != 2 or t.shape[0] % 2 == 0:
                raise ValueError(f"{prefix}{key} has shape {tuple(t.shape)}: expected (2 n - 1, head_dim)")
        return (rh.shape[0] + 1) // 2, (rw.shape[0] + 1) // 2

    def load_grid_(self, state_dict, prefix, saved) -> None:
        """Resize tables saved for grid ``saved`` to this grid (SAM's linear rule)."""
        h, w = self.grid
        for key, n_saved, n in (("rel_pos_h", saved[0], h), ("rel_pos_w", saved[1], w)):
            t = state_dict.get(prefix + key)
            if t is None:
                continue
            if t.shape[0] != 2 * n_saved - 1:
                raise ValueError(f"{prefix}table_grid says grid {saved}, but {prefix}{key} has {t.shape[0]} rows "
                                 f"(expected {2 * n_saved - 1})")
            state_dict[prefix + key] = resize_rel_pos(t, 2 * n - 1)

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, grid={self.grid}, head_dim={self.head_dim}"
