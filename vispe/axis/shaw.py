"""Relative position representations with key and value terms (Shaw, Uszkoreit and Vaswani,
NAACL 2018, "Self-Attention with Relative Position Representations").

Learned tables ``a^K``, ``a^V`` of ``2k + 1`` vectors, indexed by the clipped offset
``idx_ij = clip(j - i, -k, k) + k`` (``relative.clipped_index``):

    e_ij = q_i . (k_j + a^K_{idx_ij}) / sqrt(d)          key term  q_i . a^K_{idx_ij}
    z_i  = sum_j alpha_ij (v_j + a^V_{idx_ij})             value term  sum_j alpha_ij a^V_{idx_ij}

The paper shares the tables across heads; ``num_heads`` gives one table per head instead.
Both terms are computed without materialising (Nq, Nk, d) tensors: the key term as ``q a^K^T``
(Nq, 2k+1) gathered at ``idx``, the value term as the attention summed per bucket (Nq, 2k+1)
times ``a^V``. Positions may be fractional: offsets are rounded before clipping.

Shapes: q, k (B, H, Nq|Nk, d), v (B, H, Nk, dv), positions (Nq,) / (Nk,) or (B, Nq) / (B, Nk);
tables (2k+1, d) shared or (H, 2k+1, d) per head.
"""
from __future__ import annotations

import math

import torch
from torch import nn

from vispe import _checks
from vispe.axis._util import positions, with_head_axis
from vispe.axis.relative import clipped_index, relative_offsets


def _check_table(name: str, table: torch.Tensor, entries: int | None, dim: int, heads: int) -> None:
    r = table.shape[-2] if entries is None else entries
    ok = table.dim() in (2, 3) and tuple(table.shape[-2:]) == (r, dim) and (table.dim() == 2 or table.shape[0] == heads)
    if not ok:
        raise ValueError(f"{name} has shape {tuple(table.shape)}: expected ({r}, {dim}) shared or "
                         f"({heads}, {r}, {dim}) per head (2 * max_distance + 1 entries)")


