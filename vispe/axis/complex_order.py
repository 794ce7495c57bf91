"""Complex-order embedding (Wang et al., ICLR 2020, "Encoding word order in complex embeddings").

Each dimension k is a wave of learned amplitude r_k, frequency w_k and initial phase theta_k:

    f(p)_k = r_k e^{i (w_k p + theta_k)}
    real part  r_k cos(w_k p + theta_k),   imaginary part  r_k sin(w_k p + theta_k)

so a shift of position multiplies the code by ``e^{i w delta}`` (a per-dimension rotation): the
relation between positions is position-free, as in RoPE. In the paper r, w and theta are per
word (r is the word embedding); here they are per dimension by default, and the pure function
``complex_order`` accepts any tensors that broadcast against ``pos[..., None]`` for the per-token
form. Real arithmetic only (no complex dtype): the result is (..., 2*dim) as [real, imag]
(``output="concat"``) or the pair ``(real, imag)`` (``output="pair"``).

Computed in float32 (float64 if an input is float64), autocast or not.
"""
from __future__ import annotations

import torch
from torch import nn

from vispe import _checks
from vispe.axis._util import compute_dtype
from vispe.axis.sinusoidal import sinusoid_frequencies

OUTPUTS = ("concat", "pair")


def complex_order(pos: torch.Tensor, amplitude: torch.Tensor, frequency: torch.Tensor,
                  phase: torch.Tensor, output: str = "concat"):
    """``r cos(w p + theta)`` and ``r sin(w p + theta)`` for positions ``pos`` (any shape).

    ``amplitude``, ``frequency``, ``phase``: (dim,) or anything broadcasting with (..., dim).
    Returns ``pos.shape + (2*dim,)`` = [real, imag] (``"concat"``) or ``(real, imag)`` (``"pair"``).
    """
    _checks.choice("output", output, OUTPUTS)
    for name, t in (("frequency", frequency), ("phase", phase)):
        if t.shape[-1:] != amplitude.shape[-1:]:
            raise ValueError(f"{name} has shape {tuple(t.shape)}: expected last dimension "
                             f"{amplitude.shape[-1]} like amplitude {tuple(amplitude.shape)}")
    wd = compute_dtype(pos, amplitude, frequency, phase)
    angle = pos.to(wd)[..., None] * frequency.to(wd) + phase.to(wd)  # (..., dim)
    real = amplitude.to(wd) * angle.cos()  # (..., dim)
    imag = amplitude.to(wd) * angle.sin()  # (..., dim)
    return (real, imag) if output == "pair" else torch.cat([real, imag], dim=-1)  # (..., 2*dim)


class ComplexOrder1d(nn.Module):
    """Learned per-dimension amplitude ``r``, frequency ``w`` and phase ``theta`` (``dim`` each).

    ``forward(pos (...)) -> pos.shape + (2*dim,)`` or a ``(real, imag)`` pair (``output``).
    Initialisation: ``r = 1``, ``theta = 0`` and ``w`` the frequencies of Vaswani et al.
    (``temperature^(-2k/(2 dim))``), so training starts from the sinusoidal code (cos, then sin).
    """

    def __init__(self, dim: int, *, output: str = "concat", temperature: float = 10000.0) -> None:
        super().__init__()
        self.dim = _checks.positive_int("dim", dim)
        self.output = _checks.choice("output", output, OUTPUTS)
        self.amplitude = nn.Parameter(torch.ones(dim))  # (dim,)
        self.frequency = nn.Parameter(sinusoid_frequencies(2 * dim, temperature))  # (dim,)
        self.phase = nn.Parameter(torch.zeros(dim))  # (dim,)

    def forward(self, pos: torch.Tensor):
        return complex_order(pos, self.amplitude, self.frequency, self.phase, self.output)

    def extra_repr(self) -> str:
        return f"dim={self.dim}, output={self.output!r}"
