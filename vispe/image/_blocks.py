"""Shared plumbing of the block-rotation encodings (private): ``liere``, ``comrope``, ``string``.

``BlockRotaryBase`` is a ``vispe.image._rotary.RotaryBase`` (coordinates, padding mask, train-time
augmentation, ``at``) whose ``angles(coords)`` returns, for ``block_size`` b > 2, block rotations
``(B|1, heads, N, head_dim/b, b, b)`` (the rotary contract's second form, ``vispe.encoding``) and
for b = 2 plain angles (a 2 x 2 rotation is an angle: the fast path of every RoPE).

Channel layout: ``layout`` groups the channels of a head into blocks (``vispe.lie.block_channels``):
"interleaved" (default here: consecutive channels, the layout of the LieRE and ComRoPE
references) or "half" (strided). With one block of all ``head_dim`` channels there is nothing to
group, and "half" is refused unless the encoding has channel pairs of its own (STRING).

Factored form (issue 52): ``factors(shape, mask, device)`` and ``factors_at(coords, extent)`` run
the same coordinate pipeline as ``forward`` and ``at`` with ``_factored`` set, so that ``angles``
returns what ``vispe.kernels.rope_blocks.apply_factors`` applies without a matrix per token.

Caching: rotations learn, so they are recomputed at every call, except while they cannot change:
``frozen_key()`` is not None in eval mode when no gradient can reach them (``torch.no_grad`` or
parameters frozen); it holds every parameter's version counter, which in-place updates (optimiser
steps, ``load_state_dict``) advance, so ``vispe.kernels.rope_blocks`` never serves a stale entry.
"""
from __future__ import annotations

from typing import Any

import torch

from vispe import _checks, _tracing
from vispe.image._rotary import RotaryBase


class BlockRotaryBase(RotaryBase):
    """Base of the block-rotation encodings; subclasses call ``_init_blocks`` and implement ``angles``."""

    #: whether the encoding pairs channels itself inside one block (then "half" has a meaning at b = head_dim)
    own_pairs = False

    def _init_blocks(self, block_size: int) -> None:
        b = _checks.positive_int("block_size", block_size)
        if b < 2 or self.head_dim % b:
            raise ValueError(f"block_size={block_size!r}: expected a divisor of head_dim={self.head_dim} of at least 2")
        if self.layout == "half" and b == self.head_dim and not self.own_pairs:
            raise ValueError(f"layout='half' with block_size={b} = head_dim: one block of every channel has nothing "
                             "to group (layout groups channels into blocks); expected layout='interleaved'")
        self._block = b
        # an instance attribute from the start: torch.compile guards on its value, not on its presence
        # (set by ``factors`` on the first eager call, it recompiled a ComRoPE ViT at its second size)
        self._factored = False

    @property
    def block_size(self) -> int:  # 2: angles; b > 2: block rotations (vispe.encoding)
        return self._block

    #: while True, ``angles`` returns the factored form of ``vispe.kernels.rope_blocks`` (or None)
    _factored = False

    def factorable(self) -> bool:
        """Whether ``factors`` can give the factored form now (subclasses: not while tracing, ...)."""
        return False

    def factors(self, shape, mask, device) -> Any:
        """The grid's rotations in a factored form (``vispe.kernels.rope_blocks``: ``Conjugated``,
        ``Commuting`` or ``Recomputed``), through the same coordinates as ``forward``; None: use the
        blocks of ``forward``."""
        if not self.factorable():
            return None
        self._factored = True
        try:
            return self(shape, mask, device=device)
        finally:
            self._factored = False

    def factors_at(self, coords: torch.Tensor, extent: torch.Tensor | None = None) -> Any:
        """``at(coords, extent)`` in the factored form of ``factors`` (None: use ``at``'s blocks)."""
        if not self.factorable():
            return None
        self._factored = True
        try:
            return self.at(coords, extent)
        finally:
            self._factored = False

    def zero_rotation(self, device=None) -> torch.Tensor | None:
        """The rotation at coordinate 0, given to prefix tokens (None: the identity).  # (heads|1, nb, b, b)"""
        return None

    def frozen_key(self) -> tuple | None:
        """A cache key while the rotations cannot change (module docstring), else None."""
        if self.training or self._augmenting() or _tracing.is_tracing():
            return None
        params = list(self.parameters())
        if torch.is_grad_enabled() and any(p.requires_grad for p in params):
            return None
        return ("frozen",) + tuple((p._version, p.data_ptr()) for p in params)

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, block_size={self.block_size}"
