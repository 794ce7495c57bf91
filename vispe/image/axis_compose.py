"""2D encodings composed from per-axis 1D codes of ``vispe.axis``.

With ``E_y`` the 1D code of the row position and ``E_x`` that of the column position::

    compose="concat"   PE(y, x) = [E_y(y), E_x(x)]     each dim/2 wide, y channels FIRST
    compose="sum"      PE(y, x) = E_y(y) + E_x(x)      each dim wide
    compose="product"  PE(y, x) = E_y(y) * E_x(x)      each dim wide, elementwise

"sum" and "product" of the SAME fixed 1D code on both axes are symmetric: PE(y, x) = PE(x, y),
so a transposed position gets the same code (concat, or learned tables, do not have this problem).

Registered encodings:

* ``"axis2d"``: the generic composition, ``axis="sinusoidal"`` (Vaswani's sinusoids,
  ``vispe.axis.sinusoidal``) or ``axis="learned"`` (one ``vispe.axis.learned.LearnedTable1d`` per
  axis, built for ``grid`` and resampled by target size on another grid; a state_dict saved at
  another grid is resampled on load, ``vispe.encoding``).
* ``"sincos2d"``: MAE / big_vision's 2D sin-cos, ``axis2d(axis="sinusoidal", compose="concat")``
  with layout "concat" (sin block, cos block per axis) and integer positions. MAE and big_vision put
  the x code first; vispe puts y first (``axis_order="xy"`` gives their order). Frequencies are MAE's
  / timm's ``temperature^(-i / (dim/4))``, i = 0..dim/4 - 1; big_vision divides by dim/4 - 1
  (``endpoint=True``). So MAE's ``get_2d_sincos_pos_embed`` is ``axis_order="xy"`` and big_vision's
  ``posemb_sincos_2d`` is ``axis_order="xy", endpoint=True``; timm's ``build_sincos2d_pos_embed``
  holds the default's numbers regrouped as [sin y, sin x, cos y, cos x].
* ``"normidx2d"``: the normalised index per axis, c = [y / (h-1), x / (w-1)] in [0, 1]^2
  (0 on a length-1 axis; ``vispe.axis.sinusoidal.normalized_index`` per axis), projected to ``dim`` by a learned
  ``Linear(2, dim)``; with ``project=False`` the 2-channel code itself (then ``dim`` must be 2).

Centring: ``center=True`` (fixed codes only: a sinusoidal axis, and ``normidx2d``) subtracts the
code's mean over the valid area (``vispe.image._additive``: why, at 8x8 tokens a sin-cos code is
mostly a constant, and the rule: per image over its valid tokens, padding tokens 0, when mask-aware
and given a mask; else over the whole grid). ``normidx2d`` centres its fixed part, the index, before
the learned projection: the projection's bias stays, a learned mean (padding tokens get the bias).

Mask: fixed per-axis codes accept ``mask_aware=True`` (positions counted over each image's valid
area, batch-invariant); learned tables are indexed by grid cell and refuse it.
Output ``(B|1, h*w, dim)``, computed in float32 (autocast off), cast to ``dtype``.
"""
from __future__ import annotations

import torch
from torch import nn

from vispe import _checks
from vispe.axis.learned import LearnedTable1d
from vispe.axis.sinusoidal import LAYOUTS, sinusoid_frequencies, sinusoidal
from vispe.image._additive import (
    COORD_MODES,
    AdditiveBase,
    axis_positions,
    centred,
    check_center,
    fit_axis_tables,
    float32_math,
)
from vispe.registry import register

AXES = ("sinusoidal", "learned")
COMPOSES = ("concat", "sum", "product")
_SINUSOIDAL_ONLY = ("temperature", "layout", "coords", "mask_aware", "endpoint", "center")
_LEARNED_ONLY = ("overflow", "resize_mode", "init_std")  # ``grid`` is the model's grid: any axis takes it


