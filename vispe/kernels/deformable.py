"""Multi-scale deformable attention's sampling (Zhu et al., ICLR 2021), in plain PyTorch.

Each query q of head m reads, at every level l, ``P`` points near its reference point and sums them
with softmax weights (the paper's Eq. 3, without the projections, which live in
``vispe.deformable_attention.MSDeformAttn``)::

    out[q, m] = sum_l sum_p  A[q, m, l, p] * V_l,m( loc[q, m, l, p] )        # V_l,m sampled bilinearly

Conventions (vispe's (y, x) inside; the papers' (x, y) only where their layout is fixed):

* ``Levels``: the level shapes as (h, w), tokens flattened row-major level after level
  (``start[l]`` = the index of level l's first token), as the papers' ``spatial_shapes`` and
  ``level_start_index``.
* Locations are (y, x) in *unit coordinates of each level's map*, [0, 1] over the whole (padded)
  map: cell i of n spans [i/n, (i+1)/n], its centre is (i + 0.5)/n. A location reads the map
  bilinearly between cell centres, and zeros outside the map (``grid_sample`` with
  ``align_corners=False``, ``padding_mode="zeros"``, as the papers' CUDA kernel and
  ``ms_deform_attn_core_pytorch``).
* ``sampling_locations`` is where the papers' (x, y) layout meets vispe's: the ``sampling_offsets``
  projection keeps the checkpoints' (x, y) pairs (so their weights load unchanged), and is flipped
  to (y, x) there, then normalised by each level's (h, w) (the papers divide their (x, y) offsets by
  (w, h): the same numbers, so an (h, w) slip cannot hide in a swapped normaliser). ``grid_sample``
  takes (x, y): the only other flip, inside ``ms_deform_attn``.

Two implementations of ``ms_deform_attn``, equal to float rounding (``impl``):

* ``"grid_sample"``: one ``F.grid_sample`` per level on (B*heads, head_dim, h, w), as the papers'
  pure-PyTorch path, the weighted sum accumulated level by level (no (.., L*P) stack).
* ``"bag"``: the four bilinear corners of every point as rows of the value table, their bilinear
  weight times the attention weight as ``per_sample_weights`` of one ``F.embedding_bag`` (mode
  "sum") over all levels at once: no sampled tensor (B*heads, head_dim, Q, L*P) is materialised,
  in the forward or the backward.
* ``"auto"`` (default): ``AUTO_IMPL`` (the faster one on the CPU in ``bench/deformable_step.py``).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from vispe import _checks

IMPLS = ("auto", "grid_sample", "bag")
AUTO_IMPL = "bag"


@dataclass(frozen=True)
class Levels:
    """The feature levels of one forward pass: ``shapes`` ((h, w), ...) of each level, in order."""

    shapes: tuple[tuple[int, int], ...]

    def __post_init__(self) -> None:
        shapes = tuple(_checks.grid_shape(f"shapes[{i}]", tuple(int(v) for v in s)) for i, s in enumerate(self.shapes))
        if not shapes:
            raise ValueError("shapes=(): expected at least one level (h, w)")
        object.__setattr__(self, "shapes", shapes)

    @classmethod
    def of(cls, maps) -> "Levels":
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
    papers' projection gives them, (x, y) pairs. Points: ``ref + offset_yx / (h_l, w_l)`` (offsets in
    cells of level l); boxes: ``centre + offset_yx / P * (h, w) / 2`` (offsets in eighths of the box
    for P = 4, Deformable DETR's refinement and two-stage variants).
    """
    B, Q, M, L, P, _ = offsets_xy.shape
    if reference.dim() != 4 or reference.shape[:3] != (B, Q, L) or reference.shape[-1] not in (2, 4):
        raise ValueError(f"reference has shape {tuple(reference.shape)}: expected ({B}, {Q}, {L}, 2) points (y, x) "
                         f"or ({B}, {Q}, {L}, 4) boxes (cy, cx, h, w)")
    if len(levels) != L:
        raise ValueError(f"levels has {len(levels)} levels: the offsets have {L}")
    offsets = offsets_xy.flip(-1)  # (B, Q, M, L, P, 2) as (y, x): the one flip of the projection's layout
    ref = reference[:, :, None, :, None]  # (B, Q, 1, L, 1, 2|4)
    if reference.shape[-1] == 2:
        hw = levels.tensor(offsets.device).to(offsets.dtype)  # (L, 2) as (h, w)
        return ref + offsets / hw[:, None]  # (B, Q, M, L, P, 2)
    return ref[..., :2] + offsets / P * ref[..., 2:] * 0.5  # (B, Q, M, L, P, 2)


