"""Disentangled attention of DeBERTa (He, Liu, Gao and Chen, ICLR 2021, "DeBERTa: Decoding-enhanced
BERT with Disentangled Attention").

Content and relative position are kept apart. With a learned table ``P`` of ``2k`` relative
embeddings, its projections ``Q^r = P W_{q,r}``, ``K^r = P W_{k,r}`` and the clipped distance

    delta(i, j) = 0         if i - j <= -k
                = 2k - 1    if i - j >= k
                = i - j + k otherwise            (an index in [0, 2k))

the logits are

    A_ij = q^c_i . k^c_j                      content-to-content (c2c)
         + q^c_i . k^r_{delta(i, j)}          content-to-position (c2p)
         + k^c_j . q^r_{delta(i, j)}          position-to-content (p2c), p2c_convention="code"
         (+ k^c_j . q^r_{delta(j, i)}          p2c_convention="paper")

The position-to-content index has two conventions. The paper (Eq. 4) writes delta(j, i). The
original code (microsoft/DeBERTa ``disentangled_att_bias``) and HF transformers (``DebertaModel``,
``DebertaV2Model``) index it with ``clamp(-(i - j) + k)`` on the key's rows and then transpose,
i.e. delta(i, j): the same relative embedding as c2p, read from the key's side. Pretrained DeBERTa
weights were trained with the code's, so ``p2c_convention="code"`` is the default; "paper" is the
formula as printed (the two differ unless the table is symmetric: delta(j, i) = 2k - delta(i, j)
inside the clipping window).

scaled by ``1 / sqrt(3 d)`` (``1 / sqrt((1 + number of position terms) d)`` when a term is left
out, as in the reference code). ``q^c``, ``k^c`` are the content projections (done by the caller).
Both position terms are a (N, 2k) product gathered at delta: no (N, N, d) tensor is made.
Fractional positions are rounded to the nearest integer offset.

Shapes: q, k (B, H, Nq|Nk, d), positions (Nq,) / (Nk,) or (B, Nq) / (B, Nk) -> (B, H, Nq, Nk).
"""
from __future__ import annotations

import math

import torch
from torch import nn

from vispe import _checks
from vispe.axis._util import check_qk, with_head_axis
from vispe.axis.relative import relative_offsets

POSITION_TERMS = ("c2p", "p2c")
P2C_CONVENTIONS = ("code", "paper")


def deberta_delta(q_pos: torch.Tensor, k_pos: torch.Tensor, max_distance: int) -> torch.Tensor:
    """``delta(i, j) = clip(i - j + k, 0, 2k - 1)`` for query i, key j.  # (..., Nq, Nk) long"""
    _checks.positive_int("max_distance", max_distance)
    diff = -relative_offsets(q_pos, k_pos)  # (..., Nq, Nk), i - j
    diff = diff.round().long() if diff.is_floating_point() else diff.long()
    return (diff + max_distance).clamp(0, 2 * max_distance - 1)


