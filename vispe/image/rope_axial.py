"""2D axial RoPE (Heo et al., ECCV 2024, "Rotary Position Embedding for Vision Transformer";
also EVA-02 and timm's ``RotaryEmbeddingCat``).

The head_dim/2 channel pairs are split between the two axes, **y first**:

    angle_k(y, x) = y * f_k              for k = 0 .. head_dim/4 - 1
    angle_k(y, x) = x * f_(k - head_dim/4)  for k = head_dim/4 .. head_dim/2 - 1
    f_j = base^(-4 j / head_dim)         (``vispe.axis.rope.rope_frequencies(head_dim / 2, base)``)

so ``<R(p) q, R(p') k>`` depends only on the 2D offset p - p'. rope-vit puts x first
(``cat([freqs_x, freqs_y])``), as do timm's RoPE ViTs (``rope_grid_indexing="xy"``):
``axis_order="xy"`` reproduces them (with ``layout="interleaved"``, their pairing). Or keep vispe's
y-first order and convert the checkpoint: ``convert_rope_axis_order`` permutes the q/k projection
rows (the two quarters of pairs of every head swap places), which gives the same attention.
``base`` defaults to 100, rope-vit's theta for its axial variant (``compute_axial_cis(...,
theta=100.0)``); RoFormer's 1D default is 10000; EVA-02 uses 10000 with ``ref_grid`` (16, 16).

Which frequencies each axis takes (``freq_split``):

* ``"shared"`` (default): both axes the same head_dim/4 frequencies ``f_j`` above (rope-vit, EVA,
  timm, Qwen2-VL / Qwen2.5-VL ``VisionRotaryEmbedding``, Llama 4 vision);
* ``"even_odd"``: one schedule of head_dim/2 frequencies over the full head_dim,
  ``F_k = base^(-2 k / head_dim)``, y taking the even-indexed ``F_0, F_2, ...`` and x the odd-indexed
  ``F_1, F_3, ...`` (Pixtral ``PixtralRotaryEmbedding``: ``inv_freq[0::2]`` for h, ``[1::2]`` for w),
  so x's frequencies sit half a step below y's: ``F_(2j) = f_j``, ``F_(2j+1) = f_j * base^(-2/head_dim)``;
* ``"blocked"``: that schedule cut in two, y taking ``F_0 .. F_(head_dim/4 - 1)`` (the high half) and
  x the rest (a 1D RoPE's frequencies shared out by axis; no reference model found).

The y block still goes where ``axis_order`` puts it; periods (``min_period``) and ``scaling="ntk"``
(a base change of one axis's own geometric schedule) take ``"shared"`` only.

Periods instead of a base (DINOv3, Simeoni et al., 2025, "DINOv3", ``RopePositionEmbedding``):
``min_period`` and ``max_period`` give ``f_j = 1 / period_j`` with the periods geometric from one
to the other, ``period_j = min_period * (max_period / min_period)^(j / (head_dim/4 - 1))``; with a
base, ``period_j = base^(4 j / head_dim)`` (the same ``f_j`` as above). DINOv3's angle is
``2 pi * coord / period_j`` on patch centres in [-1, 1]: ``coords="centered", scale=2 * pi`` with
``normalize_coords``, and its training augmentation ``shift`` / ``stretch`` / ``rescale``
(``vispe.image._rotary``; ``vispe.models.dinov3.dinov3_rope_kwargs`` writes the whole set).

Resolution scaling past the training grid ``ref_grid`` (``scaling``, ``vispe.image._rotary``; the
formulas and papers in ``vispe.axis.rope_scaling``), per axis with ``s = max(n / ref, 1)``:

    "pi"    angle_k = (y / s_y) * f_k                                  (Chen et al., 2023)
    "ntk"   f_k -> f_k * s^(-k / (K - 1)), K = head_dim/4 per axis,     (bloc97, 2023)
            i.e. base -> base * s^(d / (d - 2)), d = head_dim/2; with periods: max_period * s
    "yarn"  f_k -> (1 - g(r_k)) f_k / s + g(r_k) f_k,  r_k = ref * scale * f_k / (2 pi),
            g = clamp((r - yarn_alpha) / (yarn_beta - yarn_alpha), 0, 1)   (Peng et al., 2023)

Input: grid ``shape`` (h, w), optional padding mask (B, h, w). Output: float32 angles
``(B|1, 1, h*w, head_dim/2)`` (the same for every head). Grid change: angles recompute at any
(h, w), cached per (h, w, device). Prefix tokens: left unrotated (the attention prepends zeros).
Coordinates, mask handling and train-time shift/jitter: see ``vispe.image._rotary``.
"""
from __future__ import annotations

