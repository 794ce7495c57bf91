"""LookHere: directed 2D attention masks and distance penalties (Fuller et al., NeurIPS 2024;
GreenCUBIC/lookhere). No position vector at all: each head looks in a fixed direction (keys
outside its field of view are masked) and pays a penalty growing with the query-key distance,
subtracted from the logits:

    bias[h, i, j] = -g * l * s_h * dist(i, j)     if key j is in head h's field of view from query i
                  = MASKED                         otherwise

``dist`` is the Euclidean distance of the two patches in patch units ("linear"; "sqrt" and
"square" are the reference's options, which, as there, do not apply to "center" heads), ``g`` the global slope, ``l`` the layer's slope, ``s_h``
the head's. The conventions of the reference (``lookhere.py``, ``create_lh_bias_tensor``):

* directions (``directions``, the reference's shorthand, groups joined by "-"): "halves" (up, down,
  left, right: 180 degrees), "diagonals" (180 degrees turned by 45), "corners" (quadrants, 90),
  "triangles" (90-degree cones around up, down, left, right), "eighths1" / "eighths2" (45-degree
  wedges), "none" (no mask), "center" (distance of the key to the grid centre), "zero" (no bias),
  "zerohalves", "zerocorners", "zerotriangles", "none1zero3", ... Each group names 4 head views;
  heads get them in blocks of 4, round-robin over the groups, each group's heads together (the
  reference's tables for 6, 12 and 16 heads; other counts follow the same rule, a last partial
  block taking the first views of its group);
* the variants (``variant``): "lh90" = "corners-triangles-none" (the reference's released LH-90,
  global slope 2, layer slopes 1.5 -> 0.5), "lh180" = "halves-diagonals-none" and "lh45" =
  "eighths1-eighths2-none" (their 180- and 45-degree analogues; the released LH-180 / LH-45
  configs were not read here, the same slopes are assumed);
* slopes: per group of n directed heads ``2^-(1 + i // 4)`` (the reference's ``get_slopes``), of n
  "none" / "center" / "zero" heads 1/4, 1/16, 1/64, 1/256 (each repeated n/4 times,
  ``get_none_slopes``); layer slopes ``linspace(1.5, 0.5, depth)[layer]`` (a ViT passes ``layer``
  and ``depth``; without them the mean, 1.0); global slope 2;
* masked logits: the reference writes -(bfloat16's max); vispe writes ``MASKED`` = -65504, finite in
  float16 too, so that a padded query whose whole field of view is padding gets no NaN
  (``fill_with="zero"`` / "max": the reference's other fillings).

Directions are read on the image: up = smaller y (row index), left = smaller x; a field of view
includes its boundary rays and the query itself. Prefix tokens: the bias family's rule
(``vispe.image._bias``: learned scalars, zero at init, as the reference's zero row and column).
Padding mask: the bias between two valid tokens depends only on their offset (invariant to
padding), and "center" heads use the centre of each image's valid area (``mask_aware``). Grid
change: recomputed at any (h, w), as the reference's ``set_pos_embed`` (cached per grid: nothing
learns). Output float32 (1|B, heads, P+N, P+N), cast to ``dtype`` at the end.
"""
from __future__ import annotations

import torch

from vispe import _checks
from vispe.coords import valid_coords
from vispe.image._bias import BiasBase
from vispe.registry import register

MASKED = -65504.0
VARIANTS = {"lh90": "corners-triangles-none", "lh180": "halves-diagonals-none", "lh45": "eighths1-eighths2-none"}
DISTANCES = ("linear", "sqrt", "square")
FILLS = ("inf", "zero", "max")
GROUPS = {  # shorthand -> the views of its 4 heads (each a list of directions, all must hold)
    "none": [[]] * 4, "zero": [["zero"]] * 4, "none1zero3": [[]] + [["zero"]] * 3,
    "none2zero2": [[]] * 2 + [["zero"]] * 2, "none3zero1": [[]] * 3 + [["zero"]], "center": [["center"]] * 4,
    "halves": [["up"], ["down"], ["left"], ["right"]],
    "corners": [["up", "left"], ["up", "right"], ["down", "left"], ["down", "right"]],
    "triangles": [["tri_up"], ["tri_down"], ["tri_left"], ["tri_right"]],
    "diagonals": [["diag_up_right"], ["diag_up_left"], ["diag_down_right"], ["diag_down_left"]],
    "eighths1": [["tri_up", "left"], ["tri_down", "left"], ["tri_left", "up"], ["tri_right", "up"]],
    "eighths2": [["tri_up", "right"], ["tri_down", "right"], ["tri_left", "down"], ["tri_right", "down"]],
    "zerohalves": [["zero", "up"], ["zero", "down"], ["zero", "left"], ["zero", "right"]],
    "zerocorners": [["zero", "up", "left"], ["zero", "up", "right"], ["zero", "down", "left"], ["zero", "down", "right"]],
    "zerotriangles": [["zero", "tri_up"], ["zero", "tri_down"], ["zero", "tri_left"], ["zero", "tri_right"]],
}
UNDIRECTED = ("none", "zero", "center")  # groups whose name contains one of these get the "none" slopes
NONE_SLOPES = (0.25, 0.0625, 0.015625, 0.00390625)


