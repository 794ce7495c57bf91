"""The encoding contract: four families, one base class each.

Every 2D encoding is an ``nn.Module`` with a class attribute ``family`` and a ``forward`` whose
signature depends only on the family, so that models never special-case an encoding:

| family | forward(...) | returns |
|---|---|---|
| ``additive`` | ``(shape, mask=None, *, device, dtype)`` | ``(B|1, h*w, dim)`` |
| ``rotary`` | ``(shape, mask=None, *, device)`` | angles ``(B|1, heads|1, h*w, head_dim/2)`` float32, or block rotations (below) |
| ``bias`` | ``(shape, mask=None, *, device, dtype, q=None)`` | ``(B|1, heads, P+h*w, P+h*w)`` |
| ``conditional`` | ``(x (B, C, h, w), mask=None)`` | ``(B, C, h, w)`` term to add |
| ``none`` | anything | ``None`` |

``shape`` is the token grid ``(h, w)``; ``mask`` is a padding mask ``(B, h, w)``, True = padding.
Tokens are flattened row-major: token ``i`` sits at ``(y, x) = divmod(i, w)``.

Rotary encodings come in two forms, told apart by ``pe.block_size`` (the one extension of the
rotary contract for rotations that are not independent 2x2 planes, issue 38):

* ``block_size == 2`` (every RoPE): float32 angles ``(B|1, heads|1, N, head_dim/2)``; channel pair i
  is rotated by angle i (pairs per ``layout``: "half" (i, i + head_dim/2), "interleaved" (2i, 2i+1)).
* ``block_size == b > 2`` (``liere``, ``comrope``, ``string``): float32 block rotations
  ``(B|1, heads|1, N, head_dim/b, b, b)``, one orthogonal b x b matrix per token, head and block of
  channels; block j acts on the channels ``vispe.lie.block_channels(head_dim, b, layout)[j]``
  ("interleaved": consecutive channels [j b, (j+1) b), the references' layout; "half": strided
  channels j, j + head_dim/b, ...; both reduce to the angle pairs for b = 2).

Both forms are applied by the same entry point, ``vispe.kernels.rope.rotate_qk`` (the block form
by ``vispe.kernels.rope_blocks``), in self-attention and, at continuous coordinates (``at``), in
cross-attention; the prefix rule, mask handling, float32 math and ``at`` are the same for both.

Prefix tokens (class, register), ``P = num_prefix_tokens``:

* additive: the grid part is returned by ``forward``; ``prefix()`` returns the encoding's own
  learned prefix vectors ``(1, P, dim)`` or ``None`` (prefix tokens then get no position).
* rotary: prefix tokens are left unrotated (angle 0); the attention module prepends the zeros.
* bias: the encoding owns learned per-head scalars for prefix-to-token, token-to-prefix and
  prefix-to-prefix logits (BEiT's rule) and returns the full ``(P+N) x (P+N)`` bias.
* conditional: works on the grid only; prefix tokens pass through unchanged.

Grid change: every encoding accepts any ``(h, w)`` at run time (fixed tables recompute, learned
tables resample, relative tables re-index or resize) or raises a ValueError that says why.
``resize_(shape)`` makes a learned table's stored size ``shape`` permanently (load time).

Checkpoints know their grid: an encoding whose learned tables are built for a grid says which in
``table_grid()``, and its state_dict records it under the key ``table_grid`` ((2,) long tensor,
(h, w); kept in the state_dict's ``_metadata`` instead where a model must keep foreign keys, as
a ViT's timm ``pos_embed``). Loading a state_dict saved at another grid calls ``load_grid_``,
which resizes the tables by the encoding's own rule or raises a ValueError naming both grids,
never reads a table with another grid's axes because the sizes match (8x12 vs 12x8). A state_dict
without a record (older, or timm's) gets the grid from ``infer_grid`` (the table shapes where they
tell it; else the encoding's own grid when the size matches, or a square grid, as timm assumes).

Numerics: tables and angles are computed in float32 on the target device, even under autocast,
and cast to ``dtype`` at the end. Tables that do not learn live in a cache keyed by
(h, w, device, dtype), never in the state_dict.

Continuous coordinates (the one extension for points that are not grid cells, e.g. a detector's
anchors): ``pe.at(coords, extent=None, *, dtype=None)`` evaluates an additive or rotary encoding
at ``coords`` (B|1, N, 2), float (y, x) in *unit coordinates* of each image's valid area (0 = its
top/left edge, 1 = its bottom/right edge; the centre of cell i of n is (i + 0.5) / n).
``extent`` (B|1, 2) is the valid size (h, w) in cells of the grid the encoding runs on beside
these points (a DETR's feature map), needed by encodings that count cells (RoPE's "index"
coordinates); encodings that work in unit coordinates ignore it. Additive encodings return
``(B|1, N, dim)`` in ``dtype``; rotary ones float32 angles ``(B|1, heads|1, N, head_dim/2)`` (block
rotations ``(B|1, heads|1, N, head_dim/b, b, b)`` for ``block_size > 2``), so that a query rotated
at ``at(coords)`` and a key rotated on the grid have logits that depend only on their offset
(wherever the encoding has the relative property: not LieRE with non-commuting blocks). ``supports_coords`` says whether an encoding has values between its cells; one that
has not (a learned table, a relative-bias table, a convolution) refuses with the reason
(``coords_refusal``). Each encoding's docstring says how its grid cells map to unit coordinates.
"""
from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable
from typing import Any, ClassVar, cast

