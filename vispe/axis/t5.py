"""T5 relative position bias (Raffel et al., JMLR 2020, "Exploring the Limits of Transfer
Learning with a Unified Text-to-Text Transformer").

One learned scalar per (bucket, head), added to the attention logits:

    logits_ij += b[head, bucket(j - i)]

with ``bucket`` = ``relative.t5_bucket`` (Mesh TensorFlow's ``_relative_position_bucket``): half
the buckets exact for small distances, the rest logarithmic up to ``max_distance``, everything
further sharing the last one; ``bidirectional=True`` (encoder) splits the buckets between
keys before and after the query, ``False`` (decoder) maps every future key to bucket 0.

``forward(q_pos (..., Nq), k_pos (..., Nk)) -> (..., H, Nq, Nk)``; fractional positions are
rounded to the nearest integer offset.
"""
from __future__ import annotations

import torch
from torch import nn

from vispe import _checks
from vispe.axis._util import heads_last_to_front, positions
from vispe.axis.relative import relative_offsets, t5_bucket


class T5RelativeBias(nn.Module):
    """Learned table ``(num_buckets, num_heads)`` read at T5's buckets of ``k_pos - q_pos``."""

    def __init__(self, num_heads: int, *, num_buckets: int = 32, max_distance: int = 128,
                 bidirectional: bool = True, init_std: float = 0.02) -> None:
        super().__init__()
        self.num_heads = _checks.positive_int("num_heads", num_heads)
        self.num_buckets = _checks.positive_int("num_buckets", num_buckets)
        self.max_distance = _checks.positive_int("max_distance", max_distance)
        self.bidirectional = bool(bidirectional)
        t5_bucket(torch.zeros(1), bidirectional=self.bidirectional, num_buckets=num_buckets,
                  max_distance=max_distance)  # validates the bucket settings now, not at first call
        self.weight = nn.Parameter(torch.randn(num_buckets, num_heads) * init_std)  # (buckets, H)

    def bucket(self, q_pos: torch.Tensor, k_pos: torch.Tensor) -> torch.Tensor:
        """Bucket of each (query, key) pair.  # (..., Nq, Nk) long"""
        positions("q_pos", q_pos)
        positions("k_pos", k_pos)
        return t5_bucket(relative_offsets(q_pos, k_pos), bidirectional=self.bidirectional,
                         num_buckets=self.num_buckets, max_distance=self.max_distance)

    def forward(self, q_pos: torch.Tensor, k_pos: torch.Tensor, *, dtype: torch.dtype | None = None) -> torch.Tensor:
        bias = heads_last_to_front(self.weight[self.bucket(q_pos, k_pos)])  # (..., H, Nq, Nk)
        return bias if dtype is None else bias.to(dtype)

    def extra_repr(self) -> str:
        return (f"num_heads={self.num_heads}, num_buckets={self.num_buckets}, "
                f"max_distance={self.max_distance}, bidirectional={self.bidirectional}")
