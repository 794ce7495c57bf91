"""RoPE-Mixed: 2D RoPE with learned mixed frequencies (Heo et al., ECCV 2024, "Rotary Position
Embedding for Vision Transformer").

Every head h and channel pair k has a learned 2D frequency (fy, fx):

    angle_{h,k}(y, x) = fy_{h,k} * y + fx_{h,k} * x

so a pair rotates along any direction of the image plane, not only along an axis, and
``<R(p) q, R(p') k>`` still depends only on p - p'.

Initialisation as in the paper (rope-vit's ``init_random_2d_freqs``): magnitudes
``m_j = theta^(-4 j / head_dim)``, j < head_dim/4, with ``theta = 10``; per head a random angle
phi ~ U[0, 2 pi) (``rotate=True``; 0 otherwise); pairs k < head_dim/4 point along phi, the next
head_dim/4 along phi + pi/2:

    (fy, fx)_{h,k}             = m_k * (sin phi_h, cos phi_h)
    (fy, fx)_{h,k+head_dim/4}  = m_k * (sin(phi_h + pi/2), cos(phi_h + pi/2))

With ``rotate=False`` this is axial RoPE with x on the first quarter of pairs (rope-vit's order).

Parameter: ``freqs`` (num_heads, head_dim/2, 2) as (fy, fx), one encoding per attention layer.
rope-vit's ``freqs`` (2, depth, heads * head_dim/2) and timm's ``RotaryEmbeddingMixed.freqs``
(2, depth, heads, head_dim/2) hold (fx, fy) for all layers at once (with timm's ``grid_indexing``
"xy"; "ij" swaps them): ``from_rope_vit_freqs`` converts them, and with ``layout="interleaved"``
(their channel pairing) the angles and attention outputs are theirs. Input: grid ``shape`` (h, w),
optional padding mask (B, h, w). Output: float32 angles ``(B|1, heads, h*w, head_dim/2)``,
recomputed at every call (the frequencies learn) at any grid. Prefix tokens: left unrotated.
Coordinates, mask handling and train-time shift/jitter: see ``vispe.image._rotary``.

Resolution scaling (``scaling``, ``ref_grid`` = training grid; ``vispe.image._rotary``):

* ``"pi"`` scales the positions, ``angle = fy * y / s_y + fx * x / s_x`` (Chen et al., 2023): it
  needs nothing of the frequencies, so it means for RoPE-Mixed what it means for axial RoPE.
* ``"yarn"`` (Peng et al., 2023) is applied to the two components of each learned frequency apart:
  ``fy -> h(fy; s_y, ref_h * scale)``, ``fx -> h(fx; s_x, ref_w * scale)`` with
  ``h(f) = (1 - g(r)) f / s + g(r) f``, ``r = ref * |f| / (2 pi)`` the turns of that component
  over the training extent of its axis (``vispe.axis.rope_scaling.yarn_frequencies``). The by-parts
  rule needs only each frequency, not a schedule; the per-component reading is vispe's extension
  (no paper defines YaRN for mixed frequencies). The angles stay linear in (y, x), so the
  relative property holds.
* ``"ntk"`` is refused: it changes the *base* of a geometric schedule, and learned frequencies have
  neither a base nor a schedule to bend.
"""
from __future__ import annotations

import math

import torch
from torch import nn

from vispe import _checks
from vispe.axis.rope import rope_frequencies
from vispe.axis.rope_scaling import yarn_frequencies
from vispe.image._rotary import RotaryBase
from vispe.registry import register


