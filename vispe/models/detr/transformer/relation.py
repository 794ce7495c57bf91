"""Box-to-box position relation in decoder self-attention (Relation-DETR: Hou et al., ECCV 2024,
"Relation DETR: Exploring Explicit Position Relation Prior for Object Detection"; xiuqhou/Relation-DETR
``box_rel_encoding`` and ``PositionRelationEmbedding``).

For the boxes ``b_i`` (src, one per query) and ``b'_j`` (tgt), (cx, cy, w, h) in unit coordinates::

    e_ij = [log(|cx_i - cx'_j| / (w_i + eps) + 1), log(|cy_i - cy'_j| / (h_i + eps) + 1),
            log((w_i + eps) / (w'_j + eps)),        log((h_i + eps) / (h'_j + eps))]       eps = 1e-5
    S(e) = per component k of 4 and frequency f of F/2: [sin(e_k s / T^(2f/F)), cos(e_k s / T^(2f/F))]
    B[h, i, j] = ReLU(W S(e_ij) + b)[h]          W: (heads, 4F), a 1x1 convolution in the reference

with ``F`` = ``num_feats`` features per component (16), ``T`` = ``temperature`` (10000), ``s`` =
``scale`` (100). ``B`` is added to the logits of the next decoder layer's self-attention (query i
attending to query j). The encoding carries no gradient (the reference computes it under
``no_grad``); the projection learns. Every component is a ratio of box sizes or an offset over a
box size, so boxes moved together give the same bias, and boxes in unit coordinates of each image's
valid area make it independent of the padding around the image.

Which boxes (the reference's decoder loop): before decoder layer i (i >= 1) the relation is between
the boxes predicted after layer i - 2 (the anchors before layer 0 for i = 1) as ``src`` and those
predicted after layer i - 1 as ``tgt``; layer 0 gets no bias. The weights keep PyTorch's default
initialisation, as the reference's (its decoder's ``init_weights`` leaves the module alone).
"""
from __future__ import annotations

import torch
from torch import nn

from vispe import _checks


def box_relation(src: torch.Tensor, tgt: torch.Tensor, eps: float = 1e-5) -> torch.Tensor:
    """``e_ij`` of the module docstring for boxes ``src`` (B, N, 4) and ``tgt`` (B, M, 4) (cx, cy, w, h).  # (B, N, M, 4)"""
    xy1, wh1 = src.split(2, -1)  # (B, N, 2) each
    xy2, wh2 = tgt.split(2, -1)  # (B, M, 2) each
    offset = torch.log((xy1[:, :, None] - xy2[:, None]).abs() / (wh1[:, :, None] + eps) + 1.0)  # (B, N, M, 2)
    size = torch.log((wh1[:, :, None] + eps) / (wh2[:, None] + eps))  # (B, N, M, 2)
    return torch.cat([offset, size], -1)  # (B, N, M, 4)


def sine_features(e: torch.Tensor, num_feats: int, temperature: float, scale: float) -> torch.Tensor:
    """Each of the last dimension's values through F/2 (sin, cos) pairs, pairs interleaved.  # (..., K * F)"""
    k = torch.arange(num_feats // 2, dtype=torch.float32, device=e.device)  # (F/2,)
    freq = temperature ** (2 * k / num_feats)  # (F/2,)
    a = e.float()[..., None] * scale / freq  # (..., K, F/2)
    return torch.stack([a.sin(), a.cos()], -1).flatten(-3)  # (..., K * F)


class PositionRelation(nn.Module):
    """``forward(src, tgt) -> (B, heads, N, M)`` logit bias from boxes (module docstring)."""

    def __init__(self, num_heads: int, *, num_feats: int = 16, temperature: float = 10000.0,
                 scale: float = 100.0) -> None:
        super().__init__()
        self.num_heads = _checks.positive_int("num_heads", num_heads)
        self.num_feats = _checks.divisible("num_feats", num_feats, 2, "sin/cos pairs")
        self.temperature = _checks.positive_float("temperature", temperature)
        self.scale = _checks.positive_float("scale", scale)
        self.proj = nn.Linear(4 * num_feats, num_heads)  # the reference's 1x1 Conv2d (same weights, same init)

    def forward(self, src: torch.Tensor, tgt: torch.Tensor) -> torch.Tensor:  # (B, heads, N, M)
        for name, b in (("src", src), ("tgt", tgt)):
            if b.dim() != 3 or b.shape[-1] != 4:
                raise ValueError(f"{name} has shape {tuple(b.shape)}: expected (B, N, 4) boxes (cx, cy, w, h)")
        with torch.no_grad():
            feats = sine_features(box_relation(src.float(), tgt.float()), self.num_feats, self.temperature,
                                  self.scale)  # (B, N, M, 4F)
        bias = torch.relu(self.proj(feats.to(self.proj.weight.dtype)))  # (B, N, M, heads)
        return bias.permute(0, 3, 1, 2)  # (B, heads, N, M)

    def extra_repr(self) -> str:
        return (f"num_heads={self.num_heads}, num_feats={self.num_feats}, temperature={self.temperature:g}, "
                f"scale={self.scale:g}")

