"""RT-DETR's contrastive denoising groups (DINO's idea, Zhang et al., ICLR 2023; RT-DETR's variant).

As transformers' ``get_contrastive_denoising_training_group`` (and lyuwenyu's), which differs from
DINO's ``prepare_for_cdn`` (``vispe.models.detr.queries.dn.groups``) in three places: the group count is
``num_denoising // S`` (S = the largest box count of an image; at least 1), the noise is drawn over
the padded (B, 2 G S) slots in one call each (so the same seed gives transformers' noise), and a
padding slot holds the class ``num_classes`` (the embedding's ``padding_idx``, a zero vector) and a
zero box. Layout of the queries::

    [ group 0: positives (S) | negatives (S) | group 1 ... | group G-1 ] [ matching queries (Q) ]

Labels: each real slot's class is replaced with probability ``label_noise_ratio / 2`` by a uniform
class. Boxes: the corners move by ``u * (w/2, h/2, w/2, h/2) * box_noise_scale`` with a random
sign, ``u`` in [0, 1) for positives, [1, 2) for negatives, are clamped to [0, 1] and become
(cx, cy, w, h) logits (inverse sigmoid, eps 1e-5). The attention mask is DINO's
(``vispe.models.detr.queries.dn.mask``). Targets: one dict per image, "labels" (n,) and "boxes" (n, 4)
unit (cx, cy, w, h).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn
from torchvision.ops import box_convert

from vispe.models.detr.mlp import inverse_sigmoid
from vispe.models.detr.queries.dn.mask import dn_attention_mask


@dataclass
class Groups:
    content: torch.Tensor  # (B, P, d) class embeddings of the noised labels
    box_logits: torch.Tensor  # (B, P, 4) noised boxes as logits (cx, cy, w, h)
    attn_mask: torch.Tensor  # (P + Q, P + Q) bool, True = may not attend
    num_groups: int  # G
    positive: list[torch.Tensor]  # per image, the slots (in [0, P)) of its positives, G n_b of them
    pad_size: int  # P = 2 G S


def denoising_groups(targets: list[dict[str, torch.Tensor]], class_embed: nn.Embedding, *, num_classes: int, num_queries: int,
                     num_denoising: int = 100, label_noise_ratio: float = 0.5,
                     box_noise_scale: float = 1.0) -> Groups | None:
    """The groups of ``targets`` (module docstring), or None without boxes or with ``num_denoising`` 0."""
    if num_denoising <= 0:
        return None
    counts = [len(t["labels"]) for t in targets]
    S = max(counts, default=0)
    if S == 0:
        return None
    device = class_embed.weight.device
    G = max(num_denoising // S, 1)
    B = len(targets)
    cls = torch.full([B, S], num_classes, dtype=torch.int32, device=device)  # (B, S)
    box = torch.zeros([B, S, 4], device=device)
    real = torch.zeros([B, S], dtype=torch.bool, device=device)
    for i, (t, n) in enumerate(zip(targets, counts)):
        if n:
            cls[i, :n] = t["labels"].to(device, torch.int32)
            box[i, :n] = t["boxes"].to(device, torch.float32)
            real[i, :n] = True
    cls, box, real = cls.tile([1, 2 * G]), box.tile([1, 2 * G, 1]), real.tile([1, 2 * G])  # (B, P[, 4])
    negative = torch.zeros([B, 2 * S, 1], device=device)
    negative[:, S:] = 1
    negative = negative.tile([1, G, 1])  # (B, P, 1)
    positive = (1 - negative).squeeze(-1) * real  # (B, P)
    pos_idx = list(torch.nonzero(positive)[:, 1].split([n * G for n in counts]))
    P = 2 * G * S
    if label_noise_ratio > 0:  # the draws in transformers' order and shapes
        flip = torch.rand(cls.shape, device=device) < label_noise_ratio * 0.5  # (B, P)
        new = torch.randint(0, num_classes, cls.shape, dtype=cls.dtype, device=device)
        cls = torch.where(flip & real, new, cls)
    if box_noise_scale > 0:
        corners = box_convert(box, "cxcywh", "xyxy")  # (B, P, 4)
        half = box[..., 2:].tile([1, 1, 2]) * 0.5 * box_noise_scale  # (B, P, 4)
        sign = torch.randint(0, 2, box.shape, dtype=box.dtype, device=device) * 2.0 - 1.0
        u = torch.rand(box.shape, device=device)
        u = ((u + 1.0) * negative + u * (1 - negative)) * sign
        corners = (corners + u * half).clip(0.0, 1.0)
        box = box_convert(corners, "xyxy", "cxcywh")
    logits = inverse_sigmoid(box)  # (B, P, 4)
    mask = dn_attention_mask(P, G, num_queries, device=device)  # (P + Q, P + Q)
    return Groups(class_embed(cls), logits, mask, G, pos_idx, P)