def mixed_init(head_dim: int, num_heads: int, theta: float = 10.0, rotate: bool = True,
               generator: torch.Generator | None = None) -> torch.Tensor:
    """RoPE-Mixed initial frequencies as (fy, fx).  # (num_heads, head_dim/2, 2)"""
    _checks.divisible("head_dim", head_dim, 4, "RoPE-Mixed pairs two orthogonal directions")
    _checks.positive_int("num_heads", num_heads)
    mag = rope_frequencies(head_dim // 2, theta)  # (head_dim/4,) theta^(-4j/head_dim)
    if rotate:
        phi = torch.rand(num_heads, 1, generator=generator) * 2 * math.pi  # (heads, 1)
    else:
        phi = torch.zeros(num_heads, 1)
    phi = torch.cat([phi.expand(-1, head_dim // 4), (phi + math.pi / 2).expand(-1, head_dim // 4)], 1)  # (heads, d/2)
    mag = mag.repeat(2)  # (head_dim/2,)
    return torch.stack([mag * torch.sin(phi), mag * torch.cos(phi)], dim=-1)  # (heads, d/2, 2)


def from_rope_vit_freqs(freqs: torch.Tensor, num_heads: int, grid_indexing: str = "xy") -> torch.Tensor:
    """rope-vit / timm mixed frequencies -> vispe's, per layer.  # (depth, heads, head_dim/2, 2) as (fy, fx)

    ``freqs`` (2, depth, heads * head_dim/2) (rope-vit) or (2, depth, heads, head_dim/2) (timm),
    first row multiplying the first grid coordinate: x for ``grid_indexing="xy"`` (both
    references' default), y for "ij". Copy ``out[i]`` into ``blocks[i].attn.pe.freqs``.
    """
    _checks.positive_int("num_heads", num_heads)
    _checks.choice("grid_indexing", grid_indexing, ("xy", "ij"))
    if not isinstance(freqs, torch.Tensor) or freqs.dim() not in (3, 4) or freqs.shape[0] != 2:
        got = tuple(freqs.shape) if isinstance(freqs, torch.Tensor) else type(freqs).__name__
        raise ValueError(f"freqs has shape {got}: expected (2, depth, heads * head_dim/2) or (2, depth, heads, head_dim/2)")
    f = freqs.reshape(2, freqs.shape[1], num_heads, -1)  # (2, depth, heads, d/2)
    first, second = f[0], f[1]
    fy, fx = (second, first) if grid_indexing == "xy" else (first, second)
    return torch.stack([fy, fx], dim=-1)  # (depth, heads, d/2, 2)


@register("rope_mixed")
class RopeMixed(RotaryBase):
    """Learned mixed-frequency 2D RoPE, one (fy, fx) per head and channel pair.

    Args: ``theta`` (init magnitudes, default 10 as rope-vit's RoPE-Mixed), ``rotate`` (random
    initial direction per head, default True) and those of ``vispe.image._rotary.RotaryBase``:
    ``head_dim`` (multiple of 4), ``num_heads``, ``dim``, ``grid``, ``num_prefix_tokens``,
    ``layout``, ``coords``, ``offset``, ``scale``, ``shift``, ``jitter``, ``ref_grid``, ``normalize_coords``,
    ``stretch``, ``rescale``, ``generator``, ``scaling`` ("none" | "pi" | "yarn"; "ntk" refused, module
    docstring), ``scaling_axes``, ``yarn_alpha``, ``yarn_beta``.
    """

    SCALINGS = ("none", "pi", "yarn")
    scaling_refusal = ("'ntk' rescales the base of a geometric frequency schedule, and RoPE-Mixed's frequencies "
                       "are learned 2D vectors with no base or schedule; use 'yarn' (per-frequency, base-free) or 'pi'")

    def __init__(self, head_dim: int, num_heads: int, *, theta: float = 10.0, rotate: bool = True,
                 dim: int | None = None, grid=None, num_prefix_tokens: int = 0, layout: str = "half",
                 coords: str = "index", scale: float = 1.0, shift: float = 0.0, jitter: float = 0.0,
                 ref_grid=None, normalize_coords: str = "separate", stretch: float = 1.0, rescale: float = 1.0,
                 generator: torch.Generator | None = None, scaling: str = "none", scaling_axes: str | None = None,
                 yarn_alpha: float | None = None, yarn_beta: float | None = None, offset: float = 0.0) -> None:
        super().__init__(head_dim, num_heads, dim=dim, grid=grid, num_prefix_tokens=num_prefix_tokens,
                         layout=layout, coords=coords, scale=scale, shift=shift, jitter=jitter, ref_grid=ref_grid,
                         normalize_coords=normalize_coords, stretch=stretch, rescale=rescale, generator=generator,
                         scaling=scaling, scaling_axes=scaling_axes, yarn_alpha=yarn_alpha, yarn_beta=yarn_beta,
                         offset=offset)
        self.theta = _checks.positive_float("theta", theta)
        if not isinstance(rotate, bool):
            raise ValueError(f"rotate={rotate!r}: expected True or False")
        self.rotate = rotate
        self.freqs = nn.Parameter(mixed_init(head_dim, num_heads, theta, rotate))  # (heads, d/2, 2)

    def angles(self, coords: torch.Tensor, s: torch.Tensor | None = None) -> torch.Tensor:
        """y * fy + x * fx as one (N, 2) @ (2, d/2) product per head: the cheapest form, forward and
        backward (bench/rope_share.py); float32, autocast is off here (``RotaryBase.forward``).
        ``s`` (B|1, 1, 2): "yarn" factors, applied to the fy and fx components apart (module docstring)."""
        f = self.freqs.to(device=coords.device, dtype=torch.float32)  # (heads, d/2, 2)
        if s is not None:
            ref = torch.tensor(self.ref_grid, dtype=torch.float32, device=f.device) * self.scale  # (2,)
            f = yarn_frequencies(f, s[:, :, None], ref, alpha=self.yarn_alpha, beta=self.yarn_beta)  # (B|1, heads, d/2, 2)
        return torch.matmul(coords[:, None], f.transpose(-1, -2))  # (B|1, 1, N, 2) @ (B|1|, heads, 2, d/2)

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, theta={self.theta:g}, rotate={self.rotate}"
