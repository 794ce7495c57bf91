"""Random Fourier features of the token coordinates (Tancik et al., 2020, "Fourier Features Let
Networks Learn High Frequency Functions in Low Dimensional Domains"), with the learnable variant of
Li et al., 2021, "Learnable Fourier Features for Multi-Dimensional Spatial Positional Encoding".

With v = (y, x) the token's coordinates and B a (dim/2, 2) matrix, ``B_ij ~ N(0, sigma^2)``::

    PE(v) = [ cos(2 pi B v) , sin(2 pi B v) ]                             # (dim,)

followed, when ``mlp_dim > 0``, by Li et al.'s MLP ``Linear(dim, mlp_dim) -> GELU ->
Linear(mlp_dim, dim)``. (Li et al. also scale the features by 1/sqrt(dim); vispe does not, so the
features stay in [-1, 1] as Tancik's.)

* Fixed B (default): drawn from ``torch.Generator().manual_seed(seed)`` on the CPU in float32 once at
  construction (deterministic; never in the state_dict, never cast by ``module.to(dtype)``); the
  table is cached per (h, w, device, dtype).
* ``learnable=True``: B is a parameter initialised the same way (Li et al.), recomputed every call.

Coordinates (``coords``, see ``vispe.coords``): "centered" (pixel centres in [-1, 1], default),
"normalized" (index / (n - 1)) or "index". With ``mask_aware=True`` and a padding mask they are
counted over each image's valid area (so an image alone and padded in a batch get the same code);
otherwise the mask only sets the batch size. Output ``(B|1, h*w, dim)`` in float32, cast to ``dtype``.

Continuous coordinates (``at``, ``vispe.encoding``): unit (y, x) are brought to ``coords``'
convention (``vispe.coords.unit_to_grid``; cell centres give the grid's values exactly), so the
features of an anchor and of the keys are the same function of position. Only with
``mask_aware=True``: without it the grid of a padded batch is counted over the padded canvas, which
unit coordinates of an image's valid area cannot name, so ``at`` refuses (``supports_coords`` False)
instead of disagreeing with the grid.
"""
from __future__ import annotations

import math

import torch
from torch import nn

from vispe import _checks
from vispe.coords import unit_coords, unit_to_grid
from vispe.image._additive import COORD_MODES, AdditiveBase, axis_positions, float32_math
from vispe.registry import register


def gaussian_frequencies(num: int, sigma: float, seed: int, *, device=None) -> torch.Tensor:
    """Tancik's B: ``num`` rows of N(0, sigma^2) frequencies over (y, x), from ``seed``.  # (num, 2)"""
    gen = torch.Generator().manual_seed(seed)
    return (torch.randn(num, 2, generator=gen, dtype=torch.float32) * sigma).to(device)


def fourier_features(pos: torch.Tensor, freqs: torch.Tensor) -> torch.Tensor:
    """``[cos(2 pi B v), sin(2 pi B v)]`` of positions ``pos`` (..., 2) with B = ``freqs`` (F, 2).  # (..., 2F)"""
    angles = 2 * math.pi * (pos.float() @ freqs.float().t())  # (..., F)
    return torch.cat([angles.cos(), angles.sin()], dim=-1)  # (..., 2F)