def _per_bucket(table: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """``x (..., H, N, d) . table (R, d) or (H, R, d)`` -> (..., H, N, R)."""
    if table.dim() == 2:
        return x @ table.to(x.dtype).t()
    return torch.einsum("...hnd,hrd->...hnr", x, table.to(x.dtype))


def shaw_index(q_pos: torch.Tensor, k_pos: torch.Tensor, max_distance: int) -> torch.Tensor:
    """``clip(j - i, -k, k) + k`` for every (query i, key j) pair.  # (..., Nq, Nk) long"""
    return clipped_index(relative_offsets(q_pos, k_pos), max_distance)


def shaw_key_term(q: torch.Tensor, table_k: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """``q_i . a^K_{index_ij}``, added to the logits q_i . k_j (before scaling).  # (B, H, Nq, Nk)"""
    _check_table("table_k", table_k, None, q.shape[-1], q.shape[-3])
    s = _per_bucket(table_k, q)  # (B, H, Nq, R)
    idx = with_head_axis(index)  # (..., 1, Nq, Nk)
    lead = torch.broadcast_shapes(s.shape[:-1], idx.shape[:-1])
    return s.expand(lead + s.shape[-1:]).gather(-1, idx.expand(lead + idx.shape[-1:]))  # (B, H, Nq, Nk)


def shaw_value_term(attn: torch.Tensor, table_v: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """``sum_j attn_ij a^V_{index_ij}``, added to the output attn @ v.  # (B, H, Nq, dv)"""
    _check_table("table_v", table_v, None, table_v.shape[-1], attn.shape[-3])
    idx = with_head_axis(index)  # (..., 1, Nq, Nk)
    lead = torch.broadcast_shapes(attn.shape[:-1], idx.shape[:-1])
    per_bucket = attn.new_zeros(lead + (table_v.shape[-2],)).scatter_add(
        -1, idx.expand(lead + idx.shape[-1:]), attn.expand(lead + attn.shape[-1:]))  # (B, H, Nq, R)
    if table_v.dim() == 2:
        return per_bucket @ table_v.to(attn.dtype)  # (B, H, Nq, dv)
    return torch.einsum("...hqr,hrd->...hqd", per_bucket, table_v.to(attn.dtype))  # (B, H, Nq, dv)


def shaw_logits(q, k, q_pos, k_pos, table_k, max_distance: int, *, scale: float | None = None):
    """``(q_i . k_j + q_i . a^K_ij) * scale`` (scale 1/sqrt(d) by default).  # (B, H, Nq, Nk)"""
    _check_qk(q, k, q_pos, k_pos)
    index = shaw_index(q_pos, k_pos, max_distance)  # (..., Nq, Nk)
    logits = q @ k.transpose(-2, -1)  # (B, H, Nq, Nk)
    if table_k is not None:
        _check_table("table_k", table_k, 2 * max_distance + 1, q.shape[-1], q.shape[-3])
        logits = logits + shaw_key_term(q, table_k, index)
    return logits * (scale if scale is not None else 1.0 / math.sqrt(q.shape[-1]))


def shaw_attention(q, k, v, q_pos, k_pos, table_k, table_v, max_distance: int, *,
                   scale: float | None = None) -> torch.Tensor:
    """Reference attention of Shaw et al.: softmax of ``shaw_logits``, then ``attn v`` plus the
    value term. ``table_k`` / ``table_v`` may be None (that term is left out).  # (B, H, Nq, dv)"""
    if v.shape[-2] != k.shape[-2]:
        raise ValueError(f"v has shape {tuple(v.shape)}: expected {k.shape[-2]} keys like k {tuple(k.shape)}")
    attn = shaw_logits(q, k, q_pos, k_pos, table_k, max_distance, scale=scale).softmax(-1)  # (B, H, Nq, Nk)
    out = attn @ v  # (B, H, Nq, dv)
    if table_v is not None:
        _check_table("table_v", table_v, 2 * max_distance + 1, v.shape[-1], q.shape[-3])
        out = out + shaw_value_term(attn, table_v, shaw_index(q_pos, k_pos, max_distance))
    return out


def _check_qk(q, k, q_pos, k_pos) -> None:
    if q.dim() < 3 or k.dim() != q.dim() or k.shape[-1] != q.shape[-1]:
        raise ValueError(f"k has shape {tuple(k.shape)}: expected (..., H, Nk, {q.shape[-1]}) like q {tuple(q.shape)}")
    positions("q_pos", q_pos, q.shape[-2])
    positions("k_pos", k_pos, k.shape[-2])


class ShawRelative(nn.Module):
    """Shaw et al.'s learned tables ``a^K`` (2k+1, d) and ``a^V`` (2k+1, dv), shared across heads
    (``num_heads=None``, the paper) or one per head (``num_heads=H``: (H, 2k+1, d)).

    ``forward(q, k, v, q_pos, k_pos)`` is the full attention (B, H, Nq, dv); ``logits``,
    ``key_term`` and ``value_term`` expose its parts. ``use_key`` / ``use_value`` drop a term
    (and its table).
    """

    def __init__(self, head_dim: int, max_distance: int, *, num_heads: int | None = None,
                 value_dim: int | None = None, use_key: bool = True, use_value: bool = True,
                 init_std: float = 0.02) -> None:
        super().__init__()
        self.head_dim = _checks.positive_int("head_dim", head_dim)
        self.max_distance = _checks.positive_int("max_distance", max_distance)
        self.num_heads = None if num_heads is None else _checks.positive_int("num_heads", num_heads)
        self.value_dim = head_dim if value_dim is None else _checks.positive_int("value_dim", value_dim)
        if not (use_key or use_value):
            raise ValueError("use_key=False and use_value=False: expected at least one term")
        lead = () if num_heads is None else (num_heads,)
        r = 2 * max_distance + 1
        self.table_k = nn.Parameter(torch.randn(lead + (r, head_dim)) * init_std) if use_key else None
        self.table_v = nn.Parameter(torch.randn(lead + (r, self.value_dim)) * init_std) if use_value else None

    def index(self, q_pos: torch.Tensor, k_pos: torch.Tensor) -> torch.Tensor:
        return shaw_index(q_pos, k_pos, self.max_distance)  # (..., Nq, Nk)

    def key_term(self, q: torch.Tensor, q_pos: torch.Tensor, k_pos: torch.Tensor) -> torch.Tensor:
        if self.table_k is None:
            raise ValueError("use_key=False: this module has no key table")
        positions("q_pos", q_pos, q.shape[-2])
        return shaw_key_term(q, self.table_k, self.index(q_pos, k_pos))  # (B, H, Nq, Nk)

    def value_term(self, attn: torch.Tensor, q_pos: torch.Tensor, k_pos: torch.Tensor) -> torch.Tensor:
        if self.table_v is None:
            raise ValueError("use_value=False: this module has no value table")
        positions("k_pos", k_pos, attn.shape[-1])
        return shaw_value_term(attn, self.table_v, self.index(q_pos, k_pos))  # (B, H, Nq, dv)

    def logits(self, q, k, q_pos, k_pos, *, scale: float | None = None) -> torch.Tensor:
        return shaw_logits(q, k, q_pos, k_pos, self.table_k, self.max_distance, scale=scale)

    def forward(self, q, k, v, q_pos, k_pos, *, scale: float | None = None) -> torch.Tensor:
        return shaw_attention(q, k, v, q_pos, k_pos, self.table_k, self.table_v, self.max_distance,
                              scale=scale)  # (B, H, Nq, dv)

    def extra_repr(self) -> str:
        heads = "shared" if self.num_heads is None else f"num_heads={self.num_heads}"
        return f"head_dim={self.head_dim}, max_distance={self.max_distance}, {heads}"
