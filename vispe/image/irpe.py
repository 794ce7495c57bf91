"""iRPE: image relative position encoding (Wu et al., ICCV 2021, "Rethinking and Improving
Relative Position Encoding for Vision Transformer").

A 1D relative distance x is bucketed by the piecewise index function (paper Eq. 18)

    g(x) = round(x)                                                        if |x| <= alpha
    g(x) = sign(x) * min(beta, round(alpha + ln(|x|/alpha) / ln(gamma/alpha) * (beta - alpha)))  else

(exact near 0, logarithmic beyond alpha, reaching beta at |x| = gamma and clipped there; as the
reference code, the result is truncated to an integer, so |g| <= int(beta)). Defaults are the
paper's ``ratio=1.9``: alpha = 1.9, beta = 3.8, gamma = 15.2. With (dy, dx) = query minus key
position (iRPE's ``pos1 - pos2``) and b = int(beta), the 2D ``method``:

* ``"euclidean"``: g(round(sqrt(dy^2 + dx^2))), b + 1 buckets
* ``"quant"``:     g(dy^2 + dx^2), b + 1 buckets
* ``"cross"``:     two tables, g(dy) + b and g(dx) + b (2b + 1 buckets each), summed
* ``"product"``:   (g(dy) + b) * (2b + 1) + g(dx) + b, (2b + 1)^2 buckets (the paper's default)

(the reference code allocates 2b + 1 buckets for euclidean/quant, half of them unused; vispe
allocates the b + 1 that are used.)

Modes:

* bias (default): a learned per-head scalar per bucket, ``bias[h, i, j] = r_h[idx(i, j)]``;
  output ``(1, heads, P+N, P+N)``.
* ``contextual=True`` (iRPE's "ctx" mode on keys): a learned vector per head and bucket,
  ``bias[b, h, i, j] = (q_{b,h,i} / sqrt(head_dim)) . r_h[idx(i, j)]``; ``q`` (B, heads, P+N,
  head_dim) are the queries before SDPA's scaling (iRPE adds ``rpe_k(q * scale)``); output
  ``(B, heads, P+N, P+N)``. Needs ``head_dim`` (or ``dim``).

Deviations from the reference code: one table per head (iRPE shares one across heads by
default, ``shared_head=True``); prefix tokens follow vispe's BEiT rule (``vispe.image._bias``:
learned per-head scalars, also in contextual mode) instead of iRPE's single extra bucket.
Tables are zero-initialised as in iRPE. Grid change: buckets recompute at any (h, w) (the
number of buckets does not depend on the grid). Padding mask: the bias does not depend on it.
"""
from __future__ import annotations

import math

import torch
from torch import nn

from vispe import _checks
from vispe.coords import grid_coords
from vispe.image._bias import BiasBase, gather_bias
from vispe.registry import register

METHODS = ("euclidean", "quant", "cross", "product")


def piecewise_index(x: torch.Tensor, alpha: float, beta: float, gamma: float) -> torch.Tensor:
    """iRPE's g(x) (module docstring), elementwise.  # x.shape, long in [-int(beta), int(beta)]"""
    x = x.float()
    ax = x.abs()
    far = alpha + torch.log(ax.clamp(min=alpha) / alpha) / math.log(gamma / alpha) * (beta - alpha)
    far = far.round().clamp(max=beta)  # x.shape, magnitude beyond alpha
    return torch.where(ax <= alpha, x.round(), torch.sign(x) * far).long()  # truncates toward 0


def num_buckets(method: str, beta: float) -> int:
    """Buckets of one table of ``method``."""
    b = int(beta)
    return {"euclidean": b + 1, "quant": b + 1, "cross": 2 * b + 1, "product": (2 * b + 1) ** 2}[method]


def irpe_index(h: int, w: int, method: str, alpha: float, beta: float, gamma: float, *,
               device=None) -> tuple[torch.Tensor, ...]:
    """Bucket index of every (query, key) pair of an (h, w) grid: one (N, N) long tensor, two for cross."""
    c = grid_coords(h, w, device=device)  # (N, 2) as (y, x)
    d = c[:, None, :] - c[None, :, :]  # (N, N, 2) query minus key
    return offset_buckets(d[..., 0], d[..., 1], method, alpha, beta, gamma)


def offset_buckets(dy: torch.Tensor, dx: torch.Tensor, method: str, alpha: float, beta: float,
                   gamma: float) -> tuple[torch.Tensor, ...]:
    """Bucket index of offsets (dy, dx) (query minus key, float): one long tensor, two for cross.  # dy.shape each"""
    _checks.choice("method", method, METHODS)
    b = int(beta)
    g = lambda v: piecewise_index(v, alpha, beta, gamma)  # noqa: E731
    if method == "euclidean":
        return (g((dy.square() + dx.square()).sqrt().round()),)
    if method == "quant":
        return (g(dy.square() + dx.square()),)
    if method == "cross":
        return (g(dy) + b, g(dx) + b)
    return ((g(dy) + b) * (2 * b + 1) + g(dx) + b,)


