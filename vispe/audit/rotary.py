"""What position does to q and k, read from one attention call whose input tokens are all the same.

With identical input tokens, any difference between the q (or k) of two tokens comes from position.
``classify`` says what kind: none; additive at the attention (DETR: ``q = W (x + pos)``: the
difference does not depend on the content); a rotation in 2x2 planes ("half": pairs (i, i + d/2),
rotate-half; "interleaved": pairs (2i, 2i + 1)), found as the pairing whose pair norms position does
not change; an orthogonal map in larger blocks (the head's norm is kept: LieRE, STRING, ComRoPE);
or none of these (a cos/sin table laid out for one pairing applied with the other: a defect).

For a rotation in planes, ``steps`` recovers each pair's angle step per patch along y and x from
the grid (tokens row-major after the prefix), ``linear_residual`` says whether the angles are those
of a 2D RoPE at the token's (y, x), and ``name`` finds the ``rope_axial`` setting that gives the same
angles (checked by building it): "equals vispe rope_axial with layout=half, axis_order=xy, base=100".
``relative_spread`` is the shift test: q_i . k_j grouped by the offset p_j - p_i.
"""
from __future__ import annotations

import math
from typing import Any

import torch

LAYOUT_PAIRS = ("half", "interleaved")


def pairs(q: torch.Tensor, layout: str) -> tuple[torch.Tensor, torch.Tensor]:
    """The two members of each rotation pair.  # (..., d/2) each"""
    d = q.shape[-1]
    if layout == "half":
        return q[..., : d // 2], q[..., d // 2:]
    return q[..., 0::2], q[..., 1::2]


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).abs().max() / b.abs().max().clamp_min(1e-12))


def classify(q1: torch.Tensor, q2: torch.Tensor) -> str:
    """q1, q2 (heads, N, d): one attention's q for two contents, every token the same content.
    Returns "none", "additive", "rotary-half", "rotary-interleaved", "orthogonal" or "other"."""
    d1, d2 = q1 - q1[:, :1], q2 - q2[:, :1]  # (heads, N, d)
    if float(d1.abs().max()) <= 1e-5 * float(q1.abs().max().clamp_min(1e-12)):
        return "none"
    if _rel(d1, d2) < 1e-3:
        return "additive"
    for layout in LAYOUT_PAIRS:
        a, b = pairs(q1, layout)
        r = (a * a + b * b).sqrt()  # (heads, N, d/2)
        if _rel(r, r[:, :1].expand_as(r)) < 1e-4:
            return f"rotary-{layout}"
    n = q1.norm(dim=-1)  # (heads, N)
    if _rel(n, n[:, :1].expand_as(n)) < 1e-4:
        return "orthogonal"
    return "other"


def _wrap(a: torch.Tensor) -> torch.Tensor:
    return torch.remainder(a + math.pi, 2 * math.pi) - math.pi


def angles(q: torch.Tensor, layout: str) -> tuple[torch.Tensor, torch.Tensor]:
    """Each pair's angle relative to the first token, and a mask of pairs large enough to read.
    q (heads, N, d) -> (heads, N, d/2), (heads, d/2)"""
    a, b = pairs(q.double(), layout)
    ang = torch.atan2(b, a)  # (heads, N, d/2)
    r = (a * a + b * b).sqrt()[:, 0]  # (heads, d/2)
    return _wrap(ang - ang[:, :1]), r > 1e-3 * r.max()


def steps(rel: torch.Tensor, grid: tuple[int, int]) -> tuple[torch.Tensor, torch.Tensor]:
    """Angle steps per patch along y and x, read at the first row and column.  # (heads, d/2) each"""
    h, w = grid
    g = rel.reshape(rel.shape[0], h, w, -1)  # (heads, h, w, d/2)
    sy = g[:, 1, 0] if h > 1 else torch.zeros_like(g[:, 0, 0])
    sx = g[:, 0, 1] if w > 1 else torch.zeros_like(g[:, 0, 0])
    return sy, sx


def linear_residual(rel: torch.Tensor, ok: torch.Tensor, grid: tuple[int, int]) -> float:
    """Largest angle error (radians) of ``y * step_y + x * step_x`` against the angles read."""
    h, w = grid
    sy, sx = steps(rel, grid)
    y = torch.arange(h, dtype=rel.dtype).repeat_interleave(w)[None, :, None]  # (1, N, 1)
    x = torch.arange(w, dtype=rel.dtype).repeat(h)[None, :, None]
    err = _wrap(rel - (y * sy[:, None] + x * sx[:, None])).abs()  # (heads, N, d/2)
    return float(err.masked_fill(~ok[:, None], 0).max())


