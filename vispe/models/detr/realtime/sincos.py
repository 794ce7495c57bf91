"""AIFI's 2D sin-cos in the two layouts RT-DETR's users meet (Zhao et al., CVPR 2024).

Both give every token of an (h, w) grid ``dim`` channels from integer coordinates, ``dim / 4`` per
block, ``omega_k = temperature^(-k / (dim / 4))``, k = 0..dim/4 - 1:

* ``layout="transformers"``: transformers' ``build_2d_sinusoidal_position_embedding`` (fixed for
  non-square grids in transformers#41380): token (y, x), row-major like the features, gets
  ``[sin(y w), cos(y w), sin(x w), cos(x w)]``. This is vispe's registered ``sincos2d`` (integer
  ``coords="index"``, y first, concat layout); with ``mask_aware=True`` the coordinates count over
  each image's valid area, so an image alone and padded at the bottom/right get the same code.
* ``layout="original"``: lyuwenyu/RT-DETR's ``build_2d_sincos_position_embedding`` (also D-FINE,
  DEIM and OmDet-Turbo's in transformers): ``meshgrid(arange(w), arange(h), indexing="ij")`` is
  flattened width-first, so table row ``t`` holds ``x = t // h``, ``y = t % h`` as
  ``[sin(x w), cos(x w), sin(y w), cos(y w)]``, while the features are flattened row-major. On a
  square grid row ``t`` is the code of the token (y, x) = (t // w, t % w) with the axes' channels
  exchanged, the same table as transformers' (the names swap, the numbers do not); on a non-square
  grid tokens get codes of other cells (up to 2.0 apart at 15x20). Not mask-aware: a table of the
  whole grid, whatever the mask.

Both are computed at the grid they are given, never for one ``eval_spatial_size``.

Precision: by default the angles and their sin / cos are computed in float32 (the original code's
arithmetic; vispe's ``sincos2d``). ``float64=True`` (``layout="transformers"`` only) computes them in
float64 and casts, as transformers 5.23's ``build_2d_sinusoidal_position_embedding`` does, with its
formula ``omega_k = 1 / temperature^(k / (dim / 4))``: the loaders of transformers' models set it. The two
tables differ by about one float32 ulp (6e-8 at a 3x4 grid), which a training forward's batch-statistics
BatchNorm can amplify (DEIMv2's HGNetV2 test: 4.2e-4 in the logits from this table alone).
"""
from __future__ import annotations

import torch
from torch.types import Device

from vispe import _checks
from vispe.coords import float32_math
from vispe.encoding import AdditiveEncoding
from vispe.image._additive import axis_positions
from vispe.image.axis_compose import compose_axes
from vispe.registry import build

LAYOUTS = ("transformers", "original")


def original_table(h: int, w: int, dim: int, temperature: float = 10000.0, *,
                   device: Device = None) -> torch.Tensor:
    """lyuwenyu's table for an (h, w) grid, rows in its width-first order (module docstring).  # (h*w, dim)"""
    _checks.divisible("dim", dim, 4, "four blocks of sin/cos")
    device = torch.device("cpu") if device is None else torch.device(device)
    with float32_math(device):
        k = dim // 4
        omega = 1.0 / temperature ** (torch.arange(k, dtype=torch.float32, device=device) / k)  # (dim/4,)
        gx, gy = torch.meshgrid(torch.arange(w, dtype=torch.float32, device=device),
                                torch.arange(h, dtype=torch.float32, device=device), indexing="ij")  # (w, h) each
        ax = gx.flatten()[:, None] * omega  # (h*w, dim/4): width-first rows
        ay = gy.flatten()[:, None] * omega
        return torch.cat([ax.sin(), ax.cos(), ay.sin(), ay.cos()], 1)  # (h*w, dim)


class OriginalSinCos(AdditiveEncoding):
    """``layout="original"`` as an additive encoding (module docstring): ``(1|B, h*w, dim)``."""

    mask_aware = False

    def __init__(self, dim: int, *, temperature: float = 10000.0) -> None:
        super().__init__()
        self.dim = _checks.divisible("dim", dim, 4, "four blocks of sin/cos")
        self.temperature = _checks.positive_float("temperature", temperature)

    def forward(self, shape: tuple[int, int], mask: torch.Tensor | None = None, *,
                device: torch.device | str | None = None,
                dtype: torch.dtype | None = None) -> torch.Tensor:  # (1|B, h*w, dim)
        h, w = _checks.grid_shape("shape", shape)
        mask = _checks.mask_for("mask", mask, (h, w))
        device = self.resolve_device(device, mask)
        dtype = dtype or torch.float32
        table = self.cached((h, w, device, dtype),
                            lambda: original_table(h, w, self.dim, self.temperature, device=device)[None].to(dtype))
        return table if mask is None else table.expand(mask.shape[0], -1, -1)

    def extra_repr(self) -> str:
        return f"dim={self.dim}, temperature={self.temperature:g}"