import torch

from vispe import _checks
from vispe.axis.rope import LAYOUTS, rope_frequencies
from vispe.axis.rope_scaling import ntk_frequencies, yarn_frequencies
from vispe.image._rotary import RotaryBase
from vispe.registry import register


AXIS_ORDERS = ("yx", "xy")
FREQ_SPLITS = ("shared", "even_odd", "blocked")


def period_frequencies(n: int, min_period: float, max_period: float, *, device=None) -> torch.Tensor:
    """``1 / period_j``, periods geometric from ``min_period`` to ``max_period`` (DINOv3).  # (n,)"""
    t = torch.linspace(0, 1, n, dtype=torch.float32)  # (n,)
    return (1.0 / (min_period * (max_period / min_period) ** t)).to(device)  # (n,)


@register("rope_axial")
class RopeAxial(RotaryBase):
    """Axial 2D RoPE, y on the first head_dim/4 pairs, x on the next head_dim/4.

    Args: ``base`` (theta, default 100), or ``min_period`` and ``max_period`` (module docstring;
    not with ``base``), ``axis_order`` ("yx": y on the first quarter of pairs,
    default; "xy": x first, rope-vit / timm), ``freq_split`` ("shared": each axis the head_dim/4
    frequencies, default; "even_odd": y / x the even / odd ones of head_dim/2 over the full head,
    Pixtral; "blocked": the high / low half of those) and those of ``vispe.image._rotary.RotaryBase``:
    ``head_dim`` (multiple of 4), ``num_heads``, ``dim``, ``grid``, ``num_prefix_tokens``,
    ``layout`` ("half" | "interleaved"), ``coords`` ("index" | "normalized" | "centered"),
    ``offset`` (1: 1-based indices, Llama 4), ``scale``, ``shift``, ``jitter``, ``ref_grid``, ``normalize_coords``, ``stretch``, ``rescale``,
    ``generator``, ``scaling`` ("none" | "pi" | "ntk" | "yarn"), ``scaling_axes``, ``yarn_alpha``,
    ``yarn_beta`` (module docstring).
    """

    def __init__(self, head_dim: int, num_heads: int, *, base: float | None = None, axis_order: str = "yx",
                 dim: int | None = None, grid=None, num_prefix_tokens: int = 0, layout: str = "half",
                 coords: str = "index", scale: float = 1.0, shift: float = 0.0, jitter: float = 0.0,
                 ref_grid=None, min_period: float | None = None, max_period: float | None = None,
                 normalize_coords: str = "separate", stretch: float = 1.0, rescale: float = 1.0,
                 generator: torch.Generator | None = None, scaling: str = "none", scaling_axes: str | None = None,
                 yarn_alpha: float | None = None, yarn_beta: float | None = None, freq_split: str = "shared",
                 offset: float = 0.0) -> None:
        if scaling == "ntk" and head_dim == 4:
            raise ValueError("scaling='ntk' with head_dim=4: one frequency per axis has no schedule to bend "
                             "(base * s^(d/(d-2)) with d = 2 is undefined); expected head_dim >= 8")
        super().__init__(head_dim, num_heads, dim=dim, grid=grid, num_prefix_tokens=num_prefix_tokens,
                         layout=layout, coords=coords, scale=scale, shift=shift, jitter=jitter, ref_grid=ref_grid,
                         normalize_coords=normalize_coords, stretch=stretch, rescale=rescale, generator=generator,
                         scaling=scaling, scaling_axes=scaling_axes, yarn_alpha=yarn_alpha, yarn_beta=yarn_beta,
                         offset=offset)
        self.freq_split = _checks.choice("freq_split", freq_split, FREQ_SPLITS)
        if freq_split != "shared" and (min_period is not None or max_period is not None):
            raise ValueError(f"freq_split={freq_split!r} with min_period / max_period: expected freq_split='shared' "
                             "(periods give each axis its own schedule; a split shares out one schedule of the head)")
        if freq_split != "shared" and scaling == "ntk":
            raise ValueError(f"freq_split={freq_split!r} with scaling='ntk': expected freq_split='shared' (NTK bends "
                             "each axis's own geometric schedule from its highest frequency; use 'yarn' or 'pi')")
        if (min_period is None) != (max_period is None):
            raise ValueError(f"min_period={min_period!r}, max_period={max_period!r}: expected both or neither")
        if min_period is not None:
            if base is not None:
                raise ValueError(f"base={base!r} with min_period / max_period: expected one frequency schedule")
            self.min_period = _checks.positive_float("min_period", min_period)
            self.max_period = _checks.positive_float("max_period", max_period)
        else:
            self.min_period = self.max_period = None
            base = 100.0 if base is None else base
        self.base = None if base is None else _checks.positive_float("base", base)
        self.axis_order = _checks.choice("axis_order", axis_order, AXIS_ORDERS)

    def frequencies(self, device=None) -> torch.Tensor:
        """The head_dim/4 frequencies of one axis, float32.  # (head_dim/4,)"""
        if self.min_period is not None:
            return period_frequencies(self.head_dim // 4, self.min_period, self.max_period, device=device)
        return rope_frequencies(self.head_dim // 2, self.base, device=device)

    def axis_frequencies(self, device=None) -> tuple[torch.Tensor, torch.Tensor]:
        """The head_dim/4 frequencies of y and of x (``freq_split``), float32.  # (head_dim/4,) each"""
        if self.freq_split == "shared":
            f = self.frequencies(device)  # (head_dim/4,)
            return f, f
        full = rope_frequencies(self.head_dim, self.base, device=device)  # (head_dim/2,) base^(-2k/head_dim)
        if self.freq_split == "even_odd":
            return full[0::2], full[1::2]
        return full.chunk(2)

    def angles(self, coords: torch.Tensor, s: torch.Tensor | None = None) -> torch.Tensor:
        fy, fx = self.axis_frequencies(coords.device)  # (head_dim/4,) each
        if s is not None:  # "ntk" / "yarn": each axis's frequencies bent by its factor
            fy, fx = (self.scaled_frequencies(f, s[..., a:a + 1], a) for a, f in enumerate((fy, fx)))  # (B|1, 1, head_dim/4)
        y = coords[..., 0, None] * fy  # (B|1, N, head_dim/4)
        x = coords[..., 1, None] * fx  # (B|1, N, head_dim/4)
        parts = [y, x] if self.axis_order == "yx" else [x, y]
        return torch.cat(parts, dim=-1)[:, None]  # (B|1, 1, N, head_dim/2)

    def scaled_frequencies(self, f: torch.Tensor, s: torch.Tensor, axis: int) -> torch.Tensor:
        """One axis's frequencies ``f`` (head_dim/4,) under ``scaling`` "ntk" / "yarn" with factors
        ``s`` (B|1, 1, 1) (``vispe.axis.rope_scaling``): NTK bends the geometric schedule (base or
        periods) so the lowest frequency is divided by s; YaRN measures turns over the training
        length ``ref_grid[axis] * scale``.  # (B|1, 1, head_dim/4)"""
        if self.scaling == "ntk":
            return ntk_frequencies(f, s)
        return yarn_frequencies(f, s, self.ref_grid[axis] * self.scale, alpha=self.yarn_alpha, beta=self.yarn_beta)

    def grid_angles(self, shape, mask, device) -> torch.Tensor:
        if mask is not None or self._augmenting():
            return super().grid_angles(shape, mask, device)
        key = ("rope_axial", shape[0], shape[1], device, torch.float32)
        return self.cached(key, lambda: super(RopeAxial, self).grid_angles(shape, None, device))

    def fixed_key(self) -> tuple | None:
        if self._augmenting():
            return None
        return ("rope_axial", self.head_dim, self.base, self.axis_order, self.coords, self.scale, self.ref_grid,
                self.normalize_coords, self.min_period, self.max_period, self.scaling, self.scaling_axes,
                self.yarn_alpha, self.yarn_beta, self.freq_split, self.offset)

    def extra_repr(self) -> str:
        freqs = (f"base={self.base:g}" if self.min_period is None
                 else f"min_period={self.min_period:g}, max_period={self.max_period:g}")
        split = "" if self.freq_split == "shared" else f", freq_split={self.freq_split!r}"
        return f"{super().extra_repr()}, {freqs}, axis_order={self.axis_order!r}{split}"


def axis_pair_permutation(head_dim: int, layout: str = "half") -> torch.Tensor:
    """Channel order of one head that swaps the two quarters of pairs (y <-> x).  # (head_dim,) long

    ``new[c] = old[perm[c]]``; the permutation is its own inverse.
    """
    _checks.divisible("head_dim", head_dim, 4, "2D RoPE splits the channel pairs between y and x")
    _checks.choice("layout", layout, LAYOUTS)
    q = head_dim // 4
    pairs = torch.cat([torch.arange(q, 2 * q), torch.arange(0, q)])  # (head_dim/2,) new pair <- old pair
    if layout == "half":
        return torch.cat([pairs, pairs + head_dim // 2])  # pair i = channels (i, i + d/2)
    return torch.stack([2 * pairs, 2 * pairs + 1], dim=-1).flatten()  # pair i = channels (2i, 2i + 1)


_QK_ROWS = ("q_proj.weight", "q_proj.bias", "k_proj.weight", "k_proj.bias", "q_bias")
_QK_NORM = ("q_norm.weight", "q_norm.bias", "k_norm.weight", "k_norm.bias")


def convert_rope_axis_order(state_dict: dict, *, num_heads: int, head_dim: int, layout: str = "half") -> dict:
    """A checkpoint trained with one RoPE axis order, rewritten for the other (x first <-> y first).

    Permutes, in every attention layer, the q and k output channels of each head
    (``axis_pair_permutation``): the q and k rows of a fused ``qkv.weight`` / ``qkv.bias``, and
    ``q_proj`` / ``k_proj`` / ``q_bias`` (timm's Eva) and per-head ``q_norm`` / ``k_norm`` affine
    weights; v and everything else are kept. A model built with the other ``axis_order`` then gives
    the same outputs (q.k is unchanged by a common permutation). Returns a new dict.
    """
    _checks.positive_int("num_heads", num_heads)
    perm = axis_pair_permutation(head_dim, layout)  # (head_dim,)
    A = num_heads * head_dim
    head_perm = (torch.arange(num_heads)[:, None] * head_dim + perm).flatten()  # (A,)
    out = dict(state_dict)
    for key, value in state_dict.items():
        if key.endswith(("qkv.weight", "qkv.bias")):
            if value.shape[0] != 3 * A:
                raise ValueError(f"{key} has shape {tuple(value.shape)}: expected {3 * A} rows "
                                 f"(3 * num_heads * head_dim = 3 * {num_heads} * {head_dim})")
            rows = torch.cat([head_perm, head_perm + A, torch.arange(2 * A, 3 * A)])  # (3A,)
            out[key] = value[rows]
        elif key.endswith(_QK_ROWS):
            if value.shape[0] != A:
                raise ValueError(f"{key} has shape {tuple(value.shape)}: expected {A} rows (num_heads * head_dim)")
            out[key] = value[head_perm]
        elif key.endswith(_QK_NORM) and value.shape[0] == head_dim:
            out[key] = value[perm]
    return out