def compose_axes(ey: torch.Tensor, ex: torch.Tensor, compose: str = "concat",
                 axis_order: str = "yx") -> torch.Tensor:
    """Combine per-axis codes ``ey`` (B|1, h, 1|w, Cy) and ``ex`` (B|1, 1|h, w, Cx).  # (B|1, h*w, C)"""
    _checks.choice("compose", compose, COMPOSES)
    if compose == "concat":
        lead = torch.broadcast_shapes(ey.shape[:-1], ex.shape[:-1])  # (B|1, h, w)
        parts = [ey.expand(*lead, -1), ex.expand(*lead, -1)]
        if _checks.choice("axis_order", axis_order, ("yx", "xy")) == "xy":
            parts.reverse()
        out = torch.cat(parts, dim=-1)  # (B|1, h, w, Cy + Cx)
    elif compose == "sum":
        out = ey + ex  # (B|1, h, w, C)
    else:
        out = ey * ex  # (B|1, h, w, C)
    return out.flatten(1, 2)  # (B|1, h*w, C)


@register("axis2d")
class Axis2dEncoding(AdditiveBase):
    """Per-axis 1D codes composed into a 2D code (see the module docstring).

    Args:
        dim: channels (concat: even halves; sinusoidal needs sin/cos pairs per axis).
        axis: "sinusoidal" or "learned".
        compose: "concat" (default), "sum" or "product".
        axis_order: "yx" (default) or "xy", the order of the halves (concat only).
        temperature: sinusoidal axis only: the frequency base (default 10000).
        layout: sinusoidal axis only: sin/cos layout (default "concat").
        coords: sinusoidal axis only, as ``vispe.coords``: "index" (default), "normalized", "centered".
        mask_aware: sinusoidal axis only: count positions over each image's valid area (default False).
        endpoint: sinusoidal axis only, as ``vispe.axis.sinusoidal.sinusoid_frequencies`` (big_vision;
            default False).
        center: sinusoidal axis only: subtract the code's mean over the valid area (module docstring;
            default False).
        grid: the model's grid (h, w); the lengths of a learned axis's tables (required there), not
            needed by a fixed axis (checked, then unused: models pass their grid to every encoding).
        overflow: learned axis only: "interpolate" (default) or "error" past the tables.
        resize_mode: learned axis only: "linear" (default), "bicubic" or "nearest".
        init_std: learned axis only: the standard deviation of the normal init (0.02).
        num_prefix_tokens: learned prefix vectors returned by ``prefix()`` (0: none).
    An option of the other axis kind raises a ValueError, never silently ignored.
    """

    mask_aware_option = "mask_aware=True"

    def __init__(self, dim: int, *, axis: str = "sinusoidal", compose: str = "concat", axis_order: str = "yx",
                 temperature: float | None = None, layout: str | None = None, coords: str | None = None,
                 mask_aware: bool | None = None, endpoint: bool | None = None, grid=None,
                 overflow: str | None = None, resize_mode: str | None = None, init_std: float | None = None,
                 num_prefix_tokens: int = 0, center: bool | None = None) -> None:
        _checks.choice("axis", axis, AXES)
        _checks.choice("compose", compose, COMPOSES)
        opts = dict(temperature=temperature, layout=layout, coords=coords, mask_aware=mask_aware, grid=grid,
                    overflow=overflow, resize_mode=resize_mode, init_std=init_std, endpoint=endpoint, center=center)
        foreign = _LEARNED_ONLY if axis == "sinusoidal" else _SINUSOIDAL_ONLY
        for name in foreign:
            if opts[name] is not None:
                other = "learned" if axis == "sinusoidal" else "sinusoidal"
                raise ValueError(f"{name}={opts[name]!r}: only applies to axis={other!r}, not axis={axis!r}")
        _checks.choice("axis_order", axis_order, ("yx", "xy"))
        if axis_order != "yx" and compose != "concat":
            raise ValueError(f"axis_order={axis_order!r} with compose={compose!r}: the order only applies to 'concat'")
        pairs = 2 if axis == "sinusoidal" else 1  # channels per unit of each axis code
        _checks.divisible("dim", dim, pairs * (2 if compose == "concat" else 1),
                          f"compose={compose!r}, axis={axis!r}")
        super().__init__(dim, num_prefix_tokens)
        self.axis, self.compose, self.axis_order = axis, compose, axis_order
        self.width = dim // 2 if compose == "concat" else dim  # channels of each axis code
        self.center = check_center(False if center is None else center)
        if axis == "sinusoidal":
            self.temperature = _checks.positive_float("temperature", 10000.0 if temperature is None else temperature)
            self.layout = _checks.choice("layout", "concat" if layout is None else layout, LAYOUTS)
            self.coords = _checks.choice("coords", "index" if coords is None else coords, COORD_MODES)
            mask_aware = False if mask_aware is None else mask_aware
            if not isinstance(mask_aware, bool):
                raise ValueError(f"mask_aware={mask_aware!r}: expected True or False")
            self.mask_aware = mask_aware
            self.endpoint = False if endpoint is None else endpoint
            sinusoid_frequencies(self.width, self.temperature, endpoint=self.endpoint)  # checks endpoint now
            if grid is not None:
                _checks.grid_shape("grid", grid)
            self.row = self.col = None
        else:
            if grid is None:
                raise ValueError("grid=None: axis='learned' needs grid=(h, w), the lengths of its tables")
            h, w = _checks.grid_shape("grid", grid)
            std = _checks.positive_float("init_std", 0.02 if init_std is None else init_std)
            kw = dict(init_std=std, overflow=overflow or "interpolate", resize_mode=resize_mode or "linear")
            self.row = LearnedTable1d(h, self.width, **kw)  # (h, width), y
            self.col = LearnedTable1d(w, self.width, **kw)  # (w, width), x

    def forward(self, shape, mask=None, *, device=None, dtype=None) -> torch.Tensor:  # (B|1, h*w, dim)
        default = self.row.weight.dtype if self.row is not None else torch.float32
        (h, w), mask, device, dtype = self._inputs(shape, mask, device, dtype, default)
        if self.row is not None or (mask is not None and self.mask_aware):
            return self._output(self._table((h, w), mask, device), mask, dtype)
        key = (h, w, device, dtype, torch.is_inference_mode_enabled())
        return self._output(self.cached(key, lambda: self._table((h, w), None, device).to(dtype)), mask, dtype)

    def _table(self, shape, mask, device) -> torch.Tensor:  # (B|1, h*w, dim) float32
        h, w = shape
        with float32_math(device):
            if self.row is not None:
                ey = self.row.table(h).to(device).float().view(1, h, 1, -1)  # (1, h, 1, width)
                ex = self.col.table(w).to(device).float().view(1, 1, w, -1)  # (1, 1, w, width)
            else:
                py, px = axis_positions(shape, mask, self.coords, mask_aware=self.mask_aware, device=device)
                kw = dict(endpoint=self.endpoint)
                ey = sinusoidal(py, self.width, self.temperature, self.layout, **kw)  # (B|1, h, 1|w, width)
                ex = sinusoidal(px, self.width, self.temperature, self.layout, **kw)  # (B|1, 1|h, w, width)
            code = compose_axes(ey, ex, self.compose, self.axis_order)  # (B|1, h*w, dim)
            if self.center:  # over each image's valid tokens only when the positions are too
                code = centred(code, mask if self.mask_aware else None)  # (B|1, h*w, dim)
            return code

    def resize_(self, shape) -> Axis2dEncoding:
        """Learned axis: resample the tables to ``shape`` = (h, w) entries (load time)."""
        h, w = _checks.grid_shape("shape", shape)
        if self.row is not None:
            for table, n in ((self.row, h), (self.col, w)):
                if n != table.length:  # the same size keeps the parameter itself (and optimizers)
                    table.resize_(n)
        self._cache.clear()
        return self

    def table_grid(self):  # learned axis: the lengths of its tables (None for a fixed axis)
        return None if self.row is None else (self.row.length, self.col.length)

    def infer_grid(self, state_dict, prefix):
        r, c = state_dict.get(prefix + "row.weight"), state_dict.get(prefix + "col.weight")
        return None if r is None or c is None else (r.shape[0], c.shape[0])

    def load_grid_(self, state_dict, prefix, saved) -> None:  # resampled, as forward does at run time
        fit_axis_tables(state_dict, prefix, saved, {"row.weight": self.row, "col.weight": self.col}, keep_first=False)

    def extra_repr(self) -> str:
        return (f"dim={self.dim}, axis={self.axis!r}, compose={self.compose!r}, axis_order={self.axis_order!r}, "
                f"num_prefix_tokens={self.num_prefix_tokens}" + (", center=True" if self.center else ""))