import torch
from torch import nn

from vispe import _tracing

FAMILIES = ("additive", "rotary", "bias", "conditional", "none")
#: state_dict key (and ``_metadata`` entry) of the grid an encoding's learned tables are built for
GRID_KEY = "table_grid"


class PositionEncoding(nn.Module):
    """Base of every encoding. Subclasses set ``family`` and implement ``forward``."""

    family: ClassVar[str] = "none"
    registry_name: ClassVar[str] = ""
    #: whether positions are counted over each image's valid (unpadded) area when a mask is given
    mask_aware: ClassVar[bool] = False
    #: the setting that makes an instance mask-aware when the class is not always (e.g. "mask_aware=True")
    mask_aware_option: ClassVar[str] = ""
    #: arguments the example call of ``vispe.build``'s missing-argument error adds to the required ones,
    #: for one that is needed in another form (``relpos_decomposed``: ``head_dim`` or ``dim``)
    build_example: ClassVar[dict[str, str]] = {}

    def __init__(self) -> None:
        super().__init__()
        self._cache: OrderedDict[tuple[Any, ...], torch.Tensor] = OrderedDict()

    def cached(self, key: tuple[Any, ...], fn: Callable[[], torch.Tensor], max_items: int = 16) -> torch.Tensor:
        """Memoise a table that does not learn, keyed by ``key`` (include h, w, device, dtype) and
        whether inference mode is on (added here: a table made under ``torch.inference_mode`` cannot
        serve autograd later).

        Only for tables that do not learn: a learned table must be recomputed every step. Not
        used while torch.compile / torch.export record (sizes may be symbolic, see ``vispe._tracing``;
        the key is not even built then: dynamo breaks the graph at ``torch.is_inference_mode_enabled``).
        """
        if _tracing.is_tracing():
            return fn()
        key = (*key, torch.is_inference_mode_enabled())
        if key in self._cache:
            self._cache.move_to_end(key)
            return self._cache[key]
        value = fn()
        self._cache[key] = value
        while len(self._cache) > max_items:
            self._cache.popitem(last=False)
        return value

    def _apply(self, fn: Callable[[torch.Tensor], torch.Tensor], recurse: bool = True) -> PositionEncoding:
        self._cache.clear()  # .to(), .cuda(), .half(): drop cached tables
        super()._apply(fn, recurse)
        return self

    def train(self, mode: bool = True) -> PositionEncoding:
        self._cache.clear()
        return super().train(mode)

    def resolve_device(self, device: torch.device | str | None = None, like: torch.Tensor | None = None) -> torch.device:
        """The device of a call: ``device`` if given, else that of ``like`` (a mask or the queries),
        else that of the encoding's first parameter, else the CPU."""
        if device is not None:
            return torch.device(device)
        if like is not None:
            return like.device
        p = next(self.parameters(), None)
        return p.device if p is not None else torch.device("cpu")

    def __prepare_scriptable__(self) -> None:  # torch.jit.script: a clear error (vispe._tracing)
        _tracing.refuse_script(f"the {self.registry_name or type(self).__name__} encoding")

    #: whether ``at(coords, ...)`` evaluates the encoding at continuous (y, x) (module docstring)
    supports_coords: ClassVar[bool] = False

    def coords_refusal(self) -> str:
        """Why this encoding cannot be evaluated between grid cells (shown in every refusal)."""
        return {"bias": "it is a bias between two grid tokens, not a function of one position",
                "conditional": "it is a convolution of the feature map, with no value away from its cells",
                "none": "it has no position"}.get(self.family, "it has values only at its grid cells")

    def at(self, coords: torch.Tensor, extent: torch.Tensor | None = None, *,
           dtype: torch.dtype | None = None) -> torch.Tensor:
        """The encoding at continuous (y, x) ``coords`` (B|1, N, 2) in unit coordinates (module docstring)."""
        raise ValueError(f"the {self.registry_name or type(self).__name__} encoding cannot be evaluated at "
                         f"continuous coordinates: {self.coords_refusal()}")

    def resize_(self, shape: tuple[int, int]) -> PositionEncoding:
        """Make stored tables fit grid ``shape``; fixed encodings have nothing to do."""
        return self

    # --- checkpoints that know their grid (module docstring) -----------------------------------
    def table_grid(self) -> tuple[int, int] | None:
        """The (h, w) grid the learned tables are built for; None when none depends on a grid."""
        return None

    def infer_grid(self, state_dict: dict[str, Any], prefix: str) -> tuple[int, int] | None:
        """The grid of a state_dict that has no record (None: its tables are absent)."""
        return self.table_grid()

    def load_grid_(self, state_dict: dict[str, Any], prefix: str, saved: tuple[int, int]) -> None:
        """Bring the tables of ``state_dict`` (keys ``prefix + name``), saved for grid ``saved``, to
        ``table_grid()`` in place, by the encoding's own rule; this default refuses."""
        raise ValueError(f"{prefix or 'state_dict'}: the learned tables were saved for grid {saved}, this "
                         f"{type(self).__name__} is built for grid {self.table_grid()} and cannot resize them")

    def _save_to_state_dict(self, destination: dict[str, Any], prefix: str, keep_vars: bool) -> None:
        super()._save_to_state_dict(destination, prefix, keep_vars)
        grid = self.table_grid()
        if grid is not None:
            destination[prefix + GRID_KEY] = torch.tensor(grid, dtype=torch.long)  # (2,) as (h, w)

    def _load_from_state_dict(self, state_dict: dict[str, Any], prefix: str, local_metadata: dict[str, Any],
                              strict: bool, missing_keys: list[str], unexpected_keys: list[str],
                              error_msgs: list[str]) -> None:
        grid = self.table_grid()
        if grid is not None:
            record = state_dict.pop(prefix + GRID_KEY, None)  # load_state_dict works on its own copy
            if record is None:
                record = local_metadata.get(GRID_KEY)
            saved = self.infer_grid(state_dict, prefix) if record is None else tuple(int(v) for v in record)
            if saved is not None and saved != tuple(grid):
                self.load_grid_(state_dict, prefix, cast("tuple[int, int]", saved))
        super()._load_from_state_dict(state_dict, prefix, local_metadata, strict, missing_keys,
                                      unexpected_keys, error_msgs)

    def extra_repr(self) -> str:
        return f"family={self.family}"


