"""Multiplicative combination of content and position: ``x * p`` instead of ``x + p``.

Most encodings are added to the token (Vaswani et al., 2017); the alternative of multiplying
content and position element-wise is discussed in the survey of Dufter, Schmitt and Schütze
(2022, "Position Information in Transformers: An Overview", Computational Linguistics), and is
what the complex-order embedding of Wang et al. (ICLR 2020) does on its amplitude
(``r e^{i(w p + theta)}``, see ``vispe.axis.complex_order``).

    combine="product":     out = x * p
    combine="one_plus":    out = x * (1 + p)

``one_plus`` keeps the content unchanged where ``p = 0``, so a zero-initialised learned code starts
as the identity and a bounded code (sinusoid in [-1, 1]) modulates the gain between 0 and 2
instead of flipping signs around zero.

``x`` is (..., C); ``p`` is any code of the positions that broadcasts against it, typically
(..., C) from a 1D primitive (``sinusoidal``, ``LearnedTable1d``, ``ComplexOrder1d`` ...).
"""
from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn

from vispe import _checks

COMBINES = ("product", "one_plus")


def multiplicative(x: torch.Tensor, pe: torch.Tensor, combine: str = "product") -> torch.Tensor:
    """``x * pe`` (or ``x * (1 + pe)``), element-wise; ``pe`` must broadcast to ``x``'s shape.

    Returns ``x``'s shape and dtype (``pe`` is cast to ``x``'s dtype at the end).
    """
    _checks.choice("combine", combine, COMBINES)
    try:
        shape = torch.broadcast_shapes(x.shape, pe.shape)
    except RuntimeError:
        shape = None
    if shape != x.shape:
        raise ValueError(f"pe has shape {tuple(pe.shape)}: expected a shape that broadcasts to "
                         f"x's {tuple(x.shape)}")
    pe = pe.to(x.dtype)
    return x * (1 + pe) if combine == "one_plus" else x * pe


class Multiplicative(nn.Module):
    """Wrap any 1D code ``code(pos) -> (..., C)`` to combine it with the tokens by product.

    ``forward(x (..., N, C), pos (..., N)) -> (..., N, C)``: ``multiplicative(x, code(pos))``.
    A learned code (an ``nn.Module``) is registered as a submodule and trained with the model.
    """

    def __init__(self, code: Callable[[torch.Tensor], torch.Tensor], combine: str = "product") -> None:
        super().__init__()
        if not callable(code):
            raise ValueError(f"code={code!r}: expected a callable mapping positions to (..., C) codes")
        self.code = code
        self.combine = _checks.choice("combine", combine, COMBINES)

    def forward(self, x: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
        return multiplicative(x, self.code(pos), self.combine)  # (..., N, C)

    def extra_repr(self) -> str:
        return f"combine={self.combine!r}"
