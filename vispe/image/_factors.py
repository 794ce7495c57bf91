"""The factored forms in which a block-rotation encoding may give its rotations (issue 52): what
``BlockRotaryBase.factors`` returns and ``vispe.kernels.rope_blocks.apply_factors`` applies without a
matrix per token. They sit with the encodings (the image layer), the kernels import them."""
from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

import torch


class Conjugated(NamedTuple):
    """``R(p) = RoPE(angles) P`` (STRING): P (H|1, nb, b, b) on consecutive blocks, angles
    (B|1, H|1, N, d/2) paired per ``layout``."""
    P: torch.Tensor
    angles: torch.Tensor
    layout: str


class Commuting(NamedTuple):
    """``R(p) = exp(t B)`` per block (ComRoPE): t (B|1, H|1, N, nb), B (H, nb, b, b) skew-symmetric,
    basis (Q, w) its real Schur form (``vispe.lie.skew_schur``); on a grid whose
    scalars separate, ``grid`` (ty, tx) (B|1, H|1, h|w, nb) with ``t = ty[row] + tx[col]`` (t is None)."""
    t: torch.Tensor | None
    B: torch.Tensor
    basis: tuple[torch.Tensor, torch.Tensor]
    grid: tuple[torch.Tensor, torch.Tensor] | None = None

    def tokens(self) -> int:
        return self.grid[0].shape[-2] * self.grid[1].shape[-2] if self.grid is not None else self.t.shape[-2]


class Recomputed(NamedTuple):
    """Blocks ``build(*inputs)`` (B|1, H|1, N, nb, b, b) rebuilt in backward (LieRE)."""
    build: Callable[..., torch.Tensor]
    inputs: tuple[torch.Tensor, ...]
