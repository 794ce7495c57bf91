"""An additive code read from the model: the first block's input on a constant image.

On an all-zero image every patch embeds to the same vector, so the first block's input at grid
token (y, x) is that vector plus the position code there (the code relative to its mean over the
grid is what is compared). ``axis_channels`` says which channels vary along y and which along x;
``resample_rule`` compares the code at another grid with the native one: computed at each position
(integer coordinates: the native code is the top-left corner of the new one), resampled (the new one
is the native one interpolated: normalised coordinates or a resampled table), resampled with y and x
swapped (the native code transposed, then interpolated), resampled to size (w, h) and read as (h, w)
(an interpolation's size passed in (w, h) order: it cancels on square grids), or the flat
table read again at another grid of the same token count (timm #2737).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F


def grid_code(tokens: torch.Tensor, grid: tuple[int, int]) -> torch.Tensor | None:
    """Grid tokens (the last h*w) of batch 0 as (h, w, C), minus their mean; None if too few tokens."""
    h, w = grid
    if tokens.dim() == 4:  # (B, h, w, C) as SAM's ViT keeps them
        tokens = tokens.flatten(1, 2)
    if tokens.dim() != 3 or tokens.shape[1] < h * w:
        return None
    t = tokens[0, -h * w:].double().reshape(h, w, -1)  # (h, w, C)
    return t - t.mean(dim=(0, 1))


def varies(code: torch.Tensor | None, ref: torch.Tensor | None = None) -> bool:
    """Whether the tokens differ (relative to the size of the tokens themselves)."""
    if code is None:
        return False
    scale = float(ref.abs().max()) if ref is not None else 1.0
    return float(code.abs().max()) > 1e-5 * max(scale, 1e-12)


def axis_channels(code: torch.Tensor) -> str:
    """Which channels change along y and which along x: "y then x (halves)", "x then y (halves)",
    "interleaved y, x", or "mixed"."""
    vy = code.mean(dim=1).var(dim=0)  # (C,) variation along y of the row means
    vx = code.mean(dim=0).var(dim=0)  # (C,)
    ys = vy > vx
    C = ys.numel()
    if C % 2 == 0 and bool(ys[: C // 2].all()) and not bool(ys[C // 2:].any()):
        return "y then x (channel halves)"
    if C % 2 == 0 and not bool(ys[: C // 2].any()) and bool(ys[C // 2:].all()):
        return "x then y (channel halves)"
    if C % 2 == 0 and bool(ys[0::2].all()) and not bool(ys[1::2].any()):
        return "interleaved y, x"
    return "mixed (every channel depends on both axes)"


def _interp(code: torch.Tensor, size: tuple[int, int]) -> torch.Tensor:
    x = code.permute(2, 0, 1)[None]  # (1, C, h, w)
    y = F.interpolate(x, size=size, mode="bicubic", align_corners=False)
    y = y[0].permute(1, 2, 0)  # (h1, w1, C)
    return y - y.mean(dim=(0, 1))


def _err(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).norm() / b.norm().clamp_min(1e-12))


def resample_rule(native: torch.Tensor, other: torch.Tensor) -> tuple[str, dict[str, float]]:
    """native (h0, w0, C), other (h1, w1, C), each minus its mean. Returns the rule's name ("computed",
    "resampled", "swapped", "unchanged", "other") and the relative errors of each hypothesis."""
    h0, w0, _ = native.shape
    h1, w1, _ = other.shape
    h, w = min(h0, h1), min(w0, w1)
    a, b = native[:h, :w], other[:h, :w]
    errs = {"computed": _err(b - b[:1, :1], a - a[:1, :1]),
            "resampled": _err(other, _interp(native, (h1, w1))),
            "swapped": _err(other, _interp(native.transpose(0, 1), (h1, w1)))}
    if (h0, w0) != (h1, w1) and h1 != w1:
        flat = _interp(native, (w1, h1)).reshape(h1, w1, -1)
        errs["size_swapped"] = _err(other, flat - flat.mean(dim=(0, 1)))
    if h0 * w0 == h1 * w1 and (h0, w0) != (h1, w1):
        flat = native.reshape(h1, w1, -1)
        errs["unchanged"] = _err(other, flat - flat.mean(dim=(0, 1)))
    if errs["computed"] < 1e-4:
        return "computed", errs
    if errs.get("unchanged", 1.0) < 1e-4:
        return "unchanged", errs
    for bad in ("size_swapped", "swapped"):
        if errs.get(bad, 1.0) < 0.25 and errs[bad] < 0.5 * errs["resampled"]:
            return bad, errs
    if errs["resampled"] < 0.25:
        return "resampled", errs
    return "other", errs


RULES = {"computed": "computed at each position (integer coordinates: the native code is the new one's corner)",
         "resampled": "resampled (the new code is the native one interpolated to the new grid)",
         "swapped": "resampled with y and x swapped (the native code transposed, then interpolated)",
         "size_swapped": "resampled to (w, h) and read as (h, w): the size's axes swapped (right on squares only)",
         "unchanged": "unchanged: the flat native table read again at another grid of the same token count",
         "other": "neither computed per position nor an interpolation of the native code"}
