"""Read-out metrics of Islam, Jia & Bruce (ICLR 2020): Spearman correlation (SPC) and mean
absolute error (MAE) between a predicted position map and its target, per map.

SPC is Pearson's correlation of the ranks (ties get their average rank, as in
``scipy.stats.spearmanr``): ``rho = cov(r(p), r(t)) / (std(r(p)) std(r(t)))``, in [-1, 1].

A prediction that is the same at every position carries no position and has no rank order
(SPC is undefined, scipy gives NaN). Such a map is reported as SPC = 0 and flagged by ``flat``.
"Flat" allows float rounding: resizing a constant feature map bilinearly changes it by about
1e-7, and a rank correlation would read that rounding pattern as position. A map whose spread
(max - min) is at most ``atol`` (default 1e-4, in target units: targets span [0, 1]) is flat.
"""
from __future__ import annotations

import torch

FLAT_ATOL = 1e-4


def _maps(name: str, x: torch.Tensor) -> torch.Tensor:
    if not isinstance(x, torch.Tensor) or x.dim() < 2:
        got = tuple(x.shape) if isinstance(x, torch.Tensor) else type(x).__name__
        raise ValueError(f"{name} has shape {got}: expected maps (..., h, w)")
    return x.detach().flatten(-2).reshape(-1, x.shape[-2] * x.shape[-1]).double()  # (B, N)


def _pair(pred: torch.Tensor, target: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Flatten (..., h, w) maps to (B, N); a single target map (h, w) is broadcast over pred."""
    p, t = _maps("pred", pred), _maps("target", target)
    if pred.shape[-2:] != target.shape[-2:]:
        raise ValueError(f"target has shape {tuple(target.shape)}: expected maps of pred's size "
                         f"{tuple(pred.shape[-2:])}")
    if t.shape[0] == 1 and p.shape[0] > 1:
        t = t.expand_as(p)
    if t.shape != p.shape:
        raise ValueError(f"target has shape {tuple(target.shape)}: expected {tuple(pred.shape)} or "
                         f"{tuple(pred.shape[-2:])}")
    return p, t


def rank(v: torch.Tensor) -> torch.Tensor:
    """Ranks 1..N of the last dimension, ties given their average rank.  # same shape, float64"""
    flat = v.reshape(-1, v.shape[-1])  # (B, N)
    out = torch.empty(flat.shape, dtype=torch.float64, device=v.device)
    for b in range(flat.shape[0]):
        sorted_v, order = flat[b].sort()
        _, inverse, counts = torch.unique_consecutive(sorted_v, return_inverse=True, return_counts=True)
        ends = counts.cumsum(0).double()  # (G,)
        average = ends - (counts.double() - 1) / 2  # (G,) mean of ranks end-count+1 .. end
        out[b, order] = average[inverse]
    return out.reshape(v.shape)


def flat(pred: torch.Tensor, atol: float = FLAT_ATOL) -> torch.Tensor:
    """True for each map whose spread max - min is at most ``atol``.  # (B,) bool"""
    p = _maps("pred", pred)  # (B, N)
    return (p.amax(-1) - p.amin(-1)) <= atol


def spc(pred: torch.Tensor, target: torch.Tensor, atol: float = FLAT_ATOL) -> torch.Tensor:
    """Spearman correlation of each predicted map with its target; 0 for a flat map.  # (B,)

    ``pred`` (..., h, w); ``target`` of the same shape or one (h, w) map for all.
    """
    p, t = _pair(pred, target)  # (B, N) each
    rp, rt = rank(p), rank(t)  # (B, N)
    rp = rp - rp.mean(-1, keepdim=True)
    rt = rt - rt.mean(-1, keepdim=True)
    denom = (rp.square().sum(-1) * rt.square().sum(-1)).sqrt()  # (B,)
    rho = (rp * rt).sum(-1) / denom.clamp(min=1e-300)  # (B,)
    undefined = flat(pred, atol) | (denom == 0)
    return torch.where(undefined, torch.zeros_like(rho), rho)


def mae(pred: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """Mean absolute error of each predicted map against its target.  # (B,)"""
    p, t = _pair(pred, target)
    return (p - t).abs().mean(-1)