def relative_spread(q: torch.Tensor, k: torch.Tensor, grid: tuple[int, int]) -> float:
    """Shift test: the spread of q_i . k_j over token pairs at the same offset, relative to the
    largest score. q, k (heads, N, d) grid tokens; 0 for an encoding that is relative."""
    return offset_spread(q.double() @ k.double().transpose(-1, -2), grid)


def relative_spread_bias(bias: torch.Tensor, grid: tuple[int, int]) -> float:
    """Shift test of a logits bias (heads, N, N) over the grid: its spread at one offset, relative."""
    return offset_spread(bias, grid)


def offset_spread(s: torch.Tensor, grid: tuple[int, int]) -> float:
    """The spread of s[i, j] (heads, N, N) over token pairs at the same offset, relative to max |s|."""
    h, w = grid
    y = torch.arange(h).repeat_interleave(w)
    x = torch.arange(w).repeat(h)
    off = ((y[None] - y[:, None] + h - 1) * (2 * w - 1) + (x[None] - x[:, None] + w - 1)).flatten()  # (N*N,)
    flat = s.flatten(1)  # (heads, N*N)
    n = (2 * h - 1) * (2 * w - 1)
    hi = flat.new_full((flat.shape[0], n), -math.inf).scatter_reduce(1, off.expand_as(flat), flat, "amax")
    lo = flat.new_full((flat.shape[0], n), math.inf).scatter_reduce(1, off.expand_as(flat), flat, "amin")
    return float((hi - lo).max() / flat.abs().max().clamp_min(1e-12))


def axial_split(sy: torch.Tensor, sx: torch.Tensor, ok: torch.Tensor) -> str | None:
    """"yx" / "xy" when each pair turns with one axis, the first half of the pairs with y (x), the
    rest with the other; None otherwise (mixed frequencies: RoPE-Mixed; or another split)."""
    tol = 1e-6
    ys = (sy.abs() > tol) & ok
    xs = (sx.abs() > tol) & ok
    if bool((ys & xs).any()) or not bool((ys == ys[:1]).all()):
        return None
    half = ys.shape[-1] // 2
    first_y = bool(ys[:, :half].any()) and not bool(ys[:, half:].any())
    first_x = bool(xs[:, :half].any()) and not bool(xs[:, half:].any())
    return "yx" if first_y and not first_x else "xy" if first_x and not first_y else None


def _nice(v: float) -> float:
    r = round(v)
    return float(r) if abs(v - r) < 1e-3 * max(abs(v), 1) else float(f"{v:.4g}")


def candidates(freqs: torch.Tensor, grid: tuple[int, int], head_dim: int, layout: str, order: str,
               normalised: bool) -> list[dict[str, Any]]:
    """``rope_axial`` settings that could give these per-patch steps of one axis (y, on ``grid``)."""
    f = freqs.double()
    if normalised:  # DINOv3: angle = 2 pi * centred coordinate in [-1, 1] / period: step = 4 pi f / h
        f = f * grid[0] / (4 * math.pi)
    if f.numel() < 2 or float(f[1]) <= 0:
        return []
    base = _nice(float((f[0] / f[1]) ** (head_dim / 4)))
    kw: dict[str, Any] = dict(layout=layout, axis_order=order, base=base)
    if normalised:
        kw.update(coords="centered", scale=_nice(2 * math.pi * float(f[0])), normalize_coords="separate")
    elif abs(float(f[0]) - 1) > 1e-4:
        kw.update(scale=_nice(float(f[0])))
    return [kw]


def equals_vispe(rel: torch.Tensor, ok: torch.Tensor, grid: tuple[int, int], head_dim: int, kw: dict[str, Any]) -> float:
    """Largest angle error (radians) of vispe's ``rope_axial(**kw)`` against the angles read."""
    from vispe.registry import build

    try:
        enc = build("rope_axial", head_dim=head_dim, num_heads=1, **kw)
    except ValueError:
        return math.inf
    a = enc(grid)[0, 0].double()  # (N, d/2)
    ref = _wrap(a - a[:1])[None]  # (1, N, d/2)
    return float(_wrap(rel - ref).abs().masked_fill(~ok[:, None], 0).max())


def describe(kw: dict[str, Any]) -> str:
    def fmt(v: Any) -> str:
        return f"{v:.6g}" if isinstance(v, float) else str(v)

    return "vispe rope_axial with " + ", ".join(f"{k}={fmt(v)}" for k, v in kw.items())
