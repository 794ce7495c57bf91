"""Relative 1D positions: offsets, Shaw's clipping and T5's buckets (pure index functions).

The score modules built on these (Shaw K/V terms, Transformer-XL, DeBERTa, ALiBi) live in their
own files of ``vispe.axis``.
"""
from __future__ import annotations

import math

import torch

from vispe import _checks


def relative_offsets(q_pos: torch.Tensor, k_pos: torch.Tensor) -> torch.Tensor:
    """``out[..., i, j] = k_pos[j] - q_pos[i]`` (key minus query).  # (..., Nq, Nk)"""
    return k_pos[..., None, :] - q_pos[..., :, None]


def clipped_index(offsets: torch.Tensor, max_distance: int) -> torch.Tensor:
    """Shaw et al. (2018): ``clip(j - i, -k, k) + k``, an index into a (2k + 1)-entry table."""
    _checks.positive_int("max_distance", max_distance)
    return offsets.round().long().clamp(-max_distance, max_distance) + max_distance


def t5_bucket(offsets: torch.Tensor, *, bidirectional: bool = True, num_buckets: int = 32,
              max_distance: int = 128) -> torch.Tensor:
    """T5's relative position buckets (Raffel et al., 2020), as in Mesh TensorFlow / HF T5.

    ``offsets`` are key minus query (``memory_position - query_position``). Half the buckets (all
    of them if unidirectional) are exact for small distances, the rest logarithmic up to
    ``max_distance``; larger distances share the last bucket. Bidirectional: positive offsets use
    the upper half of the buckets. Unidirectional: positive offsets (the future) map to bucket 0.
    """
    _checks.positive_int("num_buckets", num_buckets)
    _checks.positive_int("max_distance", max_distance)
    if num_buckets < (4 if bidirectional else 2):
        raise ValueError(f"num_buckets={num_buckets}: expected at least {4 if bidirectional else 2}")
    rel = offsets.long()
    ret = torch.zeros_like(rel)
    n = num_buckets
    if bidirectional:
        n //= 2
        ret = ret + (rel > 0).long() * n
        rel = rel.abs()
    else:
        rel = (-rel).clamp(min=0)
    max_exact = n // 2
    is_small = rel < max_exact
    large = max_exact + (
        torch.log(rel.float().clamp(min=1) / max_exact) / math.log(max_distance / max_exact) * (n - max_exact)
    ).long()
    large = large.clamp(max=n - 1)
    return ret + torch.where(is_small, rel, large)
