"""Group-DETR two-stage queries of LW-DETR and RF-DETR (Chen et al., ICCV 2023, "Group DETR"; the
two-stage selection of Deformable DETR / DINO).

``groups`` groups of ``num_queries`` queries each in training, one group at inference. Per group g::

    memory tokens (padded / border ones zeroed, ``encoder_proposals``) -> enc_output[g] (Linear) -> enc_output_norm[g]
      -> class: enc_out_class_embed[g] (-inf where there is no proposal);  box: refine(proposal, enc_out_bbox_embed[g])
      -> the num_queries tokens of highest class score: their boxes (detached) and features
    reference boxes = refine(top-k boxes, reference_point_embed of the group)      (B, G*Q, 4) (cx, cy, w, h)
    content = query_feat of the group                                            (B, G*Q, d)

The group's top-k boxes (not detached) and their class logits are the two-stage ("enc_outputs")
predictions. In training the decoder's self-attention is block-diagonal over the groups
(``group_mask``): G weight-sharing decoders in one pass, more one-to-one supervision per image.
Parameter names are transformers' (``LwDetrModel``).
"""
from __future__ import annotations

import torch
from torch import nn

from vispe import _checks
from vispe.kernels.deformable import Levels
from vispe.models.detr.mlp import MLP
from vispe.models.detr.transformer.deformable_decoder import encoder_proposals
from vispe.models.detr.vitdet.decoder import refine


def group_mask(groups: int, num_queries: int, device: torch.device | None = None) -> torch.Tensor:
    """Block-diagonal self-attention mask of ``groups`` groups, True = may attend.  # (G*Q, G*Q)"""
    g = torch.arange(groups * num_queries, device=device) // num_queries
    return g[:, None] == g[None, :]


class GroupTwoStageQueries(nn.Module):
    """The queries (module docstring). ``forward(memory, key_padding_mask, levels)`` ->
    (content (B, G*Q, d), reference boxes (B, G*Q, 4), two-stage logits (B, G*Q, K), boxes (B, G*Q, 4))
    with G = ``groups`` in training and 1 in eval."""

    def __init__(self, d_model: int, num_queries: int, num_classes: int, groups: int = 13) -> None:
        super().__init__()
        self.num_queries = _checks.positive_int("num_queries", num_queries)
        self.groups = _checks.positive_int("groups", groups)
        self.reference_point_embed = nn.Embedding(num_queries * groups, 4)
        self.query_feat = nn.Embedding(num_queries * groups, d_model)
        self.enc_output = nn.ModuleList(nn.Linear(d_model, d_model) for _ in range(groups))
        self.enc_output_norm = nn.ModuleList(nn.LayerNorm(d_model) for _ in range(groups))
        self.enc_out_class_embed = nn.ModuleList(nn.Linear(d_model, num_classes) for _ in range(groups))
        self.enc_out_bbox_embed = nn.ModuleList(MLP(d_model, d_model, 4, 3) for _ in range(groups))

    def active_groups(self) -> int:
        return self.groups if self.training else 1

    def forward(self, memory: torch.Tensor, key_padding_mask: torch.Tensor | None,
                levels: Levels) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        B, N, d = memory.shape
        Q = self.num_queries
        if N < Q:
            raise ValueError(f"memory has {N} tokens: expected at least num_queries={Q} to select from "
                             "(a larger image or fewer queries)")
        zeroed, logits = encoder_proposals(memory, key_padding_mask, levels)  # (B, N, d), (B, N, 4)
        invalid = torch.isinf(logits[..., :1])  # (B, N, 1)
        props = logits.sigmoid().masked_fill(invalid, 0.0)  # (B, N, 4) (cx, cy, w, h), 0 where none
        boxes, feats, cls_out, box_out = [], [], [], []
        for g in range(self.active_groups()):
            q = self.enc_output_norm[g](self.enc_output[g](zeroed))  # (B, N, d)
            cls = self.enc_out_class_embed[g](q).masked_fill(invalid, float("-inf"))  # (B, N, K)
            coord = refine(props, self.enc_out_bbox_embed[g](q))  # (B, N, 4)
            top = cls.max(-1).values.topk(Q, dim=1).indices  # (B, Q)
            top_box = coord.gather(1, top[..., None].expand(-1, -1, 4))  # (B, Q, 4)
            top_q = q.gather(1, top[..., None].expand(-1, -1, d))  # (B, Q, d)
            box_out.append(top_box)
            boxes.append(top_box.detach())
            cls_out.append(self.enc_out_class_embed[g](top_q))
            feats.append(top_q)
        G = self.active_groups()
        ref = refine(torch.cat(boxes, 1), self.reference_point_embed.weight[:G * Q][None])  # (B, G*Q, 4)
        content = self.query_feat.weight[:G * Q][None].expand(B, -1, -1)  # (B, G*Q, d)
        return content, ref, torch.cat(cls_out, 1), torch.cat(box_out, 1)
