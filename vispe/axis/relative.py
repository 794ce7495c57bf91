"""Relative 1D positions: offsets, Shaw's clipping and T5's buckets (pure index functions).

The score modules built on these (Shaw K/V terms, Transformer-XL, DeBERTa, ALiBi) live in their
own files of ``vispe.axis``.
"""
from __future__ import annotations

import math

import torch

from vispe import _checks


def relative_offsets(q_pos: torch.Tensor, k_pos: torch.Tensor) -> torch.Tensor:
    """``out[..., i, j] = k_pos[j] - q_pos[i]`` (key minus query).  # (..., Nq, Nk)

    ``q_pos`` (..., Nq) and ``k_pos`` (..., Nk): leading dimensions broadcast.
    """
    for name, p in (("q_pos", q_pos), ("k_pos", k_pos)):
        if not isinstance(p, torch.Tensor) or p.dim() == 0:
            raise ValueError(f"{name}={p!r}: expected a tensor of positions (..., N)")
    try:
        torch.broadcast_shapes(q_pos.shape[:-1], k_pos.shape[:-1])
    except RuntimeError:
        raise ValueError(f"k_pos has shape {tuple(k_pos.shape)} and q_pos {tuple(q_pos.shape)}: expected "
                         "leading dimensions that broadcast") from None
    return k_pos[..., None, :] - q_pos[..., :, None]


def clipped_index(offsets: torch.Tensor, max_distance: int) -> torch.Tensor:
    """Shaw et al. (2018): ``clip(j - i, -k, k) + k``, an index into a (2k + 1)-entry table.

    Fractional offsets are rounded to the nearest integer first (the table is discrete).
    """
    _checks.positive_int("max_distance", max_distance)
    offsets = offsets.round().long() if offsets.is_floating_point() else offsets.long()  # (ONNX rounds floats only)
    return offsets.clamp(-max_distance, max_distance) + max_distance


def t5_bucket(offsets: torch.Tensor, *, bidirectional: bool = True, num_buckets: int = 32,
              max_distance: int = 128) -> torch.Tensor:
    """T5's relative position buckets (Raffel et al., 2020), as in Mesh TensorFlow / HF T5.

    ``offsets`` are key minus query (``memory_position - query_position``). Half the buckets (all
    of them if unidirectional) are exact for small distances, the rest logarithmic up to
    ``max_distance``; larger distances share the last bucket. Bidirectional: positive offsets use
    the upper half of the buckets. Unidirectional: positive offsets (the future) map to bucket 0.
    Fractional offsets are rounded to the nearest integer first. ``max_distance`` must exceed the
    number of exact buckets (``num_buckets // 4`` bidirectional, ``// 2`` unidirectional).
    """
    _checks.positive_int("num_buckets", num_buckets)
    _checks.positive_int("max_distance", max_distance)
    if num_buckets < (4 if bidirectional else 2):
        raise ValueError(f"num_buckets={num_buckets}: expected at least {4 if bidirectional else 2}")
    exact = num_buckets // 4 if bidirectional else num_buckets // 2
    if max_distance <= exact:
        raise ValueError(f"max_distance={max_distance}: expected more than the {exact} exact buckets "
                         f"(num_buckets={num_buckets}, bidirectional={bidirectional})")
    rel = offsets.round().long() if offsets.is_floating_point() else offsets.long()
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
