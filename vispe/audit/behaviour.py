"""Behaviour probes: windows from one-patch changes, an image alone against it padded, bf16.

* ``window_groups``: a batch of images, each the base image with one patch changed; at the first
  attention call that splits the tokens into windows (its batch is larger than the images', or its
  sequence shorter than the grid), the one (window, slot) whose q changed says which window holds the
  patch. A window should be a rectangle of the grid (rf-detr #148: views of a non-square grid that
  mix rows far apart).
* ``padded_difference``: the image alone and the same image at the top-left of a larger canvas with
  the rest marked as padding; the last self-attention over the grid must give the same outputs at the
  image's tokens (a mask-aware model: DETR's sine over the valid area, keys of padding hidden).
* ``dtype_errors``: the outputs of the model's position modules (classes named like position /
  rotary / rope / sine / sincos, and vispe encodings) under bf16 autocast against float32: computed in
  float32 and cast, they differ by bf16 rounding only; computed in bf16 (Mask2Former's and SAM 2's
  sine, whose dtype is the features'), by much more.
"""
from __future__ import annotations

import re
from typing import Any

import torch
from torch import nn

from vispe.audit._run import Attn, Target

#: the top-left cells (rows, columns) whose one-patch changes are read by ``window_groups``
REGION = (12, 24)
POSITION_CLASS = re.compile(r"position|posemb|pos_?embed|rotary|rope|sincos|sine", re.IGNORECASE)


def first_windowed(attn: list[Attn], grid: tuple[int, int], batch: int = 1) -> int | None:
    """Index of the first attention call whose tokens are split into windows, else None."""
    h, w = grid
    for i, a in enumerate(attn):
        if a.q.shape[0] > batch or a.q.shape[2] < h * w:
            return i
    return None


def window_groups(t: Target, grid: tuple[int, int], index: int, *, chunk: int = 16,
                  region: tuple[int, int] = REGION) -> list[list[tuple[int, int]]] | str:
    """The grid cells of each window, or a string saying why they could not be read. Only the cells
    of the top-left ``region`` (rows, columns) are changed: a rectangular window meets that rectangle
    in a rectangle, so a window seen there that is not one is not one on the grid either."""
    h, w = grid
    ph, pw = t.patch
    base = t.images(grid, seed=1)
    rec0 = t.record(base, stop_after=index + 1)
    if rec0.error is not None or len(rec0.attn) <= index:
        return "the model did not reach that attention call"
    q0 = rec0.attn[index].q  # (nw, heads, L, d)
    nw = q0.shape[0]
    owner: dict[tuple[int, int], int] = {}
    cells = [(y, x) for y in range(min(h, region[0])) for x in range(min(w, region[1]))]
    noise = torch.randn(3, ph, pw, generator=torch.Generator().manual_seed(2)).to(base) * 3
    for s in range(0, len(cells), chunk):
        part = cells[s:s + chunk]
        imgs = base.repeat(len(part), 1, 1, 1)  # (n, 3, H, W)
        for i, (y, x) in enumerate(part):
            imgs[i, :, y * ph:(y + 1) * ph, x * pw:(x + 1) * pw] += noise
        rec = t.record(imgs, stop_after=index + 1)
        if rec.error is not None or len(rec.attn) <= index:
            return "the batch of one-patch changes did not run"
        q = rec.attn[index].q.reshape(len(part), nw, *q0.shape[1:])  # (n, nw, heads, L, d)
        diff = (q - q0[None]).abs().amax(dim=(2, 4))  # (n, nw, L)
        for i, cell in enumerate(part):
            hit = (diff[i] > 1e-5 * float(q0.abs().max())).nonzero()
            if len(hit) != 1:
                return f"a one-patch change moved {len(hit)} tokens at that call (expected 1)"
            owner[cell] = int(hit[0, 0])
    groups: dict[int, list[tuple[int, int]]] = {}
    for cell, win in owner.items():
        groups.setdefault(win, []).append(cell)
    return [groups[k] for k in sorted(groups)]


def is_rectangle(cells: list[tuple[int, int]]) -> bool:
    ys = sorted({y for y, _ in cells})
    xs = sorted({x for _, x in cells})
    full = ys == list(range(ys[0], ys[-1] + 1)) and xs == list(range(xs[0], xs[-1] + 1))
    return full and len(cells) == len(ys) * len(xs)