def head_plan(directions: str, num_heads: int) -> tuple[list[list[str]], list[float]]:
    """The views and head slopes of ``num_heads`` heads for a direction string (module docstring)."""
    names = directions.split("-")
    unknown = [n for n in names if n not in GROUPS]
    if unknown:
        raise ValueError(f"directions={directions!r}: unknown group(s) {unknown}; expected groups of "
                         f"{', '.join(GROUPS)} joined by '-'")
    count = [0] * len(names)
    for block in range(-(-num_heads // 4)):  # blocks of 4 heads, round-robin over the groups
        count[block % len(names)] += min(4, num_heads - 4 * block)
    views, slopes = [], []
    for name, n in zip(names, count):
        views += [GROUPS[name][i % 4] for i in range(n)]
        if any(u in name for u in UNDIRECTED):
            rep = max(1, -(-n // 4))
            slopes += [NONE_SLOPES[i // rep] for i in range(n)] if n >= 4 else list(NONE_SLOPES[:n])
        else:
            slopes += [2.0 ** -(1 + i // 4) for i in range(n)]
    return views, slopes


def _visible(direction: str, dy: torch.Tensor, dx: torch.Tensor) -> torch.Tensor:
    """Whether key offset (dy, dx) = key - query is in the field of view of one direction.  # dy.shape bool"""
    if direction.startswith("diag_"):
        _, a, b = direction.split("_")
        return _visible("tri_" + a, dy, dx) | _visible("tri_" + b, dy, dx)
    if direction.startswith("tri_"):
        side = direction[4:]
        return {"up": -dy >= dx.abs(), "down": dy >= dx.abs(), "left": -dx >= dy.abs(), "right": dx >= dy.abs()}[side]
    return {"up": dy <= 0, "down": dy >= 0, "left": dx <= 0, "right": dx >= 0}[direction]


@register("lookhere")
class LookHere(BiasBase):
    """LookHere (module docstring).

    Args: ``num_heads``, ``num_prefix_tokens``, ``variant`` ("lh90" | "lh180" | "lh45"), ``directions``
    (a direction string, instead of the variant's), ``global_slope`` (2), ``layer_slopes`` ((1.5, 0.5)),
    ``layer`` and ``depth`` (this layer's index and the model's depth), ``distance`` ("linear" |
    "sqrt" | "square"), ``fill_with`` ("inf": ``MASKED`` | "zero" | "max"), and ``dim`` /
    ``head_dim`` / ``grid`` (checked only).
    """

    mask_aware = True

    def __init__(self, num_heads: int, num_prefix_tokens: int = 0, *, variant: str = "lh90",
                 directions: str | None = None, global_slope: float = 2.0, layer_slopes=(1.5, 0.5),
                 layer: int | None = None, depth: int | None = None, distance: str = "linear",
                 fill_with: str = "inf", dim: int | None = None, head_dim: int | None = None, grid=None) -> None:
        super().__init__(num_heads, num_prefix_tokens, dim=dim, head_dim=head_dim, grid=grid)
        self.variant = _checks.choice("variant", variant, tuple(VARIANTS))
        if directions is not None and not isinstance(directions, str):
            raise ValueError(f"directions={directions!r}: expected a string such as 'corners-triangles-none'")
        self.directions = VARIANTS[variant] if directions is None else directions
        self.views, self.head_slopes = head_plan(self.directions, num_heads)
        self.global_slope = _checks.positive_float("global_slope", global_slope)
        if (not isinstance(layer_slopes, (tuple, list)) or len(layer_slopes) != 2
                or not all(isinstance(v, (int, float)) and v >= 0 for v in layer_slopes)):
            raise ValueError(f"layer_slopes={layer_slopes!r}: expected (first, last), two numbers >= 0")
        self.layer_slopes = tuple(float(v) for v in layer_slopes)
        if (layer is None) != (depth is None):
            raise ValueError(f"layer={layer!r}, depth={depth!r}: expected both (this layer's index and the depth) or neither")
        if depth is not None:
            _checks.positive_int("depth", depth)
            if not isinstance(layer, int) or not 0 <= layer < depth:
                raise ValueError(f"layer={layer!r}: expected an index in [0, {depth})")
        self.layer, self.depth = layer, depth
        self.distance = _checks.choice("distance", distance, DISTANCES)
        self.fill_with = _checks.choice("fill_with", fill_with, FILLS)

    @property
    def layer_slope(self) -> float:
        """``linspace(first, last, depth)[layer]``; the mean of the two without a layer."""
        a, b = self.layer_slopes
        if self.depth is None:
            return (a + b) / 2
        return a + (b - a) * self.layer / (self.depth - 1) if self.depth > 1 else a

    def _uses_center(self) -> bool:
        return any("center" in v for v in self.views)

    def grid_bias(self, shape, device, q=None, mask=None) -> torch.Tensor:
        if mask is None or not self._uses_center():  # the bias then does not depend on the mask
            h, w = shape
            return self.cached(("lookhere", h, w, device), lambda: self._bias(shape, None, device))
        return self._bias(shape, mask.to(device), device)

    def relative_table(self, shape, device) -> torch.Tensor | None:
        """The bias over every offset of the grid (query minus key, ``vispe.image._bias``): a
        function of the offset alone unless a head measures to the centre.  # ((2h-1)(2w-1), heads)"""
        if self._uses_center():
            return None
        h, w = shape
        a = torch.arange(-(h - 1), h, device=device, dtype=torch.float32)  # query minus key, y
        b = torch.arange(-(w - 1), w, device=device, dtype=torch.float32)  # query minus key, x
        dy, dx = torch.meshgrid(-a, -b, indexing="ij")  # ((2h-1), (2w-1)) key minus query
        return torch.stack(self._heads(dy.reshape(-1), dx.reshape(-1), None), -1)  # ((2h-1)(2w-1), heads)

    def _bias(self, shape, mask, device) -> torch.Tensor:
        """Float32 bias of the grid tokens.  # (1|B, heads, N, N)"""
        c = valid_coords(shape, mask, "index", device=device)  # (B|1, N, 2) counted over the valid area
        d = c[:, None, :, :] - c[:, :, None, :]  # (B|1, N, N, 2) key minus query, [.., i, j]
        dy, dx = d[..., 0], d[..., 1]
        to_centre = None
        if self._uses_center():
            n = c.amax(1, keepdim=True) + 1  # (B|1, 1, 2) valid extent
            centre = (n - 1) / 2
            to_centre = torch.sqrt(((c - centre) ** 2).sum(-1))[:, None, :].expand_as(dy)  # (B|1, N, N) per key
        return torch.stack(self._heads(dy, dx, to_centre), 1)  # (B|1, heads, N, N)

    def _heads(self, dy: torch.Tensor, dx: torch.Tensor, to_centre: torch.Tensor | None) -> list[torch.Tensor]:
        """Each head's bias at key-minus-query offsets (dy, dx), any shape; ``to_centre`` the key's
        distance to the valid area's centre (heads that measure to it).  # [dy.shape] * heads"""
        dist = torch.sqrt(dy * dy + dx * dx)
        dist = {"linear": dist, "sqrt": dist.sqrt(), "square": dist * dist}[self.distance]
        heads = []
        for view, slope in zip(self.views, self.head_slopes):
            m = to_centre if "center" in view and to_centre is not None else dist
            m = torch.zeros_like(m) if "zero" in view else m
            shown = torch.ones_like(dist, dtype=torch.bool)
            for direction in view:
                if direction not in ("center", "zero"):
                    shown = shown & _visible(direction, dy, dx)
            bias = -(self.global_slope * self.layer_slope * slope) * m
            if self.fill_with == "inf":
                bias = torch.where(shown, bias, torch.full_like(bias, MASKED))
            elif self.fill_with == "max":
                top = m.amax(dim=(-2, -1), keepdim=True) if m.dim() > 1 else m.amax()  # the head's largest distance
                bias = torch.where(shown, bias, -(self.global_slope * self.layer_slope * slope) * top)
            else:  # zero
                bias = torch.where(shown, bias, torch.zeros_like(bias))
            heads.append(bias)
        return heads

    def extra_repr(self) -> str:
        return (f"{super().extra_repr()}, variant={self.variant!r}, directions={self.directions!r}, "
                f"global_slope={self.global_slope:g}, layer_slope={self.layer_slope:g}, distance={self.distance!r}, "
                f"fill_with={self.fill_with!r}")
