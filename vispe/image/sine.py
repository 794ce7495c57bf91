"""DETR's 2D sine encoding, generalised (Carion et al., 2020, "End-to-End Object Detection with
Transformers", ``PositionEmbeddingSine``; Deformable DETR's offset, Zhu et al., 2021).

Each token gets its row count ``y`` and column count ``x`` over its image's valid area (1..n, as
DETR's ``not_mask.cumsum``), normalised when ``normalize`` is set::

    y' = (y + offset) / (n_y + eps) * scale        x' = (x + offset) / (n_x + eps) * scale

and each axis is encoded with ``dim/2`` channels of Vaswani's sinusoids,
``omega_k = temperature^(-2k / (dim/2))``, k = 0..dim/4 - 1::

    PE(y, x) = [ S(y') , S(x') ]        (y channels FIRST, as DETR)       # (dim,)
    S(p) = [sin(p w_0), cos(p w_0), sin(p w_1), cos(p w_1), ...]   layout="interleaved" (DETR)
    S(p) = [sin(p w_0), ..., sin(p w_{K-1}), cos(p w_0), ..., cos(p w_{K-1})]   layout="concat"

Without normalisation the position is ``count + offset`` (DETR counts 1..n; offset 0).
Mask-aware: with a padding mask (B, h, w) the counts run over each image's valid area, so an image
alone and the same image padded at the bottom/right in a batch get the same code on their valid
area (with ``normalize``; without it the counts are batch-invariant too). Padding cells get a
finite code (DETR's: the last valid count), never NaN. Without a mask: as an all-valid mask,
cached per (h, w, device, dtype). Prefix tokens: learned vectors if ``num_prefix_tokens``, else none.

Output: ``(B|1, h*w, dim)``, computed in float32 (autocast off) and cast to ``dtype``.

Continuous coordinates (``at``, the contract's ``vispe.encoding``): unit coordinate u (in [0, 1]
over the valid area) has the code ``S(u * scale)``, y channels first, which is Conditional DETR's
and DAB-DETR's sine of their reference points (``gen_sineembed_for_position``: u = sigmoid of the
anchor, scale 2*pi, interleaved). The grid path puts cell i of n at ``(i + 1 + offset) / n`` (DETR
counts the cell's far edge): with ``offset=-0.5`` and ``eps=0`` grid codes equal ``at`` at cell
centres; with DETR's offset 0 a reference point at a cell's centre codes half a cell before the
cell's own key, as in those papers. Needs ``normalize=True`` (unnormalised counts have no unit scale).

Centring (``center=True``; why and the rule in ``vispe.image._additive``): the code minus its mean
over each image's valid tokens, padding tokens 0. At 8x8 tokens and temperature 10000 most of the
low-frequency channels barely vary over the grid, so the uncentred code is mostly a constant added
to every token (RMS 0.65 against 0.28 for the varying part at 64 channels); centred, the same
models fit digits_content_position as a learned table does. ``at`` with ``center=True`` subtracts
the same mean, that of the grid code over ``extent`` (needed, whole cells), so grid codes and
``at`` at the grid's positions stay equal and a query and its key cell share one offset.
"""
from __future__ import annotations

import math

import torch

from vispe import _checks
from vispe.axis.sinusoidal import LAYOUTS, sinusoidal
from vispe.coords import mask_coords, unit_coords
from vispe.image._additive import AdditiveBase, centred, check_center, float32_math
from vispe.registry import register