@register("fourier")
class FourierEncoding(AdditiveBase):
    """Gaussian Fourier features of (y, x), fixed (Tancik) or learnable (Li et al.).

    Args:
        dim: channels, even (dim/2 frequencies).
        sigma: std of the frequencies, in cycles per coordinate unit (default 1.0).
        seed: seed of the fixed B (and of the initial learnable B).
        learnable: B is a parameter (Li et al., 2021).
        mlp_dim: hidden width of Li et al.'s MLP after the features (0: no MLP).
        coords: "centered" (default), "normalized" or "index".
        mask_aware: count coordinates over each image's valid area when a mask is given.
        num_prefix_tokens: learned prefix vectors returned by ``prefix()`` (0: none).
    """

    mask_aware_option = "mask_aware=True"

    def __init__(self, dim: int, *, sigma: float = 1.0, seed: int = 0, learnable: bool = False,
                 mlp_dim: int = 0, coords: str = "centered", mask_aware: bool = False,
                 num_prefix_tokens: int = 0) -> None:
        _checks.divisible("dim", dim, 2, "cos/sin pairs")
        super().__init__(dim, num_prefix_tokens)
        self.sigma = _checks.positive_float("sigma", sigma)
        self.seed = _checks.positive_int("seed", seed, allow_zero=True)
        for name, value in (("learnable", learnable), ("mask_aware", mask_aware)):
            if not isinstance(value, bool):
                raise ValueError(f"{name}={value!r}: expected True or False")
        self.learnable = learnable
        self.mask_aware = mask_aware
        self.coords = _checks.choice("coords", coords, COORD_MODES)
        self.freqs = None
        fixed = gaussian_frequencies(dim // 2, self.sigma, seed)  # (dim/2, 2) float32, CPU
        if learnable:
            self.freqs = nn.Parameter(fixed)
        # fixed B: a plain attribute (not a buffer: never saved, never cast by .to(dtype)); drawn once
        # here, so torch.export records a constant, not the random generator
        self._fixed_freqs = None if learnable else fixed
        self.mlp = None
        if _checks.positive_int("mlp_dim", mlp_dim, allow_zero=True):
            self.mlp = nn.Sequential(nn.Linear(dim, mlp_dim), nn.GELU(), nn.Linear(mlp_dim, dim))

    @property
    def supports_coords(self) -> bool:  # with a padding mask, the grid is the valid area's only when mask-aware
        return self.mask_aware

    def coords_refusal(self) -> str:
        return ("mask_aware=False counts the grid over the padded canvas, so on a padded batch no point in unit "
                "coordinates of an image's valid area has its grid's code; build it with mask_aware=True")

    def _frequencies(self, device: torch.device) -> torch.Tensor:  # (dim/2, 2)
        if self.freqs is not None:
            return self.freqs.to(device)
        return self.cached(("B", device), lambda: self._fixed_freqs.to(device))

    def forward(self, shape, mask=None, *, device=None, dtype=None) -> torch.Tensor:  # (B|1, h*w, dim)
        (h, w), mask, device, dtype = self._inputs(shape, mask, device, dtype)
        if (mask is not None and self.mask_aware) or self.freqs is not None or self.mlp is not None:
            return self._output(self._table((h, w), mask, device), mask, dtype)  # learns or per-image
        key = (h, w, device, dtype, torch.is_inference_mode_enabled())
        return self._output(self.cached(key, lambda: self._table((h, w), None, device).to(dtype)), mask, dtype)

    def at(self, coords, extent=None, *, dtype=None) -> torch.Tensor:  # (B|1, N, dim)
        """The features at unit (y, x) ``coords`` (B|1, N, 2); ``extent`` (B|1, 2) valid cells (module docstring)."""
        if not self.mask_aware:
            return super().at(coords, extent, dtype=dtype)  # refuses, saying why
        coords, n = unit_coords(coords, extent)
        with float32_math(coords.device):
            return self._features(unit_to_grid(coords, n, self.coords)).to(dtype or torch.float32)

    def _features(self, pos: torch.Tensor) -> torch.Tensor:  # (..., 2) -> (..., dim) float32
        table = fourier_features(pos, self._frequencies(pos.device))
        if self.mlp is not None:
            table = self.mlp(table.to(self.mlp[0].weight.dtype)).float()
        return table

    def _table(self, shape, mask, device) -> torch.Tensor:  # (B|1, h*w, dim) float32
        h, w = shape
        with float32_math(device):
            py, px = axis_positions(shape, mask, self.coords, mask_aware=self.mask_aware, device=device)
            py, px = torch.broadcast_tensors(py, px)  # (B|1, h, w) each
            pos = torch.stack([py, px], dim=-1).flatten(1, 2)  # (B|1, h*w, 2) as (y, x)
            return self._features(pos)  # (B|1, h*w, dim)

    def extra_repr(self) -> str:
        return (f"dim={self.dim}, sigma={self.sigma}, seed={self.seed}, learnable={self.learnable}, "
                f"mlp={self.mlp is not None}, coords={self.coords!r}, mask_aware={self.mask_aware}, "
                f"num_prefix_tokens={self.num_prefix_tokens}")
