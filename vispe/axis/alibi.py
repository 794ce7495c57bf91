"""ALiBi, attention with linear biases (Press, Smith and Lewis, ICLR 2022, "Train Short, Test
Long: Attention with Linear Biases Enables Input Length Extrapolation").

A fixed per-head slope ``m_h`` times the distance is subtracted from the logits:

    symmetric (encoders):  bias_hij = -m_h |i - j|
    causal (decoders):     bias_hij = -m_h (i - j) for j <= i, -inf for j > i (the causal mask)

Slopes: for ``n`` heads a power of 2, the geometric sequence starting at and with ratio
``2^(-8/n)``: ``m_h = 2^(-8h/n)``, h = 1..n (8 heads: 1/2, 1/4, ..., 1/256). Otherwise, with
``c = 2^floor(log2 n)``, the ``c`` slopes for ``c`` heads followed by the first ``n - c`` of
every other slope for ``2c`` heads (the rule of the paper's reference code).

Positions may be fractional; the bias is computed in float32 (float64 if a position is float64)
and cast to ``dtype`` at the end. No parameters: the slopes are a non-persistent buffer.
``forward(q_pos (..., Nq), k_pos (..., Nk)) -> (..., H, Nq, Nk)``.
"""
from __future__ import annotations

import math

import torch
from torch import nn

from vispe import _checks
from vispe.axis._util import compute_dtype, positions, with_head_axis
from vispe.axis.relative import relative_offsets


def alibi_slopes(num_heads: int) -> torch.Tensor:
    """The paper's per-head slopes, float64 on CPU.  # (num_heads,)"""
    _checks.positive_int("num_heads", num_heads)

    def power_of_2(n: int) -> list[float]:
        start = 2.0 ** (-8.0 / n)
        return [start ** (h + 1) for h in range(n)]

    c = 2 ** int(math.floor(math.log2(num_heads)))
    slopes = power_of_2(c)
    if c != num_heads:
        slopes += alibi_slopes(2 * c).tolist()[0::2][: num_heads - c]
    return torch.tensor(slopes, dtype=torch.float64)


def alibi_bias(q_pos: torch.Tensor, k_pos: torch.Tensor, slopes: torch.Tensor, *,
               causal: bool = False) -> torch.Tensor:
    """``-m_h |i - j|`` (or the causal variant) for every head and pair.  # (..., H, Nq, Nk)"""
    positions("q_pos", q_pos)
    positions("k_pos", k_pos)
    if slopes.dim() != 1:
        raise ValueError(f"slopes has shape {tuple(slopes.shape)}: expected (num_heads,)")
    wd = compute_dtype(q_pos, k_pos)
    dist = -relative_offsets(q_pos.to(wd), k_pos.to(wd))  # (..., Nq, Nk), i - j
    m = slopes.to(device=dist.device, dtype=wd)[:, None, None]  # (H, 1, 1)
    if not causal:
        return -m * with_head_axis(dist.abs())  # (..., H, Nq, Nk)
    bias = -m * with_head_axis(dist)  # (..., H, Nq, Nk)
    return bias.masked_fill(with_head_axis(dist < 0), float("-inf"))


class AlibiBias(nn.Module):
    """ALiBi bias for ``num_heads`` heads; ``causal`` picks the decoder variant (with its mask)."""

    def __init__(self, num_heads: int, *, causal: bool = False) -> None:
        super().__init__()
        self.num_heads = _checks.positive_int("num_heads", num_heads)
        self.causal = bool(causal)
        self.register_buffer("slopes", alibi_slopes(num_heads).float(), persistent=False)  # (H,)

    def forward(self, q_pos: torch.Tensor, k_pos: torch.Tensor, *, dtype: torch.dtype | None = None) -> torch.Tensor:
        with torch.autocast(q_pos.device.type, enabled=False):
            slopes = alibi_slopes(self.num_heads) if q_pos.dtype == torch.float64 else self.slopes
            bias = alibi_bias(q_pos, k_pos, slopes, causal=self.causal)  # (..., H, Nq, Nk)
        return bias if dtype is None else bias.to(dtype)

    def extra_repr(self) -> str:
        return f"num_heads={self.num_heads}, causal={self.causal}"