@register("sine")
class SineEncoding(AdditiveBase):
    """DETR's ``PositionEmbeddingSine`` with its conventions as named options.

    Args:
        dim: channels, a multiple of 4 (dim/2 for y first, then dim/2 for x).
        temperature: frequency base (DETR 10000; DAB-/DINO-DETR use 20).
        normalize: divide by the valid length (DETR's configs: True; default True).
        scale: the normalised range, default 2*pi; giving it with ``normalize=False`` is an error
            (as DETR).
        eps: added to the valid length before dividing (DETR 1e-6).
        offset: added to the count: 0 (DETR), -0.5 (Deformable DETR, cell centres).
        layout: "interleaved" (DETR's stacked sin/cos, default) or "concat" (sin block, cos block).
        num_prefix_tokens: learned prefix vectors returned by ``prefix()`` (0: none).
        center: subtract the code's mean over each image's valid area, padding tokens 0 (default
            False; module docstring).
    """

    mask_aware = True
    supports_coords = True

    def __init__(self, dim: int, *, temperature: float = 10000.0, normalize: bool = True,
                 scale: float | None = None, eps: float = 1e-6, offset: float = 0.0,
                 layout: str = "interleaved", num_prefix_tokens: int = 0, center: bool = False) -> None:
        _checks.divisible("dim", dim, 4, "dim/2 channels per axis, in sin/cos pairs")
        super().__init__(dim, num_prefix_tokens)
        if not isinstance(normalize, bool):
            raise ValueError(f"normalize={normalize!r}: expected True or False")
        if scale is not None and not normalize:
            raise ValueError(f"scale={scale!r} with normalize=False: scale only applies when normalize=True")
        self.temperature = _checks.positive_float("temperature", temperature)
        self.normalize = normalize
        self.scale = 2 * math.pi if scale is None else _checks.positive_float("scale", scale)
        if isinstance(eps, bool) or not isinstance(eps, (int, float)) or eps < 0:
            raise ValueError(f"eps={eps!r}: expected a non-negative number")
        self.eps = float(eps)
        if isinstance(offset, bool) or not isinstance(offset, (int, float)):
            raise ValueError(f"offset={offset!r}: expected a number (0 for DETR, -0.5 for Deformable DETR)")
        self.offset = float(offset)
        self.layout = _checks.choice("layout", layout, LAYOUTS)
        self.center = check_center(center)

    def forward(self, shape, mask=None, *, device=None, dtype=None) -> torch.Tensor:  # (B|1, h*w, dim)
        (h, w), mask, device, dtype = self._inputs(shape, mask, device, dtype)
        if mask is not None:
            return self._output(self._table(mask.to(device)), mask, dtype)
        key = (h, w, device, dtype)
        all_valid = torch.zeros(1, h, w, dtype=torch.bool, device=device)  # (1, h, w)
        return self.cached(key, lambda: self._table(all_valid).to(dtype))

    def _table(self, mask: torch.Tensor, center: bool | None = None) -> torch.Tensor:
        """The float32 code of every token of each image of ``mask`` (B, h, w), centred when
        ``center`` (default: the encoding's setting).  # (B, h*w, dim)"""
        with float32_math(mask.device):
            pos = mask_coords(mask, normalize=self.normalize, scale=self.scale, eps=self.eps,
                              offset=self.offset)  # (B, h, w, 2) as (y, x)
            if not self.normalize:
                pos = pos + self.offset  # mask_coords applies the offset only when normalising
            code = sinusoidal(pos, self.dim // 2, self.temperature, self.layout)  # (B, h, w, 2, dim/2)
            code = code.flatten(-2).flatten(1, 2)  # (B, h*w, dim): y channels, then x channels
            return centred(code, mask) if (self.center if center is None else center) else code

    def at(self, coords, extent=None, *, dtype=None) -> torch.Tensor:  # (B|1, N, dim)
        """The code at unit (y, x) ``coords`` (B|1, N, 2): ``[S(y * scale), S(x * scale)]`` (module docstring)."""
        if not self.normalize:
            raise ValueError("normalize=False: the sine counts cells, so it has no unit-coordinate code; "
                             "build it with normalize=True to evaluate it at continuous coordinates")
        coords, n = unit_coords(coords, extent)
        if self.center and n is None:
            raise ValueError("extent=None with center=True: the centred code subtracts the grid code's mean over "
                             "the valid (h, w) cells; expected extent (B|1, 2)")
        with float32_math(coords.device):
            code = sinusoidal(coords * self.scale, self.dim // 2, self.temperature, self.layout)  # (B|1, N, 2, dim/2)
            code = code.flatten(-2)  # (B|1, N, dim)
            if self.center:
                code = code - self._grid_mean(n)  # (B|1, N, dim)
            return code.to(dtype or torch.float32)

    def _grid_mean(self, n: torch.Tensor) -> torch.Tensor:
        """Mean of the uncentred grid code over (h, w) = ``n`` (B|1, 1, 2) valid cells.  # (B|1, 1, dim)"""
        rows = []
        for h, w in n[:, 0].tolist():
            if h != int(h) or w != int(w) or h < 1 or w < 1:
                raise ValueError(f"extent ({h:g}, {w:g}) with center=True: expected whole numbers of cells >= 1 "
                                 "(the grid whose mean is subtracted)")
            h, w = int(h), int(w)
            key = ("mean", h, w, n.device)
            valid = torch.zeros(1, h, w, dtype=torch.bool, device=n.device)  # (1, h, w)
            rows.append(self.cached(key, lambda: self._table(valid, center=False).mean(1, keepdim=True)))  # (1, 1, dim)
        return torch.cat(rows)  # (B|1, 1, dim)

    def extra_repr(self) -> str:
        return (f"dim={self.dim}, temperature={self.temperature}, normalize={self.normalize}, "
                f"scale={self.scale:.4g}, offset={self.offset}, layout={self.layout!r}, "
                f"num_prefix_tokens={self.num_prefix_tokens}, center={self.center}")
