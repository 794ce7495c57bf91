"""Multi-scale deformable attention's sampling (Zhu et al., ICLR 2021), in plain PyTorch.

Each query q of head m reads, at every level l, ``P`` points near its reference point and sums them
with softmax weights (the paper's Eq. 3, without the projections, which live in
``vispe.deformable_attention.MSDeformAttn``)::

    out[q, m] = sum_l sum_p  A[q, m, l, p] * V_l,m( loc[q, m, l, p] )        # V_l,m sampled bilinearly

Conventions (vispe's (y, x) inside; the papers' (x, y) only where their layout is fixed):

* Precision: sampling locations and the weighted sum are computed in float32 (autocast off), the
  output cast to the value's dtype: a bfloat16 location is off by up to 1/256 of the map, a quarter
  of a cell on a 64-wide level.
* ``Levels``: the level shapes as (h, w), tokens flattened row-major level after level
  (``start[l]`` = the index of level l's first token), as the papers' ``spatial_shapes`` and
  ``level_start_index``.
* Locations are (y, x) in *unit coordinates of each level's map*, [0, 1] over the whole (padded)
  map: cell i of n spans [i/n, (i+1)/n], its centre is (i + 0.5)/n. A location reads the map
  bilinearly between cell centres, and zeros outside the map (``grid_sample`` with
  ``align_corners=False``, ``padding_mode="zeros"``, as the papers' CUDA kernel and
  ``ms_deform_attn_core_pytorch``).
* Where the papers' (x, y) meets vispe's (y, x): the ``sampling_offsets`` projection keeps the
  checkpoints' (x, y) pairs (so their weights load unchanged) and ``grid_sample`` takes (x, y), so the
  sampling runs in (x, y). ``_grid`` is the one place that converts: it flips the small reference
  tensor (B, Q, L, 2|4) to (x, y[, w, h]) and the level shapes to (w, h), the papers' normaliser of
  the offsets, never the big (B, Q, M, L, P, 2) offsets. The public ``sampling_locations`` and
  ``ms_deform_attn`` speak (y, x) (for users and the tests; they flip their locations), the module
  calls ``deform_attn`` (reference points (y, x) in, no flip of the offsets).

The kernel: one ``F.grid_sample`` per level on (B*heads, head_dim, h, w), as the papers' pure-PyTorch
path, with the weighted sum accumulated level by level (no (B*heads, head_dim, Q, L*P) stack) and the
per-level pieces taken by ``split`` / ``unbind`` of level-major copies (their backward is one ``cat``,
not a zero-filled full-size gradient per level as slicing gives): 0.8x transformers' encoder time on
the CPU (``bench/deformable_step.py``). Tried and dropped: the four bilinear corners as rows of one
``F.embedding_bag`` with per-sample weights (no sampled tensor in the forward), whose CPU backward
sorts the indices and was slower than transformers' encoder (the code: git history, ``d0c87be``).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from vispe import _checks
from vispe.coords import float32_math


@dataclass(frozen=True)
class Levels:
    """The feature levels of one forward pass: ``shapes`` ((h, w), ...) of each level, in order."""

    shapes: tuple[tuple[int, int], ...]

    def __post_init__(self) -> None:
        shapes = tuple(_checks.grid_shape(f"shapes[{i}]", tuple(v if isinstance(v, torch.SymInt) else int(v) for v in s))
                       for i, s in enumerate(self.shapes))  # SymInts stay symbolic (torch.export at any size)
        if not shapes:
            raise ValueError("shapes=(): expected at least one level (h, w)")
        object.__setattr__(self, "shapes", shapes)

    @classmethod
    def of(cls, maps) -> Levels:
        """The levels of feature maps ``maps`` [(B, C, h, w) or (B, h, w)], in order."""
        return cls(tuple(tuple(m.shape[-2:]) for m in maps))

    @property
    def sizes(self) -> list[int]:  # tokens per level
        return [h * w for h, w in self.shapes]

    @property
    def start(self) -> list[int]:  # index of each level's first token (the papers' level_start_index)
        out, n = [], 0
        for s in self.sizes:
            out.append(n)
            n += s
        return out

    @property
    def num_tokens(self) -> int:
        return sum(self.sizes)

    def __len__(self) -> int:
        return len(self.shapes)

    def tensor(self, device=None) -> torch.Tensor:
        """The shapes as a (L, 2) long tensor of (h, w) (the papers' ``spatial_shapes``)."""
        return torch.tensor(self.shapes, dtype=torch.long, device=device)  # (L, 2)

    def flatten(self, maps) -> torch.Tensor:
        """Maps [(B, C, h, w)] -> tokens (B, N, C); masks [(B, h, w)] -> (B, N), row-major level after level."""
        if len(maps) != len(self) or any(tuple(m.shape[-2:]) != s for m, s in zip(maps, self.shapes)):
            raise ValueError(f"maps have shapes {[tuple(m.shape[-2:]) for m in maps]}: expected {list(self.shapes)}")
        if maps[0].dim() == 3:
            return torch.cat([m.flatten(1) for m in maps], 1)  # (B, N)
        return torch.cat([m.flatten(2).transpose(1, 2) for m in maps], 1)  # (B, N, C)

    def split(self, tokens: torch.Tensor) -> list[torch.Tensor]:
        """Tokens (B, N, C) -> maps [(B, C, h, w)], the inverse of ``flatten``."""
        parts = tokens.split(self.sizes, dim=1)
        return [p.transpose(1, 2).unflatten(-1, s) for p, s in zip(parts, self.shapes)]


def swap_xy(t: torch.Tensor) -> torch.Tensor:
    """(x, y) <-> (y, x) pairs in the last dimension: (x, y) -> (y, x), (cx, cy, w, h) -> (cy, cx, h, w).
    Its own inverse; where the papers' (x, y) boxes meet vispe's (y, x) reference points."""
    if t.shape[-1] not in (2, 4):
        raise ValueError(f"last dimension {t.shape[-1]}: expected 2 (a point) or 4 (a box)")
    return t.unflatten(-1, (-1, 2)).flip(-1).flatten(-2)


def sampling_locations(reference: torch.Tensor, offsets_xy: torch.Tensor, levels: Levels) -> torch.Tensor:
    """Where every point samples, (y, x) in unit coordinates of each level's map.  # (B, Q, M, L, P, 2)

    ``reference`` (B, Q, L, 2) as (y, x), or (B, Q, L, 4) as boxes (cy, cx, h, w), in unit coordinates
    of each level's map (already scaled by the valid ratios); ``offsets_xy`` (B, Q, M, L, P, 2) as the
    papers' projection gives them, (x, y) pairs. Points: ``ref + offset / (w_l, h_l)`` (offsets in
    cells of level l); boxes: ``centre + offset / P * (w, h) / 2`` (offsets in eighths of the box for
    P = 4, Deformable DETR's refinement and two-stage variants).
    """
    return _grid(reference, offsets_xy, levels, unit=True).flip(-1)  # (B, Q, M, L, P, 2) as (y, x)


def _grid(reference: torch.Tensor, offsets_xy: torch.Tensor, levels: Levels, *, unit: bool) -> torch.Tensor:
    """The sampling points in the papers' (x, y) order: unit coordinates (``unit``) or ``grid_sample``'s
    [-1, 1] (2 u - 1, computed as ``2 ref - 1 + 2 offset / size`` without the unit tensor).  # (B, Q, M, L, P, 2)

    The one place where vispe's (y, x) reference points meet the papers' (x, y) offsets: the small
    reference tensor (B, Q, L, 2|4) and the level sizes are flipped, never the big offsets."""
    B, Q, M, L, P, _ = offsets_xy.shape
    if reference.dim() != 4 or reference.shape[:3] != (B, Q, L) or reference.shape[-1] not in (2, 4):
        raise ValueError(f"reference has shape {tuple(reference.shape)}: expected ({B}, {Q}, {L}, 2) points (y, x) "
                         f"or ({B}, {Q}, {L}, 4) boxes (cy, cx, h, w)")
    if len(levels) != L:
        raise ValueError(f"levels has {len(levels)} levels: the offsets have {L}")
    ref = swap_xy(reference.to(offsets_xy.dtype))[:, :, None, :, None]  # (B, Q, 1, L, 1, 2|4) as (x, y[, w, h])
    k = 1.0 if unit else 2.0
    centre = ref[..., :2] if unit else ref[..., :2] * 2 - 1  # (B, Q, 1, L, 1, 2)
    if reference.shape[-1] == 2:
        wh = levels.tensor(offsets_xy.device).flip(-1).to(offsets_xy.dtype)  # (L, 2) as (w, h): the papers' normaliser
        return centre + offsets_xy * (k / wh[:, None])  # (B, Q, M, L, P, 2)
    return centre + offsets_xy * (ref[..., 2:] * (k * 0.5 / P))  # (B, Q, M, L, P, 2)


def ms_deform_attn(value: torch.Tensor, levels: Levels, locations: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
    """The attention-weighted sum of bilinear samples of ``value`` at ``locations``.  # (B, Q, M*D)

    ``value`` (B, N, M, D): N = ``levels.num_tokens`` tokens flattened level after level, M heads of D
    channels; ``locations`` (B, Q, M, L, P, 2) unit (y, x) of each level's map; ``weights``
    (B, Q, M, L, P) (softmax over L*P in the papers). Output channels are head-major (m * D + d).
    """
    with float32_math(value.device):
        grid = _wide(locations).flip(-1) * 2 - 1  # (B, Q, M, L, P, 2) as (x, y) in [-1, 1]
        return _sample(value, levels, grid, weights)


def deform_attn(value: torch.Tensor, levels: Levels, reference: torch.Tensor, offsets_xy: torch.Tensor,
                weights: torch.Tensor) -> torch.Tensor:
    """``ms_deform_attn`` at ``sampling_locations(reference, offsets_xy, levels)``, without building the
    (y, x) locations (the module's path).  # (B, Q, M*D)"""
    with float32_math(value.device):
        return _sample(value, levels, _grid(_wide(reference), _wide(offsets_xy), levels, unit=False), weights)


def _wide(t: torch.Tensor) -> torch.Tensor:
    """``t`` in float32 at least (float64 stays, for reference checks)."""
    return t.to(torch.promote_types(t.dtype, torch.float32))


def _sample(value, levels: Levels, grid, weights) -> torch.Tensor:
    """Checks, then the kernel in float32 (cast to ``value``'s dtype at the end); ``grid`` (B, Q, M, L, P, 2)
    is grid_sample's (x, y) in [-1, 1], float32."""
    B, N, M, D = value.shape
    if N != levels.num_tokens:
        raise ValueError(f"value has {N} tokens: levels {list(levels.shapes)} have {levels.num_tokens}")
    if grid.shape[:3] != (B, grid.shape[1], M) or grid.shape[3] != len(levels) or \
            grid.shape[-1] != 2 or weights.shape != grid.shape[:-1]:
        raise ValueError(f"locations {tuple(grid.shape)} and weights {tuple(weights.shape)}: expected "
                         f"(B, Q, {M}, {len(levels)}, P, 2) and (B, Q, {M}, {len(levels)}, P)")
    out = _grid_sample(_wide(value), levels, grid.to(_wide(value).dtype), weights.to(_wide(value).dtype))
    return out.to(value.dtype)


def _grid_sample(value, levels: Levels, grid, weights) -> torch.Tensor:
    B, N, M, D = value.shape
    Q, L, P = grid.shape[1], grid.shape[3], grid.shape[4]
    v = value.permute(0, 2, 3, 1).reshape(B * M, D, N)  # (B*M, D, N): one copy for all levels
    # level-major copies, then views: per-level pieces by split/unbind, whose backward is one cat (no
    # zero-filled full-size gradient per level as slicing would give)
    grids = grid.permute(3, 0, 2, 1, 4, 5).reshape(L, B * M, Q, P, 2).unbind(0)  # L x (B*M, Q, P, 2)
    ws = weights.permute(3, 0, 2, 1, 4).reshape(L, B * M, 1, Q, P).unbind(0)  # L x (B*M, 1, Q, P)
    out = None
    for vl, g, w, (h, wd) in zip(v.split(levels.sizes, dim=-1), grids, ws, levels.shapes):
        s = F.grid_sample(vl.view(B * M, D, h, wd), g, mode="bilinear", padding_mode="zeros",
                          align_corners=False)  # (B*M, D, Q, P)
        s = (s * w).sum(-1)  # (B*M, D, Q)
        out = s if out is None else out + s
    return out.view(B, M * D, Q).transpose(1, 2)  # (B, Q, M*D)