@register("sincos2d")
class SinCos2dEncoding(Axis2dEncoding):
    """MAE / big_vision 2D sin-cos: [sincos(y), sincos(x)], dim/2 each (``dim`` a multiple of 4).

    MAE: ``axis_order="xy"``; big_vision: ``axis_order="xy", endpoint=True`` (module docstring).
    ``center=True``: minus its mean over the valid area (module docstring).
    """

    def __init__(self, dim: int, *, temperature: float = 10000.0, layout: str = "concat", coords: str = "index",
                 axis_order: str = "yx", mask_aware: bool = False, endpoint: bool = False,
                 num_prefix_tokens: int = 0, center: bool = False) -> None:
        super().__init__(dim, axis="sinusoidal", compose="concat", axis_order=axis_order, temperature=temperature,
                         layout=layout, coords=coords, mask_aware=mask_aware, endpoint=endpoint,
                         num_prefix_tokens=num_prefix_tokens, center=center)


@register("normidx2d")
class NormIdx2dEncoding(AdditiveBase):
    """Normalised (y, x) index, [y/(h-1), x/(w-1)], through a learned ``Linear(2, dim)`` or raw (dim 2).

    Args:
        dim: channels (2 when ``project=False``).
        project: learn ``Linear(2, dim)`` (default True); False returns the 2-channel code.
        mask_aware: normalise over each image's valid area when a mask is given.
        num_prefix_tokens: learned prefix vectors returned by ``prefix()`` (0: none).
        center: centre the index over the valid area before the projection (module docstring).
    """

    mask_aware_option = "mask_aware=True"

    def __init__(self, dim: int, *, project: bool = True, mask_aware: bool = False,
                 num_prefix_tokens: int = 0, center: bool = False) -> None:
        for name, value in (("project", project), ("mask_aware", mask_aware)):
            if not isinstance(value, bool):
                raise ValueError(f"{name}={value!r}: expected True or False")
        if not project and dim != 2:
            raise ValueError(f"dim={dim!r} with project=False: the unprojected code has 2 channels (y, x)")
        super().__init__(dim, num_prefix_tokens)
        self.mask_aware = mask_aware
        self.center = check_center(center)
        self.proj = nn.Linear(2, dim) if project else None

    def forward(self, shape, mask=None, *, device=None, dtype=None) -> torch.Tensor:  # (B|1, h*w, dim)
        default = self.proj.weight.dtype if self.proj is not None else torch.float32
        (h, w), mask, device, dtype = self._inputs(shape, mask, device, dtype, default)
        with float32_math(device):
            py, px = axis_positions((h, w), mask, "normalized", mask_aware=self.mask_aware, device=device)
            py, px = torch.broadcast_tensors(py, px)  # (B|1, h, w) each
            code = torch.stack([py, px], dim=-1).flatten(1, 2)  # (B|1, h*w, 2) as (y, x)
            if self.center:
                code = centred(code, mask if self.mask_aware else None)  # (B|1, h*w, 2)
            if self.proj is not None:
                code = self.proj(code.to(self.proj.weight.dtype)).float()  # (B|1, h*w, dim)
        return self._output(code, mask, dtype)

    def extra_repr(self) -> str:
        return (f"dim={self.dim}, project={self.proj is not None}, mask_aware={self.mask_aware}, "
                f"num_prefix_tokens={self.num_prefix_tokens}, center={self.center}")
