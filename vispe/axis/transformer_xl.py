"""Relative attention score of Transformer-XL (Dai et al., ACL 2019, "Transformer-XL: Attentive
Language Models Beyond a Fixed-Length Context"), also used by XLNet (Yang et al., 2019).

With ``q_i = W_q x_i`` and ``k_j = W_{k,E} x_j`` (the content projections, done by the caller),
``R`` the fixed sinusoidal code (``sinusoidal.sinusoidal``, layout ``[sin, cos]`` as in the
reference code) of the offset ``i - j`` (query minus key), a separate learned ``W_{k,R}`` and
learned per-head vectors ``u``, ``v``:

    A_ij = q_i^T k_j                 (a) content
         + q_i^T W_{k,R} R_{i-j}     (b) content-dependent position bias
         + u^T k_j                   (c) global content bias
         + v^T W_{k,R} R_{i-j}       (d) global position bias

``forward`` returns the unscaled ``A`` (the paper scales it by 1/sqrt(d) before the softmax);
``terms`` returns (a), (b), (c), (d) separately. ``R`` is computed once per distinct offset
(about Nq + Nk of them on a grid), never per pair. Fractional positions are allowed.

Shapes: q (B, H, Nq, d), k (B, H, Nk, d), positions (Nq,) / (Nk,) or (B, Nq) / (B, Nk);
every term broadcasts to (B, H, Nq, Nk) ((c) is (B, H, 1, Nk)).
"""
from __future__ import annotations

import torch
from torch import nn

from vispe import _checks
from vispe.axis._util import check_qk, with_head_axis
from vispe.axis.relative import relative_offsets
from vispe.axis.sinusoidal import LAYOUTS, sinusoidal


class TransformerXLRelative(nn.Module):
    """Learned ``W_{k,R}`` (rel_dim -> H*d, no bias), ``u`` and ``v`` (H, d); fixed sinusoidal R."""

    def __init__(self, num_heads: int, head_dim: int, *, rel_dim: int | None = None,
                 temperature: float = 10000.0, layout: str = "concat", init_std: float = 0.02) -> None:
        super().__init__()
        self.num_heads = _checks.positive_int("num_heads", num_heads)
        self.head_dim = _checks.positive_int("head_dim", head_dim)
        self.rel_dim = _checks.divisible("rel_dim", num_heads * head_dim if rel_dim is None else rel_dim, 2,
                                         "sin/cos pairs")
        self.temperature = _checks.positive_float("temperature", temperature)
        self.layout = _checks.choice("layout", layout, LAYOUTS)
        self.w_kr = nn.Linear(self.rel_dim, num_heads * head_dim, bias=False)
        self.u = nn.Parameter(torch.randn(num_heads, head_dim) * init_std)  # (H, d)
        self.v = nn.Parameter(torch.randn(num_heads, head_dim) * init_std)  # (H, d)

    def relative_keys(self, offsets: torch.Tensor):
        """``W_{k,R} R_delta`` for each distinct offset, and each pair's index into them.

        Returns ``(r (U, H, d), inverse (..., Nq, Nk))``.
        """
        uniq, inverse = torch.unique(offsets.detach(), return_inverse=True)  # (U,), (..., Nq, Nk)
        rel = sinusoidal(uniq, self.rel_dim, self.temperature, self.layout)  # (U, rel_dim)
        r = self.w_kr(rel.to(self.w_kr.weight.dtype))  # (U, H*d)
        return r.view(-1, self.num_heads, self.head_dim), inverse  # (U, H, d)

    def terms(self, q: torch.Tensor, k: torch.Tensor, q_pos: torch.Tensor, k_pos: torch.Tensor) -> dict:
        """The four terms ``{"a", "b", "c", "d"}`` of A_ij, each broadcasting to (B, H, Nq, Nk)."""
        check_qk(q, k, q_pos, k_pos, self.num_heads, self.head_dim)
        offsets = -relative_offsets(q_pos, k_pos)  # (..., Nq, Nk), i - j
        r, inverse = self.relative_keys(offsets)  # (U, H, d), (..., Nq, Nk)
        r = r.to(q.dtype)
        idx = with_head_axis(inverse)  # (..., 1, Nq, Nk)

        a = q @ k.transpose(-2, -1)  # (B, H, Nq, Nk)
        qr = torch.einsum("...hqd,uhd->...hqu", q, r)  # (B, H, Nq, U)
        lead = torch.broadcast_shapes(qr.shape[:-1], idx.shape[:-1])
        b = qr.expand(lead + qr.shape[-1:]).gather(-1, idx.expand(lead + idx.shape[-1:]))  # (B, H, Nq, Nk)
        c = torch.einsum("hd,...hkd->...hk", self.u.to(k.dtype), k)[..., None, :]  # (B, H, 1, Nk)
        vr = torch.einsum("hd,uhd->hu", self.v.to(q.dtype), r)  # (H, U)
        d = vr[:, inverse].movedim(0, -3)  # (..., H, Nq, Nk)
        return {"a": a, "b": b, "c": c, "d": d}

    def forward(self, q: torch.Tensor, k: torch.Tensor, q_pos: torch.Tensor, k_pos: torch.Tensor) -> torch.Tensor:
        t = self.terms(q, k, q_pos, k_pos)
        return t["a"] + t["b"] + t["c"] + t["d"]  # (B, H, Nq, Nk), unscaled

    def extra_repr(self) -> str:
        return f"num_heads={self.num_heads}, head_dim={self.head_dim}, rel_dim={self.rel_dim}"