def _grid_calls(attn: list[Attn], n_grid: int) -> list[Attn]:
    return [a for a in attn if a.q.shape[2] == a.k.shape[2] and a.q.shape[2] >= n_grid]


def padded_difference(t: Target, grid: tuple[int, int], canvas: tuple[int, int]) -> float | str:
    """Largest relative difference between the last grid self-attention's outputs at the image's
    tokens, alone and padded to ``canvas`` (patches); or why it could not be measured."""
    h, w = grid
    H, W = t.pixels(grid)
    img = t.images(grid, seed=3)  # (1, 3, H, W)
    Hc, Wc = t.pixels(canvas)
    big = torch.zeros(1, img.shape[1], Hc, Wc, dtype=img.dtype, device=img.device)  # (1, 3, Hc, Wc)
    big[:, :, :H, :W] = img
    mask = torch.ones(1, Hc, Wc, dtype=torch.bool, device=img.device)  # (1, Hc, Wc) True = padding
    mask[:, :H, :W] = False
    alone, padded = t.record(img, torch.zeros(1, H, W, dtype=torch.bool, device=img.device)), t.record(big, mask)
    if alone.error is not None or padded.error is not None:
        return f"a run failed: {alone.error or padded.error}"
    a_calls, p_calls = _grid_calls(alone.attn, h * w), _grid_calls(padded.attn, canvas[0] * canvas[1])
    if not a_calls or len(a_calls) != len(p_calls):
        return "no matching self-attention over the grid in the two runs"
    a, p = a_calls[-1].out, p_calls[-1].out  # (1, heads, P + N, d)
    P = a.shape[2] - h * w
    if P < 0 or p.shape[2] - canvas[0] * canvas[1] != P:
        return "the token counts do not match the grid"
    pg = p[:, :, P:].reshape(*p.shape[:2], canvas[0], canvas[1], -1)[:, :, :h, :w].flatten(2, 3)  # (1, heads, N, d)
    pa = torch.cat([p[:, :, :P], pg], dim=2)
    return float((pa - a).abs().max() / a.abs().max().clamp_min(1e-12))


def position_modules(model: nn.Module) -> dict[str, nn.Module]:
    from vispe.encoding import ConditionalEncoding, PositionEncoding

    return {n: m for n, m in model.named_modules()  # a conditional encoding's output is features, not position
            if n and not isinstance(m, ConditionalEncoding) and "attention" not in type(m).__name__.lower()
            and (isinstance(m, PositionEncoding) or POSITION_CLASS.search(type(m).__name__))}


def _floats(out: Any) -> list[torch.Tensor]:
    if isinstance(out, torch.Tensor):
        return [out] if out.is_floating_point() else []
    if isinstance(out, (tuple, list)):
        return [t for o in out for t in _floats(o)]
    if isinstance(out, dict):
        return [t for o in out.values() for t in _floats(o)]
    return []


def dtype_errors(t: Target, grid: tuple[int, int], dtype: torch.dtype) -> dict[str, tuple[float, float]] | str:
    """Per position module: (largest error of its outputs under ``dtype`` autocast against float32,
    largest error of float32's outputs rounded to ``dtype``); or why it could not be measured."""
    mods = position_modules(t.model)
    if not mods:
        return "no module named like a position encoding"
    outs: dict[str, list[list[torch.Tensor]]] = {n: [[], []] for n in mods}
    img = t.images(grid, seed=4)
    for run, cast in enumerate((None, dtype)):
        handles = [m.register_forward_hook(lambda mod, a, o, n=n, r=run: outs[n][r].extend(
            x.detach() for x in _floats(o))) for n, m in mods.items()]
        try:
            rec = t.record(img, autocast=cast)
        finally:
            for hd in handles:
                hd.remove()
        if rec.error is not None:
            return f"the run under {cast or 'float32'} failed: {rec.error}"
    res = {}
    for n, (ref, low) in outs.items():
        if not ref or len(ref) != len(low):
            continue
        err = max(float((b.float() - a.float()).abs().max()) for a, b in zip(ref, low, strict=True))
        rnd = max(float((a.to(dtype).float() - a.float()).abs().max()) for a in ref)
        res[n] = (err, rnd)
    return res or "the position modules returned no floating tensors"