def transformers_table64(py: torch.Tensor, px: torch.Tensor, dim: int, temperature: float) -> torch.Tensor:
    """transformers' [sin(y w), cos(y w), sin(x w), cos(x w)] in float64 for positions ``py`` (B|1, h, 1|w)
    and ``px`` (B|1, 1|h, w).  # (B|1, h*w, dim) float64"""
    k = dim // 4
    omega = 1.0 / temperature ** (torch.arange(k, dtype=torch.float64, device=py.device) / k)  # (dim/4,)
    ay, ax = py.double()[..., None] * omega, px.double()[..., None] * omega  # (B|1, h, 1|w, dim/4), (B|1, 1|h, w, dim/4)
    ey, ex = torch.cat([ay.sin(), ay.cos()], -1), torch.cat([ax.sin(), ax.cos()], -1)
    return compose_axes(ey, ex, "concat", "yx")  # (B|1, h*w, dim)


class Float64SinCos(AdditiveEncoding):
    """``layout="transformers", float64=True`` (module docstring): ``(1|B, h*w, dim)`` in ``dtype``."""

    def __init__(self, dim: int, *, temperature: float = 10000.0, mask_aware: bool = False) -> None:
        super().__init__()
        self.dim = _checks.divisible("dim", dim, 4, "four blocks of sin/cos")
        self.temperature = _checks.positive_float("temperature", temperature)
        if not isinstance(mask_aware, bool):
            raise ValueError(f"mask_aware={mask_aware!r}: expected True or False")
        self.mask_aware = mask_aware  # type: ignore[misc]  # per instance, as sincos2d's

    def forward(self, shape: tuple[int, int], mask: torch.Tensor | None = None, *,
                device: torch.device | str | None = None,
                dtype: torch.dtype | None = None) -> torch.Tensor:  # (1|B, h*w, dim)
        h, w = _checks.grid_shape("shape", shape)
        mask = _checks.mask_for("mask", mask, (h, w))
        device = self.resolve_device(device, mask)
        dtype = dtype or torch.float32

        def table(m: torch.Tensor | None) -> torch.Tensor:  # (1|B, h*w, dim)
            py, px = axis_positions((h, w), m, "index", mask_aware=self.mask_aware, device=device)
            return transformers_table64(py, px, self.dim, self.temperature).to(dtype)
        if mask is not None and self.mask_aware:
            return table(mask)
        code = self.cached((h, w, device, dtype), lambda: table(None))
        return code if mask is None else code.expand(mask.shape[0], -1, -1)

    def extra_repr(self) -> str:
        return f"dim={self.dim}, temperature={self.temperature:g}, mask_aware={self.mask_aware}, float64=True"


def aifi_sincos(dim: int, *, temperature: float = 10000.0, layout: str = "transformers",
                mask_aware: bool = False, float64: bool = False) -> AdditiveEncoding:
    """AIFI's sin-cos in ``layout`` (module docstring); ``mask_aware`` and ``float64`` only for "transformers"."""
    _checks.choice("layout", layout, LAYOUTS)
    if not isinstance(float64, bool):
        raise ValueError(f"float64={float64!r}: expected True or False")
    if layout == "original":
        if mask_aware:
            raise ValueError("mask_aware=True with layout='original': the original table covers the whole grid "
                             "in its width-first order; use layout='transformers' for a mask-aware code")
        if float64:
            raise ValueError("float64=True with layout='original': the original code computes its table in "
                             "float32; float64 is transformers' arithmetic (layout='transformers')")
        return OriginalSinCos(dim, temperature=temperature)
    if float64:
        return Float64SinCos(dim, temperature=temperature, mask_aware=mask_aware)
    pe = build("sincos2d", dim=dim, temperature=temperature, mask_aware=mask_aware)
    assert isinstance(pe, AdditiveEncoding)
    return pe
