"""Token coordinates, always as (y, x) in the last dimension.

* ``grid_coords(h, w)``: every token of an h x w grid, row-major, ``(h*w, 2)``.
* ``mask_coords(mask)``: DETR's positions counted over each image's valid area, ``(B, h, w, 2)``.
* ``resize_mask(mask, shape)``: a pixel padding mask brought to the feature grid (nearest).
* ``jitter_coords``: train-time shift / jitter augmentation of coordinates.
* ``valid_ratios``, ``level_reference_points``, ``points_at_levels``: multi-scale (Deformable DETR)
  reference points, (y, x) in unit coordinates of each level's map scaled by the valid ratios.

Conventions are parameters, never implicit:

``mode`` of ``grid_coords``
    ``"index"``      0, 1, ..., h-1 (the integer index; DETR without normalisation counts 1..h)
    ``"normalized"`` index / (h - 1), in [0, 1] (0 for a length-1 axis)
    ``"centered"``   pixel centres in [-1, 1]: (index + 0.5) / h * 2 - 1 (DINOv3-style RoPE)
    ``"pixel"``      pixel centre of a patch token: (index + 0.5) * patch_size
``offset`` of ``mask_coords``
    0.0 for DETR, -0.5 for Deformable DETR (applied to the cumulative count, before dividing).
"""
from __future__ import annotations

import contextlib
import math

import torch
import torch.nn.functional as F

from vispe import _checks

GRID_MODES = ("index", "normalized", "centered", "pixel")


def grid_coords(h: int, w: int, mode: str = "index", *, patch_size: float = 1.0,
                device=None, dtype=torch.float32) -> torch.Tensor:
    """Coordinates of the tokens of an (h, w) grid, row-major: ``out[i] = (y_i, x_i)``.  # (h*w, 2)"""
    h, w = _checks.grid_shape("(h, w)", (h, w))
    _checks.choice("mode", mode, GRID_MODES)
    ys = _axis(h, mode, patch_size, device)  # (h,)
    xs = _axis(w, mode, patch_size, device)  # (w,)
    yy, xx = torch.meshgrid(ys, xs, indexing="ij")  # (h, w) each
    return torch.stack([yy, xx], dim=-1).reshape(h * w, 2).to(dtype)  # (h*w, 2)


def _axis(n: int, mode: str, patch_size: float, device) -> torch.Tensor:
    i = torch.arange(n, device=device, dtype=torch.float32)  # (n,)
    if mode == "index":
        return i
    if mode == "normalized":
        return i / torch.sym_max(n - 1, 1)  # 0 for a length-1 axis, no branch on n (export)
    if mode == "centered":
        return (i + 0.5) / n * 2 - 1
    return (i + 0.5) * patch_size  # pixel


def float32_math(device: torch.device):
    """Autocast off on ``device``, so tables and angles are computed in float32 (then cast)."""
    try:
        return torch.autocast(torch.device(device).type, enabled=False)
    except RuntimeError:  # a device type autocast does not know: nothing to turn off
        return contextlib.nullcontext()


VALID_MODES = ("index", "normalized", "centered")


def valid_coords(shape: tuple[int, int], mask: torch.Tensor | None = None, mode: str = "index", *,
                 device=None) -> torch.Tensor:
    """Float32 (y, x) of the grid tokens, row-major, counted over each image's valid area.  # (B|1, h*w, 2)

    Without a mask: ``grid_coords(h, w, mode)`` with a leading 1. With a mask (B, h, w), True =
    padding: each token's position is its count among the valid cells of its column (y) / row (x)
    (``mask_coords``), brought to ``mode`` with that area's size, so the valid part of image b
    equals ``grid_coords(h_b, w_b, mode)``: an image alone and padded in a batch agree. Padding
    cells get finite values (those of the last valid cell; index 0 on an all-padding line).
    """
    _checks.choice("mode", mode, VALID_MODES)
    h, w = shape
    if mask is None:
        return grid_coords(h, w, mode, device=device)[None]  # (1, N, 2)
    count = mask_coords(mask.to(device), normalize=False)  # (B, h, w, 2), 1..n over valid cells
    cy, cx = count.unbind(-1)  # (B, h, w) each
    n = torch.stack(torch.broadcast_tensors(cy.amax(1, keepdim=True), cx.amax(2, keepdim=True)), -1)  # (B, h, w, 2)
    index = (count - 1).clamp(min=0)  # (B, h, w, 2)
    if mode == "index":
        out = index
    elif mode == "normalized":
        out = index / (n - 1).clamp(min=1)
    else:  # centered
        out = (index + 0.5) / n.clamp(min=1) * 2 - 1
    return out.reshape(mask.shape[0], h * w, 2)  # (B, N, 2)