def ms_deform_attn(value: torch.Tensor, levels: Levels, locations: torch.Tensor, weights: torch.Tensor,
                   impl: str = "auto") -> torch.Tensor:
    """The attention-weighted sum of bilinear samples of ``value`` at ``locations``.  # (B, Q, M*D)

    ``value`` (B, N, M, D): N = ``levels.num_tokens`` tokens flattened level after level, M heads of D
    channels; ``locations`` (B, Q, M, L, P, 2) unit (y, x) of each level's map; ``weights``
    (B, Q, M, L, P) (softmax over L*P in the papers). Output channels are head-major (m * D + d).
    """
    impl = _checks.choice("impl", impl, IMPLS)
    B, N, M, D = value.shape
    if N != levels.num_tokens:
        raise ValueError(f"value has {N} tokens: levels {list(levels.shapes)} have {levels.num_tokens}")
    if locations.shape[:3] != (B, locations.shape[1], M) or locations.shape[3] != len(levels) or \
            locations.shape[-1] != 2 or weights.shape != locations.shape[:-1]:
        raise ValueError(f"locations {tuple(locations.shape)} and weights {tuple(weights.shape)}: expected "
                         f"(B, Q, {M}, {len(levels)}, P, 2) and (B, Q, {M}, {len(levels)}, P)")
    if (AUTO_IMPL if impl == "auto" else impl) == "bag":
        return _bag(value, levels, locations, weights)
    return _grid_sample(value, levels, locations, weights)


def _grid_sample(value, levels: Levels, locations, weights) -> torch.Tensor:
    B, N, M, D = value.shape
    Q = locations.shape[1]
    grids = (locations.flip(-1) * 2 - 1).transpose(1, 2).flatten(0, 1)  # (B*M, Q, L, P, 2) as (x, y) in [-1, 1]
    w = weights.transpose(1, 2).flatten(0, 1)[:, None]  # (B*M, 1, Q, L, P)
    out = None
    for l, (v, (h, wd)) in enumerate(zip(value.split(levels.sizes, dim=1), levels.shapes)):
        v = v.permute(0, 2, 3, 1).reshape(B * M, D, h, wd)  # (B*M, D, h, w)
        s = F.grid_sample(v, grids[:, :, l], mode="bilinear", padding_mode="zeros", align_corners=False)  # (B*M, D, Q, P)
        s = (s * w[..., l, :]).sum(-1)  # (B*M, D, Q)
        out = s if out is None else out + s
    return out.view(B, M * D, Q).transpose(1, 2)  # (B, Q, M*D)


def _bag(value, levels: Levels, locations, weights) -> torch.Tensor:
    B, N, M, D = value.shape
    Q, L, P = locations.shape[1], locations.shape[3], locations.shape[4]
    dev = value.device
    shapes = levels.tensor(dev)  # (L, 2) as (h, w)
    size = shapes.view(L, 1, 1, 2)  # (L, 1, 1, 2)
    with torch.no_grad():
        start = torch.tensor(levels.start, device=dev).view(L, 1)  # (L, 1)
    pix = locations * size[:, 0].to(locations.dtype) - 0.5  # (B, Q, M, L, P, 2): cell centres at integers
    low = pix.floor()  # (B, Q, M, L, P, 2)
    frac = pix - low  # (B, Q, M, L, P, 2), weight of the upper neighbour
    low = low.long()
    corner = torch.tensor([[0, 0], [0, 1], [1, 0], [1, 1]], device=dev)  # (4, 2) as (dy, dx)
    cells = low[..., None, :] + corner  # (B, Q, M, L, P, 4, 2)
    inside = ((cells >= 0) & (cells < size)).all(-1)  # (B, Q, M, L, P, 4)
    wyx = torch.where(corner.bool(), frac[..., None, :], 1 - frac[..., None, :])  # (B, Q, M, L, P, 4, 2)
    cw = wyx.prod(-1) * weights[..., None] * inside  # (B, Q, M, L, P, 4)
    with torch.no_grad():
        cells = cells.clamp(min=0)
        idx = start[:, :, None] + cells[..., 0] * shapes[:, 1].view(L, 1, 1) + cells[..., 1]  # (B, Q, M, L, P, 4)
        idx = torch.where(inside, idx, 0)
        rows = (idx + torch.arange(B, device=dev).view(B, 1, 1, 1, 1, 1) * N) * M \
            + torch.arange(M, device=dev).view(1, 1, M, 1, 1, 1)  # rows of value (B*N*M, D)
    out = F.embedding_bag(rows.view(B * Q * M, L * P * 4), value.reshape(B * N * M, D),
                          per_sample_weights=cw.reshape(B * Q * M, L * P * 4).to(value.dtype), mode="sum")  # (B*Q*M, D)
    return out.view(B, Q, M * D)