def offset_grid(h: int, w: int, *, device=None) -> tuple[torch.Tensor, torch.Tensor]:
    """Every offset (dy, dx) of an (h, w) grid, float32, row-major from (-(h-1), -(w-1)).  # (2h-1, 2w-1) each"""
    dy = torch.arange(-(h - 1), h, device=device, dtype=torch.float32)
    dx = torch.arange(-(w - 1), w, device=device, dtype=torch.float32)
    return torch.meshgrid(dy, dx, indexing="ij")


@register("irpe")
class IRPE(BiasBase):
    """iRPE on keys, bias or contextual mode (module docstring).

    Args: ``num_heads``, ``num_prefix_tokens``, ``method`` ("euclidean" | "quant" | "cross" |
    "product"), ``alpha``, ``beta``, ``gamma`` (0 < alpha <= beta, gamma > alpha),
    ``contextual``, ``head_dim`` / ``dim`` (contextual needs one; checked), ``grid`` (checked only).
    """

    def __init__(self, num_heads: int, num_prefix_tokens: int = 0, *, method: str = "product",
                 alpha: float = 1.9, beta: float = 3.8, gamma: float = 15.2, contextual: bool = False,
                 dim: int | None = None, head_dim: int | None = None, grid=None) -> None:
        super().__init__(num_heads, num_prefix_tokens, dim=dim, head_dim=head_dim, grid=grid,
                         contextual=contextual)
        self.method = _checks.choice("method", method, METHODS)
        self.alpha = _checks.positive_float("alpha", alpha)
        self.beta = _checks.positive_float("beta", beta)
        self.gamma = _checks.positive_float("gamma", gamma)
        if alpha > beta:
            raise ValueError(f"alpha={alpha}: expected at most beta={beta} (exact buckets must fit in [-beta, beta])")
        if gamma <= alpha:
            raise ValueError(f"gamma={gamma}: expected more than alpha={alpha} (log part spans alpha..gamma)")
        k = num_buckets(method, beta)
        shape = (num_heads, k) if not contextual else (num_heads, k, self.head_dim)
        names = ("table_y", "table_x") if method == "cross" else ("table",)
        for name in names:  # (heads, buckets) or (heads, buckets, head_dim), zeros as iRPE
            self.register_parameter(name, nn.Parameter(torch.zeros(shape)))
        self._names = names

    def _lookup(self, table: torch.Tensor, index: torch.Tensor, q: torch.Tensor | None) -> torch.Tensor:
        N = index.shape[0]
        if not self.contextual:
            return gather_bias(table.t(), index)  # (1, heads, N, N); table is (heads, buckets)
        qg = q[:, :, self.num_prefix_tokens:].float() * self.head_dim ** -0.5  # (B, heads, N, d)
        qr = torch.einsum("bhnd,hkd->bhnk", qg, table)  # (B, heads, N, buckets)
        return qr.gather(-1, index[None, None].expand(qr.shape[0], qr.shape[1], N, N))  # (B, heads, N, N)

    def relative_table(self, shape, device) -> torch.Tensor | None:
        """Non-contextual: each table read at the buckets of every offset, summed.  # ((2h-1)(2w-1), heads)"""
        if self.contextual:
            return None
        h, w = shape
        idx = self.cached(("irpe_offset_buckets", h, w, device, torch.long),
                          lambda: offset_buckets(*offset_grid(h, w, device=device), self.method, self.alpha,
                                                 self.beta, self.gamma))  # (2h-1, 2w-1) each
        tables = [getattr(self, n).to(device, torch.float32) for n in self._names]  # (heads, buckets)
        out = tables[0][:, idx[0].reshape(-1)]
        for t, i in zip(tables[1:], idx[1:]):
            out = out + t[:, i.reshape(-1)]
        return out.t()  # ((2h-1)(2w-1), heads)

    def grid_bias(self, shape, device, q=None) -> torch.Tensor:
        h, w = shape
        idx = self.cached(("irpe_index", h, w, device, torch.long),
                          lambda: irpe_index(h, w, self.method, self.alpha, self.beta, self.gamma, device=device))
        tables = [getattr(self, n).to(device, torch.float32) for n in self._names]
        out = self._lookup(tables[0], idx[0], q)
        for t, i in zip(tables[1:], idx[1:]):
            out = out + self._lookup(t, i, q)
        return out  # (1|B, heads, N, N)

    def extra_repr(self) -> str:
        return (f"{super().extra_repr()}, method={self.method!r}, alpha={self.alpha:g}, "
                f"beta={self.beta:g}, gamma={self.gamma:g}")