def mask_coords(mask: torch.Tensor, *, normalize: bool = True, scale: float = 2 * math.pi,
                eps: float = 1e-6, offset: float = 0.0) -> torch.Tensor:
    """DETR's cumulative-sum positions over the valid area of each image.  # (B, h, w, 2)

    ``mask`` (B, h, w) is True at padding. The count starts at 1 on the first valid row/column.
    With ``normalize``, ``(count + offset) / (count_of_last_valid + eps) * scale``, so the valid
    area of every image spans (0, scale] whatever the padding: an image alone and the same image
    padded in a batch get the same coordinates on their valid area.
    """
    if mask.dim() != 3 or mask.dtype != torch.bool:
        raise ValueError(f"mask has shape {tuple(mask.shape)} and dtype {mask.dtype}: "
                         "expected a (B, h, w) torch.bool tensor (True = padding)")
    not_mask = (~mask).float()  # (B, h, w)
    y = not_mask.cumsum(1)  # (B, h, w)
    x = not_mask.cumsum(2)  # (B, h, w)
    if normalize:
        # The largest count of each column / row is its number of valid cells (padding is at the end
        # for DETR-style batches; max also handles padding placed anywhere).
        y = (y + offset) / (y.amax(1, keepdim=True) + eps) * scale
        x = (x + offset) / (x.amax(2, keepdim=True) + eps) * scale
    return torch.stack([y, x], dim=-1)  # (B, h, w, 2)


def resize_mask(mask: torch.Tensor, shape: tuple[int, int]) -> torch.Tensor:
    """Bring a pixel padding mask (B, H, W) to a feature grid (h, w), nearest, as DETR does."""
    shape = _checks.grid_shape("shape", shape)
    if mask.dim() != 3:
        raise ValueError(f"mask has shape {tuple(mask.shape)}: expected (B, H, W)")
    return F.interpolate(mask[:, None].float(), size=shape, mode="nearest")[:, 0].bool()  # (B, h, w)


def jitter_coords(coords: torch.Tensor, *, shift: float = 0.0, jitter: float = 0.0,
                  generator: torch.Generator | None = None) -> torch.Tensor:
    """Train-time augmentation: one random shift per image plus per-token jitter.

    ``coords`` (B, N, 2) or (N, 2); ``shift`` and ``jitter`` are maximal absolute offsets in the
    units of ``coords`` (uniform). Returns a new tensor of the same shape.
    """
    if shift < 0 or jitter < 0:
        raise ValueError(f"shift={shift}, jitter={jitter}: expected non-negative numbers")
    out = coords
    if shift:
        lead = coords.shape[:-2] + (1, 2)
        out = out + (torch.rand(lead, generator=generator, device=coords.device) * 2 - 1) * shift
    if jitter:
        out = out + (torch.rand(coords.shape, generator=generator, device=coords.device) * 2 - 1) * jitter
    return out


def unit_coords(coords, extent=None) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Checked continuous coordinates for ``PositionEncoding.at``: float32 ``coords`` (B|1, N, 2) as
    (y, x) in unit coordinates of the valid area, and ``extent`` (B|1, 1, 2) valid (h, w) in cells or
    None. Unit coordinates of an n-cell axis: cell i spans [i/n, (i+1)/n], its centre is (i+0.5)/n."""
    if not isinstance(coords, torch.Tensor) or coords.dim() != 3 or coords.shape[-1] != 2 or \
            not coords.is_floating_point():
        got = f"shape {tuple(coords.shape)}, dtype {coords.dtype}" if isinstance(coords, torch.Tensor) else type(coords).__name__
        raise ValueError(f"coords has {got}: expected a float tensor (B|1, N, 2) of (y, x) in unit coordinates")
    if extent is None:
        return coords.float(), None
    extent = torch.as_tensor(extent, device=coords.device).float()
    if extent.dim() == 1:
        extent = extent[None]
    if extent.dim() != 2 or extent.shape[-1] != 2 or \
            (extent.shape[0] not in (1, coords.shape[0]) and coords.shape[0] != 1):
        raise ValueError(f"extent has shape {tuple(extent.shape)}: expected (B|1, 2) valid (h, w) in cells "
                         f"for coords {tuple(coords.shape)}")
    return coords.float(), extent[:, None]  # (B|1, N, 2), (B|1, 1, 2)


def valid_extent(mask: torch.Tensor | None, shape: tuple[int, int], device=None) -> torch.Tensor:
    """Valid (h, w) of each image in cells: its valid rows and columns (at least 1), or the grid's
    without a mask; the one definition every encoding and the detector use.  # (B|1, 2) float32"""
    if mask is None:  # scalar_tensor of each side: sizes stay symbolic under torch.export / compile
        return torch.stack([torch.scalar_tensor(s, dtype=torch.float32) for s in shape]).to(device)[None]  # (1, 2)
    valid = ~(mask if device is None else mask.to(device))  # (B, h, w)
    return torch.stack([valid.any(2).sum(1), valid.any(1).sum(1)], -1).clamp(min=1).float()  # (B, 2)


