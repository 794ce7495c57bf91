"""Shared plumbing of the 2D rotary encodings (private): arguments, token coordinates, float32 math.

``RotaryBase`` checks the arguments every 2D RoPE takes, turns ``(shape, mask)`` into token
coordinates ``(B|1, h*w, 2)`` as (y, x) and leaves ``angles(coords)`` to the subclass.

Coordinates (``coords``, then multiplied by ``scale``), a subset of ``vispe.coords.GRID_MODES``:

* ``"index"``      0..h-1, 0..w-1 (rope-vit, EVA, timm: the default)
* ``"normalized"`` index / (n - 1), in [0, 1]
* ``"centered"``   pixel centres in [-1, 1], (index + 0.5) / n * 2 - 1 (DINOv3-style)

``offset`` (``coords="index"`` only) is added to the index before anything else: ``offset=1`` gives
Llama 4's 1-based indices (``Llama4VisionRotaryEmbedding``: ``(x + 1) * f``). A common offset
cancels in ``<R(p) q, R(p') k>`` between grid tokens; it matters against unrotated prefix tokens
(Llama 4's class token), whose logits with a patch then see the patch's absolute angle.

``ref_grid=(h0, w0)`` rescales the coordinates so that any grid spans the reference one,
``coords * (h0 / h, w0 / w)`` (EVA-02 and timm's ``ref_feat_shape``: the pre-training grid); with
a padding mask, (h, w) is each image's valid extent. None (default) leaves them as they are.

Padding mask: positions are counted over each image's valid area (``vispe.coords.mask_coords``),
so an image alone and the same image padded in a batch get the same angles on their valid tokens
(for ``"index"`` this only matters when padding is not at the bottom/right; for the normalised
modes it always does). Padding tokens get finite angles; the attention's key-padding mask hides them.

``normalize_coords`` (with ``coords="centered"`` only; DINOv3's option of the same name): the
denominator of the patch centres, ``c = (i + 0.5) / d * 2 - 1`` with ``d`` each axis's own length
(``"separate"``, default: both axes span [-1, 1]), the shorter side ``min(h, w)`` (``"min"``) or the
longer side ``max(h, w)`` (``"max"``) for both axes, so that one unit is the same number of patches
along y and x (the longer axis then exceeds [-1, 1] with "min", the shorter stays inside with "max").
With a padding mask, (h, w) is each image's valid extent.

Train-time augmentation, applied only in training mode (in eval mode the angles are the fixed
ones), in coordinate units before ``scale``, in this order:

* ``shift``: one uniform offset in [-shift, shift] per axis and image (per batch without a mask);
  DINOv3's ``shift_coords``;
* ``jitter``: a uniform offset in [-jitter, jitter] per token and axis (vispe's own);
* ``stretch``: one factor per axis and image, log-uniform in [1/stretch, stretch] (DINOv3's
  ``jitter_coords``, a multiplicative "jitter" of the [-1, 1] range per axis);
* ``rescale``: one factor per image shared by both axes, log-uniform in [1/rescale, rescale]
  (DINOv3's ``rescale_coords``; the released DINOv3 models trained with 2).

``stretch`` and ``rescale`` are factors >= 1 (1 = off). The draws use ``generator`` when one is
given (a ``torch.Generator`` of the caller, on the angles' device), else torch's global generator.
Each layer's encoding draws its own values (a model with one encoding per layer augments each
layer independently, where DINOv3 draws once per forward pass and shares it).

Resolution scaling (``scaling``, with ``ref_grid`` = the training grid (h0, w0); formulas and
papers in ``vispe.axis.rope_scaling``): each axis gets ``s = max(n / ref, 1)``, n its length (with
a mask, each image's valid extent), so a grid not longer than the training one along an axis is
left as it is there (the papers define their methods for extension; FiT clamps the same way), and at
the training grid every scaling equals ``"none"`` bit for bit.

* ``"none"`` (default): no scaling; with ``ref_grid`` the EVA-02 rescale above (which is position
  interpolation in both directions: a smaller grid is stretched to span the reference).
* ``"pi"``: position interpolation, coordinates ``/ s`` per axis (Chen et al., 2023); equal to the
  EVA-02 rescale on grids larger than ``ref_grid``, the identity on smaller ones.
* ``"ntk"``: NTK-aware base scaling, ``base * s^(d/(d-2))`` per axis, d = head_dim/2 channels of
  the axis (bloc97, 2023; Peng et al., 2023): the highest frequency kept, the lowest divided by s.
* ``"yarn"``: YaRN by parts (Peng et al., 2023), frequencies whose pair turns fewer than
  ``yarn_alpha`` times (default 1) over the training length ``ref * scale`` interpolated as PI, more
  than ``yarn_beta`` (default 32) kept, a linear ramp in the number of turns between. YaRN's attention
  temperature (0.1 ln s + 1) is not applied: the encoding gives angles, not logits
  (``vispe.axis.rope_scaling.yarn_mscale`` computes it).

``scaling_axes``: ``"per_axis"`` (default; FiT's ``decouple=True``): each axis its own s;
``"tied"``: both axes use ``max(s_y, s_x)`` (FiT's default), so PI keeps the aspect ratio of the
angles. With a scaling other than "none", ``ref_grid`` is the training grid and is required; the
EVA-02 rescale is then not applied (the scaling replaces it). Scaling needs ``coords="index"``:
"normalized" and "centered" coordinates (and DINOv3's ``normalize_coords``) already map every grid
to one range, which is position interpolation built in, so a second scaling is refused. Which
scalings a subclass takes is its ``SCALINGS``.

Continuous coordinates (``at(coords, extent)``, the contract's ``vispe.encoding``): a point at unit
coordinate u of an axis with ``n`` valid cells (``extent``) sits at ``u * n - 0.5`` cells, so cell
centres (i + 0.5) / n get exactly the grid's angles in every ``coords`` mode ("index": u n - 0.5,
"normalized": (u n - 0.5) / (n - 1), "centered": 2u - 1), ``ref_grid``, ``scaling`` (s from ``extent``) and ``scale`` included; a
query rotated at ``at(p)`` and a key rotated at its cell have logits that depend only on the offset.
No train-time augmentation is applied to such points; ``normalize_coords`` other than
"separate" is refused there.
"""
from __future__ import annotations