class AdditiveEncoding(PositionEncoding):
    family = "additive"
    dim: int
    #: whether a model gives this encoding its prefix (class, register) tokens by default, i.e. builds
    #: it with ``num_prefix_tokens = P`` so that they get learned position vectors (``learned_abs``,
    #: timm's layout); the others give prefix tokens no position unless asked
    learned_prefix: ClassVar[bool] = False

    def prefix(self, *, device: torch.device | str | None = None,
               dtype: torch.dtype | None = None) -> torch.Tensor | None:  # (1, P, dim) or None
        return None


class RotaryEncoding(PositionEncoding):
    family = "rotary"
    head_dim: int
    num_heads: int
    #: how q/k channels are paired: "half" (rotate-half, GPT-NeoX/EVA/timm) or "interleaved" (RoFormer);
    #: for block rotations, how channels are grouped in blocks (module docstring)
    layout: str = "half"
    #: 2: ``forward`` returns angles; b > 2: block rotations of b x b (module docstring)
    block_size: int = 2


class BiasEncoding(PositionEncoding):
    family = "bias"
    num_heads: int
    num_prefix_tokens: int = 0
    #: a contextual bias depends on the queries: forward is then called with ``q`` (B, heads, L, d)
    contextual: bool = False

    def relative(self, shape: tuple[int, int], *, device: torch.device | str | None = None
                 ) -> tuple[torch.Tensor, tuple[torch.Tensor, ...] | None] | None:
        """The bias as a table over the grid's 2D offsets, for a bias of the offset alone:
        ``(table ((2h-1)(2w-1), heads) float32, prefix scalars or None)``, which attention runs with
        without building the (heads, L, L) bias (``vispe.kernels.relative_bias``); None otherwise
        (this default). ``vispe.image._bias.BiasBase`` gives it for its relative encodings."""
        return None


class ConditionalEncoding(PositionEncoding):
    family = "conditional"
    dim: int