def unit_to_grid(coords: torch.Tensor, extent: torch.Tensor | None, mode: str) -> torch.Tensor:
    """Unit (y, x) ``coords`` (B|1, N, 2) in a grid convention ``mode`` (``VALID_MODES``), so that cell
    centres (i + 0.5) / n land exactly on ``valid_coords``' values: "index" u n - 0.5, "normalized"
    (u n - 0.5) / (n - 1), "centered" 2u - 1 (needs no ``extent``, (B|1, 1, 2) valid cells).  # (B|1, N, 2)"""
    _checks.choice("mode", mode, VALID_MODES)
    if mode == "centered":
        return coords * 2 - 1
    if extent is None:
        raise ValueError(f"extent=None with coords={mode!r}: expected the valid (h, w) in cells of the grid beside "
                         "these points (B|1, 2), to place them in grid units")
    cells = coords * extent - 0.5  # (B|1, N, 2), centres at i
    return cells if mode == "index" else cells / (extent - 1).clamp(min=1)


def valid_ratios(masks) -> torch.Tensor:
    """Each image's valid fraction of every level's map, (h, w) order (Deformable DETR's
    ``get_valid_ratio`` per level, which gives (w, h)).  # (B, L, 2) float32

    ``masks`` [(B, h_l, w_l)], True = padding, each level's own mask (the pixel mask resized to the
    level, ``resize_mask``). The valid rows / columns are those with a valid cell (``valid_extent``:
    the papers count column 0 / row 0, the same for padding at the bottom / right); a level all
    padding counts one cell (the papers divide by zero there).
    """
    out = []
    for l, m in enumerate(masks):
        if m.dim() != 3 or m.dtype != torch.bool:
            raise ValueError(f"masks[{l}] has shape {tuple(m.shape)} and dtype {m.dtype}: expected a (B, h, w) "
                             "torch.bool tensor (True = padding)")
        size = torch.tensor(m.shape[-2:], dtype=torch.float32, device=m.device)  # (2,) as (h, w)
        out.append(valid_extent(m, tuple(m.shape[-2:])) / size)  # (B, 2)
    return torch.stack(out, 1)  # (B, L, 2)


def level_reference_points(shapes, ratios: torch.Tensor) -> torch.Tensor:
    """Deformable DETR's encoder reference points (``get_reference_points``), (y, x).  # (B, N, L, 2)

    Token n of level l (row-major, level after level, N = sum h_l w_l) sits at its cell centre in
    unit coordinates of image b's valid area on level l, ``((i + 0.5) / (r_l,y h_l), (j + 0.5) /
    (r_l,x w_l))``, and is looked up on every level l' at that point of the valid area, i.e. in unit
    coordinates of level l''s whole map: times ``ratios[b, l']``. ``shapes`` [(h_l, w_l)],
    ``ratios`` (B, L, 2) from ``valid_ratios``. Padding tokens get points beyond 1 (their outputs
    are never read).
    """
    if ratios.dim() != 3 or ratios.shape[1:] != (len(shapes), 2):
        raise ValueError(f"ratios has shape {tuple(ratios.shape)}: expected (B, {len(shapes)}, 2) valid (h, w) ratios")
    with float32_math(ratios.device):
        ratios = ratios.float()
        points = []
        for l, (h, w) in enumerate(shapes):
            ys = (torch.arange(h, dtype=torch.float32, device=ratios.device) + 0.5)[None] / (ratios[:, None, l, 0] * h)  # (B, h)
            xs = (torch.arange(w, dtype=torch.float32, device=ratios.device) + 0.5)[None] / (ratios[:, None, l, 1] * w)  # (B, w)
            yy, xx = torch.broadcast_tensors(ys[:, :, None], xs[:, None, :])  # (B, h, w) each
            points.append(torch.stack([yy, xx], -1).flatten(1, 2))  # (B, h*w, 2)
        return torch.cat(points, 1)[:, :, None] * ratios[:, None]  # (B, N, L, 2)


def points_at_levels(reference: torch.Tensor, ratios: torch.Tensor) -> torch.Tensor:
    """Points or boxes in unit coordinates of each image's valid area, (B, Q, 2) as (y, x) or (B, Q, 4) as
    (cy, cx, h, w), in unit coordinates of every level's whole map: times the level's valid ratios
    (Deformable DETR's decoder, ``reference_points_input``).  # (B, Q, L, 2|4)"""
    if reference.dim() != 3 or reference.shape[-1] not in (2, 4) or ratios.dim() != 3 or ratios.shape[-1] != 2:
        raise ValueError(f"reference {tuple(reference.shape)} and ratios {tuple(ratios.shape)}: expected (B, Q, 2|4) "
                         "and (B, L, 2)")
    scale = ratios if reference.shape[-1] == 2 else torch.cat([ratios, ratios], -1)  # (B, L, 2|4)
    return reference[:, :, None] * scale[:, None].to(reference.dtype)  # (B, Q, L, 2|4)
