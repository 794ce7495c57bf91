"""RT-DETR's query selection (Zhao et al., CVPR 2024, section 4.3): the top-k encoder tokens become the queries.

Every token of every decoder level proposes a box: an anchor centred on its cell, side ``0.05 * 2^l``
on level l, in unit coordinates of the whole map, as logits (inverse sigmoid), DETR's (cx, cy, w, h);
an anchor with a coordinate within 0.01 of 0 or 1 is invalid (its memory row is zeroed, its logit set
to the largest float), as transformers' ``RTDetrModel.generate_anchors``. Then::

    m = enc_output(memory * valid)                     Linear + LayerNorm          # (B, N, d)
    scores = enc_score_head(m)                         per-class logits            # (B, N, K)
    boxes = enc_bbox_head(m) + anchors                 box logits                  # (B, N, 4)
    top-k tokens by max-class score -> reference box logits, content = m (detached) or a learned query

The paper trains ``enc_score_head`` with an IoU-aware target (VFL: the score of the matched class is
pulled to the box's IoU), which is what makes "top-k by score" select well-localised boxes: the
selection itself is the plain top-k above.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn
from torch.types import Device

from vispe.kernels.deformable import Levels
from vispe.models.detr.mlp import MLP


def anchors(levels: Levels, *, grid_size: float = 0.05, eps: float = 1e-2, device: Device = None,
            dtype: torch.dtype = torch.float32) -> tuple[torch.Tensor, torch.Tensor]:
    """(anchor logits (1, N, 4) as (cx, cy, w, h), largest float where invalid; valid (1, N, 1) bool)."""
    out = []
    for l, (h, w) in enumerate(levels.shapes):
        iy, ix = torch.meshgrid(torch.arange(h, device=device, dtype=dtype), torch.arange(w, device=device, dtype=dtype),
                                indexing="ij")
        cx, cy = (ix.flatten() + 0.5) / w, (iy.flatten() + 0.5) / h  # (h*w,)
        side = torch.full_like(cx, grid_size * 2.0 ** l)
        out.append(torch.stack([cx, cy, side, side], -1))  # (h*w, 4)
    a = torch.cat(out)[None]  # (1, N, 4)
    valid = ((a > eps) & (a < 1 - eps)).all(-1, keepdim=True)  # (1, N, 1)
    logits = torch.log(a / (1 - a))
    big = torch.full((), torch.finfo(dtype).max, dtype=dtype, device=device)
    return torch.where(valid, logits, big), valid


@dataclass
class Selected:
    content: torch.Tensor  # (B, Q, d) the decoder's first queries
    box_logits: torch.Tensor  # (B, Q, 4) reference boxes as logits (cx, cy, w, h), detached
    enc_logits: torch.Tensor  # (B, Q, K) the selected tokens' class logits (the encoder's loss)
    enc_boxes: torch.Tensor  # (B, Q, 4) their boxes, sigmoid (the encoder's loss; not detached)


class QuerySelection(nn.Module):
    """``enc_output``, ``enc_score_head``, ``enc_bbox_head`` and the top-k (module docstring); transformers' names."""

    def __init__(self, d_model: int, num_classes: int, num_queries: int, *, learn_initial_query: bool = False,
                 eps: float = 1e-5) -> None:
        super().__init__()
        self.num_queries = num_queries
        self.enc_output = nn.Sequential(nn.Linear(d_model, d_model), nn.LayerNorm(d_model, eps=eps))
        self.enc_score_head = nn.Linear(d_model, num_classes)
        self.enc_bbox_head = MLP(d_model, d_model, 4, 3)
        self.weight_embedding = nn.Embedding(num_queries, d_model) if learn_initial_query else None

    def forward(self, memory: torch.Tensor, levels: Levels) -> Selected:
        """``memory`` (B, N, d) of the decoder's ``levels``."""
        B, N, _ = memory.shape
        if N < self.num_queries:
            raise ValueError(f"{N} encoder tokens at levels {list(levels.shapes)}: fewer than num_queries="
                             f"{self.num_queries}; use a larger image or fewer queries")
        anc, valid = anchors(levels, device=memory.device, dtype=memory.dtype)
        m = self.enc_output(valid.to(memory.dtype) * memory)  # (B, N, d)
        scores = self.enc_score_head(m)  # (B, N, K)
        box_logits = self.enc_bbox_head(m) + anc  # (B, N, 4)
        top = scores.max(-1).values.topk(self.num_queries, dim=1).indices  # (B, Q)
        pick = lambda t: t.gather(1, top[..., None].expand(-1, -1, t.shape[-1]))  # noqa: E731
        ref = pick(box_logits)  # (B, Q, 4)
        if self.weight_embedding is not None:
            content = self.weight_embedding.weight[None].expand(B, -1, -1)  # (B, Q, d)
        else:
            content = pick(m).detach()
        return Selected(content, ref.detach(), pick(scores), ref.sigmoid())