def _gather_pairs(scores: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """``scores (B, H, N, R)`` read at ``index (..., N, M)`` along R.  # (B, H, N, M)"""
    idx = with_head_axis(index)  # (..., 1, N, M)
    lead = torch.broadcast_shapes(scores.shape[:-1], idx.shape[:-1])
    return scores.expand(lead + scores.shape[-1:]).gather(-1, idx.expand(lead + idx.shape[-1:]))


class DebertaRelative(nn.Module):
    """Learned relative table ``P`` (2k, embed_dim) and projections ``W_{q,r}``, ``W_{k,r}``.

    ``forward(q, k, q_pos, k_pos)`` gives the scaled logits; ``terms`` the unscaled c2c, c2p and
    p2c. ``position_terms`` chooses which position terms are used (both, as in the paper).
    ``p2c_convention``: "code" (default; original code, HF transformers, pretrained weights) or
    "paper" (module docstring).
    """

    def __init__(self, num_heads: int, head_dim: int, max_distance: int, *, embed_dim: int | None = None,
                 position_terms: tuple[str, ...] = POSITION_TERMS, p2c_convention: str = "code",
                 init_std: float = 0.02) -> None:
        super().__init__()
        self.num_heads = _checks.positive_int("num_heads", num_heads)
        self.head_dim = _checks.positive_int("head_dim", head_dim)
        self.max_distance = _checks.positive_int("max_distance", max_distance)
        self.embed_dim = _checks.positive_int("embed_dim", num_heads * head_dim if embed_dim is None else embed_dim)
        position_terms = tuple(position_terms)
        for t in position_terms:
            _checks.choice("position_terms", t, POSITION_TERMS)
        if not position_terms or len(set(position_terms)) != len(position_terms):
            raise ValueError(f"position_terms={position_terms!r}: expected one or both of 'c2p', 'p2c', once each")
        self.position_terms = position_terms
        self.p2c_convention = _checks.choice("p2c_convention", p2c_convention, P2C_CONVENTIONS)
        self.rel_embed = nn.Parameter(torch.randn(2 * max_distance, self.embed_dim) * init_std)  # (2k, D)
        self.w_qr = nn.Linear(self.embed_dim, num_heads * head_dim) if "p2c" in position_terms else None
        self.w_kr = nn.Linear(self.embed_dim, num_heads * head_dim) if "c2p" in position_terms else None

    @property
    def scale(self) -> float:
        """``1 / sqrt((1 + len(position_terms)) d)``: 1/sqrt(3d) with both terms."""
        return 1.0 / math.sqrt((1 + len(self.position_terms)) * self.head_dim)

    def _project(self, w: nn.Linear, dtype) -> torch.Tensor:
        return w(self.rel_embed).view(-1, self.num_heads, self.head_dim).to(dtype)  # (2k, H, d)

    def terms(self, q: torch.Tensor, k: torch.Tensor, q_pos: torch.Tensor, k_pos: torch.Tensor) -> dict:
        """``{"c2c", "c2p", "p2c"}`` (unscaled, the chosen ones), each (B, H, Nq, Nk)."""
        check_qk(q, k, q_pos, k_pos, self.num_heads, self.head_dim)
        out = {"c2c": q @ k.transpose(-2, -1)}  # (B, H, Nq, Nk)
        delta = deberta_delta(q_pos, k_pos, self.max_distance)  # (..., Nq, Nk), delta(i, j)
        if self.w_kr is not None:
            kr = self._project(self.w_kr, q.dtype)  # (2k, H, d)
            c2p = torch.einsum("...hqd,rhd->...hqr", q, kr)  # (B, H, Nq, 2k)
            out["c2p"] = _gather_pairs(c2p, delta)  # (B, H, Nq, Nk)
        if self.w_qr is not None:
            qr = self._project(self.w_qr, k.dtype)  # (2k, H, d)
            p2c = torch.einsum("...hkd,rhd->...hkr", k, qr)  # (B, H, Nk, 2k)
            if self.p2c_convention == "paper":
                index = deberta_delta(k_pos, q_pos, self.max_distance)  # (..., Nk, Nq), delta(j, i)
            else:
                index = delta.transpose(-2, -1)  # (..., Nk, Nq), delta(i, j) seen from key j
            out["p2c"] = _gather_pairs(p2c, index).transpose(-2, -1)  # (B, H, Nq, Nk)
        return out

    def forward(self, q: torch.Tensor, k: torch.Tensor, q_pos: torch.Tensor, k_pos: torch.Tensor) -> torch.Tensor:
        return sum(self.terms(q, k, q_pos, k_pos).values()) * self.scale  # (B, H, Nq, Nk)

    def extra_repr(self) -> str:
        return (f"num_heads={self.num_heads}, head_dim={self.head_dim}, max_distance={self.max_distance}, "
                f"position_terms={self.position_terms}, p2c_convention={self.p2c_convention!r}")