import math

import torch

from vispe import _checks
from vispe.axis.rope import LAYOUTS
from vispe.axis.rope_scaling import SCALINGS, YARN_ALPHA, YARN_BETA, check_ramp, pi_positions, scaling_factor
from vispe.coords import (
    VALID_MODES as COORD_MODES,
    float32_math,
    jitter_coords,
    unit_coords,
    unit_to_grid,
    valid_coords,
    valid_extent,
)
from vispe.encoding import RotaryEncoding

NORMALIZE_COORDS = ("separate", "min", "max")
SCALING_AXES = ("per_axis", "tied")

def _non_negative(name: str, value) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0:
        raise ValueError(f"{name}={value!r}: expected a non-negative number")
    return float(value)


def _factor(name: str, value) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value >= 1 or value == float("inf"):
        raise ValueError(f"{name}={value!r}: expected a finite factor >= 1 (1 = off)")
    return float(value)


def log_uniform(lead: tuple, factor: float, *, device, generator=None) -> torch.Tensor:
    """Factors log-uniform in [1/factor, factor], ``exp(U(-log factor, log factor))``.  # lead"""
    u = torch.rand(lead, generator=generator, device=device)  # lead
    return torch.exp((u * 2 - 1) * math.log(factor))


class RotaryBase(RotaryEncoding):
    """Base of vispe's 2D RoPEs. Subclasses implement ``angles(coords)``.

    Args (shared by every 2D RoPE):
        head_dim: channels per head, a multiple of 4 (pairs split between y and x).
        num_heads: attention heads.
        dim: model width; when given it must equal ``num_heads * head_dim``.
        grid, num_prefix_tokens: accepted (checked) for the uniform build interface; RoPE angles
            recompute at any grid and prefix tokens are left unrotated by the attention module.
        layout: channel pairing for ``vispe.axis.rope.apply_rope``, "half" or "interleaved".
        coords, scale: coordinate convention (module docstring) and a factor applied to it.
        offset: added to "index" coordinates first (1: 1-based, Llama 4; module docstring).
        normalize_coords: "separate" | "min" | "max", denominator of the "centered" coordinates.
        shift, jitter: train-time coordinate augmentation (module docstring); 0 = off.
        stretch, rescale: train-time log-uniform scale factors per axis / shared; 1 = off.
        generator: the ``torch.Generator`` the augmentation draws from (None: torch's global one).
        ref_grid: (h0, w0) reference grid the coordinates are rescaled to, or the training grid
            of ``scaling`` (module docstring).
        scaling: "none" | "pi" | "ntk" | "yarn", resolution scaling past ``ref_grid`` (module docstring).
        scaling_axes: "per_axis" (default) | "tied", one factor per axis or the larger for both.
        yarn_alpha, yarn_beta: YaRN's ramp ends in turns over the training length (1, 32).
    """

    mask_aware = True
    #: the ``scaling`` values this encoding takes (a subclass narrows it, saying why in ``scaling_refusal``)
    SCALINGS: tuple = SCALINGS
    scaling_refusal = ""

    def __init__(self, head_dim: int, num_heads: int, *, dim: int | None = None, grid=None,
                 num_prefix_tokens: int = 0, layout: str = "half", coords: str = "index",
                 scale: float = 1.0, shift: float = 0.0, jitter: float = 0.0, ref_grid=None,
                 normalize_coords: str = "separate", stretch: float = 1.0, rescale: float = 1.0,
                 generator: torch.Generator | None = None, scaling: str = "none", scaling_axes: str | None = None,
                 yarn_alpha: float | None = None, yarn_beta: float | None = None, offset: float = 0.0) -> None:
        super().__init__()
        self.num_heads = _checks.positive_int("num_heads", num_heads)
        self.head_dim = _checks.divisible("head_dim", head_dim, 4, "2D RoPE splits the channel pairs "
                                          "between y and x, head_dim / 4 pairs each")
        if dim is not None and _checks.positive_int("dim", dim) != num_heads * head_dim:
            raise ValueError(f"dim={dim}: expected num_heads * head_dim = {num_heads} * {head_dim} "
                             f"= {num_heads * head_dim}")
        self.dim = dim
        self.grid = None if grid is None else _checks.grid_shape("grid", grid)
        self.num_prefix_tokens = _checks.positive_int("num_prefix_tokens", num_prefix_tokens, allow_zero=True)
        self.layout = _checks.choice("layout", layout, LAYOUTS)
        self.coords = _checks.choice("coords", coords, COORD_MODES)
        self.scale = _checks.positive_float("scale", scale)
        self.shift = _non_negative("shift", shift)
        self.jitter = _non_negative("jitter", jitter)
        self.ref_grid = None if ref_grid is None else _checks.grid_shape("ref_grid", ref_grid)
        self.normalize_coords = _checks.choice("normalize_coords", normalize_coords, NORMALIZE_COORDS)
        if normalize_coords != "separate" and coords != "centered":
            raise ValueError(f"normalize_coords={normalize_coords!r} with coords={coords!r}: expected "
                             "coords='centered' (the denominator of the patch centres)")
        if isinstance(offset, bool) or not isinstance(offset, (int, float)) or not abs(offset) < float("inf"):
            raise ValueError(f"offset={offset!r}: expected a finite number added to the index coordinates (1: 1-based)")
        if offset and coords != "index":
            raise ValueError(f"offset={offset!r} with coords={coords!r}: expected coords='index' (an offset of the "
                             f"index, e.g. 1-based; {coords!r} coordinates fix their own origin)")
        self.offset = float(offset)
        self.stretch = _factor("stretch", stretch)
        self.rescale = _factor("rescale", rescale)
        if generator is not None and not isinstance(generator, torch.Generator):
            raise ValueError(f"generator={generator!r}: expected a torch.Generator or None")
        self.generator = generator
        self._init_scaling(scaling, scaling_axes, yarn_alpha, yarn_beta)
        if self.offset and self.scaling != "none":
            raise ValueError(f"offset={offset!r} with scaling={scaling!r}: expected offset=0 (whether the offset is "
                             "interpolated with the index or added after is a choice no reference makes)")

    def _init_scaling(self, scaling, scaling_axes, yarn_alpha, yarn_beta) -> None:
        self.scaling = _checks.choice("scaling", scaling, SCALINGS)
        if scaling not in self.SCALINGS:
            raise ValueError(f"scaling={scaling!r}: {type(self).__name__} takes {', '.join(map(repr, self.SCALINGS))}; "
                             f"{self.scaling_refusal}")
        for name, value in (("scaling_axes", scaling_axes), ("yarn_alpha", yarn_alpha), ("yarn_beta", yarn_beta)):
            if value is not None and (scaling == "none" or (name != "scaling_axes" and scaling != "yarn")):
                need = "a scaling other than 'none'" if name == "scaling_axes" else "scaling='yarn'"
                raise ValueError(f"{name}={value!r} with scaling={scaling!r}: only applies with {need}")
        self.scaling_axes = _checks.choice("scaling_axes", scaling_axes or "per_axis", SCALING_AXES)
        self.yarn_alpha, self.yarn_beta = check_ramp(YARN_ALPHA if yarn_alpha is None else yarn_alpha,
                                                     YARN_BETA if yarn_beta is None else yarn_beta)
        if scaling == "none":
            return
        if self.ref_grid is None:
            raise ValueError(f"scaling={scaling!r} with ref_grid=None: expected ref_grid=(h, w), the training grid "
                             "the scaling factors n / ref are taken against")
        if self.coords != "index":
            raise ValueError(f"scaling={scaling!r} with coords={self.coords!r}: expected coords='index'; "
                             f"{self.coords!r} coordinates already map every grid to one range (position "
                             "interpolation built in), so a second scaling is refused")

    def _scaling_factor(self, n: torch.Tensor) -> torch.Tensor:
        """``s = max(n / ref, 1)`` per axis, or the larger of the two when tied.  # (B|1, 1, 2)"""
        s = scaling_factor(n, self.ref_grid)  # (B|1, 1, 2)
        return s.amax(-1, keepdim=True).expand_as(s) if self.scaling_axes == "tied" else s

    def _scaled_angles(self, coords: torch.Tensor, n: torch.Tensor | None) -> torch.Tensor:
        """Angles of grid-convention ``coords`` (B|1, N, 2) on a grid of ``n`` (B|1, 1, 2) cells per axis,
        with ``scaling`` applied (PI to the coordinates, NTK / YaRN to the frequencies).  # angles"""
        if self.scaling == "none":
            return self.angles(coords * self.scale)
        s = self._scaling_factor(n)  # (B|1, 1, 2)
        if self.scaling == "pi":
            return self.angles(pi_positions(coords, s) * self.scale)
        return self.angles(coords * self.scale, s)

    def angles(self, coords: torch.Tensor, s: torch.Tensor | None = None) -> torch.Tensor:
        """Float32 angles ``(B|1, heads|1, N, head_dim/2)`` of coordinates ``coords`` (B|1, N, 2);
        ``s`` (B|1, 1, 2): the factors of ``scaling`` "ntk" / "yarn" per axis (None: unscaled)."""
        raise NotImplementedError

    def fixed_key(self) -> tuple | None:
        """A key shared by encodings whose angles are the same at every call (their cos/sin tables
        are then built once, ``vispe.kernels.rope.tables_for``), or None when the angles learn or
        are random. Subclasses with fixed angles return their settings."""
        return None

    def augmentations(self) -> tuple[str, ...]:
        """The train-time augmentations that are on, as ``name=value`` (empty: none)."""
        on = (("shift", self.shift > 0), ("jitter", self.jitter > 0), ("stretch", self.stretch > 1),
              ("rescale", self.rescale > 1))
        return tuple(f"{name}={getattr(self, name):g}" for name, active in on if active)

    def _augmenting(self) -> bool:
        return self.training and (self.shift > 0 or self.jitter > 0 or self.stretch > 1 or self.rescale > 1)

    #: whether ``convention`` maps the coordinates further (a subclass's own reference convention)
    has_convention = False

    def convention(self, coords: torch.Tensor, n: torch.Tensor) -> torch.Tensor:
        """Coordinates of a ``coords`` mode (B|1, N, 2) on a grid of ``n`` (B|1, 1, 2) valid cells per
        axis (None from ``at`` without an extent) mapped to a subclass's own convention (LieRE's,
        ComRoPE's; ``has_convention``)."""
        return coords

    def grid_angles(self, shape: tuple[int, int], mask: torch.Tensor | None, device: torch.device) -> torch.Tensor:
        return self._scaled_angles(*self.token_coords(shape, mask, device))  # (B|1, heads|1, N, head_dim/2)

    def token_coords(self, shape: tuple[int, int], mask: torch.Tensor | None,
                    device: torch.device) -> tuple[torch.Tensor, torch.Tensor | None]:
        """The grid tokens' coordinates as ``angles`` takes them, and the valid extent that ``scaling``
        needs (None without scaling).  # (B|1, N, 2), (B|1, 1, 2) | None"""
        coords = valid_coords(shape, mask, self.coords, device=device) + self.offset  # (B|1, N, 2)
        if self.has_convention:
            coords = self.convention(coords, valid_extent(mask, shape, device)[:, None])  # (B|1, N, 2)
        if self.normalize_coords != "separate":  # (c + 1) / 2 * n = i + 0.5, then over min / max side
            n = valid_extent(mask, shape, device)[:, None]  # (B|1, 1, 2)
            d = n.amin(-1, keepdim=True) if self.normalize_coords == "min" else n.amax(-1, keepdim=True)  # (B|1, 1, 1)
            coords = (coords + 1) * (n / d) - 1  # (B|1, N, 2)
        if self.ref_grid is not None and self.scaling == "none":
            coords = coords * self._ref_factor(shape, mask, device)  # (B|1, N, 2)
        if self._augmenting():
            coords = self._augment(coords)  # (B|1, N, 2)
        n = None if self.scaling == "none" else valid_extent(mask, shape, device)[:, None]  # (B|1, 1, 2)
        return coords, n

    def _augment(self, coords: torch.Tensor) -> torch.Tensor:
        """shift, jitter, stretch, rescale (module docstring), one draw per image.  # (B|1, N, 2)"""
        g, lead = self.generator, coords.shape[:-2]
        coords = jitter_coords(coords, shift=self.shift, jitter=self.jitter, generator=g)  # (B|1, N, 2)
        if self.stretch > 1:
            coords = coords * log_uniform(lead + (1, 2), self.stretch, device=coords.device, generator=g)
        if self.rescale > 1:
            coords = coords * log_uniform(lead + (1, 1), self.rescale, device=coords.device, generator=g)
        return coords

    def _ref_factor(self, shape, mask, device) -> torch.Tensor:
        """``(h0 / h, w0 / w)`` of the grid or of each image's valid extent.  # (B|1, 1, 2)"""
        ref = torch.tensor(self.ref_grid, dtype=torch.float32, device=device)  # (2,)
        return ref / valid_extent(mask, shape, device)[:, None]  # (B|1, 1, 2)

    supports_coords = True

    def at(self, coords, extent=None, *, dtype=None) -> torch.Tensor:  # (B|1, heads|1, N, head_dim/2)
        """Float32 angles at unit (y, x) ``coords`` (B|1, N, 2), ``extent`` (B|1, 2) valid cells (module docstring)."""
        coords, n = unit_coords(coords, extent)  # (B|1, N, 2), (B|1, 1, 2)
        if self.normalize_coords != "separate":
            raise ValueError(f"normalize_coords={self.normalize_coords!r}: at() evaluates the 'separate' convention "
                             "only; expected normalize_coords='separate' for continuous coordinates")
        with float32_math(coords.device):
            c = unit_to_grid(coords, n, self.coords) + self.offset  # (B|1, N, 2) in the grid's convention
            if self.has_convention:
                c = self.convention(c, n)  # n may be None (extent not given)
            if self.ref_grid is not None:
                if n is None:
                    raise ValueError("extent=None with ref_grid set: expected the valid (h, w) in cells")
                if self.scaling == "none":
                    c = c * (torch.tensor(self.ref_grid, dtype=torch.float32, device=c.device) / n)
            return self._scaled_angles(c, n)

    def forward(self, shape, mask: torch.Tensor | None = None, *, device=None) -> torch.Tensor:
        """Angles of the grid tokens, float32.  # (B|1, heads|1, h*w, head_dim/2)"""
        shape = _checks.grid_shape("shape", shape)
        mask = _checks.mask_for("mask", mask, shape)
        device = self.resolve_device(device, mask)
        with float32_math(device):
            return self.grid_angles(shape, mask, device)

    def extra_repr(self) -> str:
        return (f"head_dim={self.head_dim}, num_heads={self.num_heads}, layout={self.layout!r}, "
                f"coords={self.coords!r}, " + (f"offset={self.offset:g}, " if self.offset else "") +
                f"scale={self.scale:g}, shift={self.shift:g}, jitter={self.jitter:g}, "
                f"ref_grid={self.ref_grid}, normalize_coords={self.normalize_coords!r}, stretch={self.stretch:g}, "
                f"rescale={self.rescale:g}" + ("" if self.scaling == "none" else
                f", scaling={self.scaling!r}, scaling_axes={self.scaling_axes!r}") +
                (f", yarn_alpha={self.yarn_alpha:g}, yarn_beta={self.yarn_beta:g}" if self.scaling == "yarn" else ""))
