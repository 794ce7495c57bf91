"""DINO's contrastive denoising queries (Zhang et al., ICLR 2023, section 3.3), as IDEA-Research/DINO's
``prepare_for_cdn`` (``models/dino/dn_components.py``).

Every ground-truth box of the batch enters the decoder ``2 G`` more times, as ``G`` groups of a
positive and a negative copy; the matching queries follow them::

    queries  [ group 0: pos (S) | neg (S) | group 1: pos | neg | ... | group G-1 ] [ matching (Q) ]
               <------------------------- pad_size = 2 G S --------------------->

``S`` (``single_pad``) is the largest box count of an image in the batch: slot ``j < n_b`` of each
half holds image b's box j, the slots after ``n_b`` are padding (a zero content and box logits 0, as
the reference: they take part in the attention of their group and learn "no object").

* Labels: each copy's label is replaced, with probability ``label_noise_ratio / 2``, by a class drawn
  uniformly from [0, num_classes) (possibly its own); the content is ``label_enc(label)``.
* Boxes: each corner (x0, y0, x1, y1) moves by ``lambda * u * (w / 2, h / 2, w / 2, h / 2)`` with a
  random sign, ``u`` uniform in [0, 1) for positives and in [1, 2) for negatives (``lambda =
  box_noise_scale``), then the corners are clamped to [0, 1] and turned back into (cx, cy, w, h): a
  positive's corners lie within ``lambda * half the side`` of the truth, a negative's at least that
  far (before clamping). The decoder takes their inverse sigmoid (``box_logits``).
* Groups: ``G = 2 * dn_number // (2 * S)`` when ``2 * dn_number >= 100`` (the reference's budget of
  queries), else ``G = 2 * dn_number`` (sic: the reference doubles ``dn_number`` before it chooses);
  at least 1; ``G = 1`` and ``pad_size = 0`` when the batch has no box.

The draws are the reference's, in its order (label probabilities, new labels, corner signs, corner
magnitudes), from ``generator`` (default: torch's global one, which the reference uses), so that a
test seeds both sides alike. The attention mask is ``vispe.models.detr.queries.dn.mask``.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn
from torchvision.ops import box_convert

from vispe.models.detr.queries.dn.common import inv_sigmoid
from vispe.models.detr.queries.dn.mask import dn_attention_mask


@dataclass
class DenoisingGroups:
    """What ``prepare_cdn`` gives the decoder and the loss (module docstring)."""

    content: torch.Tensor  # (B, P, d) label embeddings, zeros in padding slots
    box_logits: torch.Tensor  # (B, P, 4) inverse sigmoid of the noised (cx, cy, w, h), zeros in padding
    attn_mask: torch.Tensor  # (P + Q, P + Q) bool, True = may not attend (nn.MultiheadAttention's)
    pad_size: int  # P = 2 * num_groups * single_pad
    num_groups: int  # G
    single_pad: int  # S: the largest box count of an image
    boxes: torch.Tensor  # (B, P, 4) the noised boxes (cx, cy, w, h), zeros in padding slots
    labels: torch.Tensor  # (B, P) the noised labels, -1 in padding slots


def num_groups(dn_number: int, single_pad: int) -> int:
    """The reference's group count G for ``dn_number`` and the largest box count (module docstring)."""
    n = 2 * dn_number
    if single_pad == 0:
        return 1
    if n >= 100:
        n = n // (2 * single_pad)
    return max(n, 1)


def check_options(dn_number, label_noise_ratio, box_noise_scale) -> None:
    if isinstance(dn_number, bool) or not isinstance(dn_number, int) or dn_number < 1:
        raise ValueError(f"dn_number={dn_number!r}: expected a positive integer (DINO: 100)")
    if isinstance(label_noise_ratio, bool) or not isinstance(label_noise_ratio, (int, float)) \
            or not 0 <= label_noise_ratio <= 1:
        raise ValueError(f"dn_label_noise_ratio={label_noise_ratio!r}: expected a number in [0, 1] (DINO: 0.5)")
    if isinstance(box_noise_scale, bool) or not isinstance(box_noise_scale, (int, float)) or box_noise_scale < 0:
        raise ValueError(f"dn_box_noise_scale={box_noise_scale!r}: expected a non-negative number (DINO: 1.0)")


def noise_labels(labels: torch.Tensor, ratio: float, num_classes: int,
                 generator: torch.Generator | None = None) -> torch.Tensor:
    """Each label replaced with probability ``ratio / 2`` by a uniform class (module docstring).  # (M,)"""
    if ratio <= 0:
        return labels.clone()
    p = torch.rand(labels.shape, generator=generator, device=labels.device)  # (M,)
    chosen = torch.nonzero(p < ratio * 0.5).view(-1)
    new = torch.randint(0, num_classes, chosen.shape, generator=generator, device=labels.device)
    return labels.clone().scatter_(0, chosen, new.to(labels.dtype))


def noise_boxes(boxes: torch.Tensor, negative: torch.Tensor, scale: float,
                generator: torch.Generator | None = None) -> torch.Tensor:
    """Corners moved by ``scale * u * half the side`` (u in [0, 1) or, ``negative``, [1, 2)), clamped
    to [0, 1] (module docstring). ``boxes`` (M, 4) (cx, cy, w, h), ``negative`` (M,) bool.  # (M, 4)"""
    if scale <= 0:
        return boxes.clone()
    corners = box_convert(boxes, "cxcywh", "xyxy")  # (M, 4)
    half = boxes[:, 2:].repeat(1, 2) / 2  # (M, 4): (w/2, h/2, w/2, h/2)
    sign = torch.randint(0, 2, boxes.shape, generator=generator, device=boxes.device, dtype=torch.float32) * 2.0 - 1.0
    u = torch.rand(boxes.shape, generator=generator, device=boxes.device)  # (M, 4)
    u = (u + negative[:, None].to(u.dtype)) * sign
    corners = (corners + u * half * scale).clamp(0.0, 1.0)
    return torch.cat([(corners[:, :2] + corners[:, 2:]) / 2, corners[:, 2:] - corners[:, :2]], -1)  # (M, 4)


def prepare_cdn(targets: list[dict], label_enc: nn.Module, *, num_queries: int, num_classes: int,
                dn_number: int = 100, label_noise_ratio: float = 0.5, box_noise_scale: float = 1.0,
                generator: torch.Generator | None = None) -> DenoisingGroups:
    """Denoising queries of ``targets`` (one dict per image: "boxes" (n_b, 4) unit (cx, cy, w, h),
    "labels" (n_b,)) and their attention mask (module docstring). ``label_enc``: an embedding of
    ``num_classes`` (+ at least 0) rows; its width is the content's."""
    check_options(dn_number, label_noise_ratio, box_noise_scale)
    B = len(targets)
    d = label_enc.weight.shape[1]
    device = label_enc.weight.device
    counts = [len(t["labels"]) for t in targets]
    S = max(counts, default=0)
    G = num_groups(dn_number, S)
    P = 2 * G * S
    labels = torch.cat([t["labels"] for t in targets]).to(device, torch.int64) if B else \
        torch.zeros(0, dtype=torch.int64, device=device)  # (M,)
    boxes = torch.cat([t["boxes"] for t in targets]).to(device, torch.float32) if B else \
        torch.zeros(0, 4, device=device)  # (M, 4)
    M = len(labels)
    image = torch.cat([torch.full((n,), b, dtype=torch.int64) for b, n in enumerate(counts)]).to(device)  # (M,)
    slot = torch.cat([torch.arange(n) for n in counts]).to(device) if B else image  # (M,) index within the image
    copies = 2 * G
    rep_labels = labels.repeat(copies)  # (2G M,): copy c holds every box of the batch
    rep_boxes = boxes.repeat(copies, 1)  # (2G M, 4)
    negative = (torch.arange(copies, device=device) % 2 == 1).repeat_interleave(M)  # (2G M,)
    rep_labels = noise_labels(rep_labels, label_noise_ratio, num_classes, generator)
    rep_boxes = noise_boxes(rep_boxes, negative, box_noise_scale, generator)
    where = slot.repeat(copies) + S * torch.arange(copies, device=device).repeat_interleave(M)  # (2G M,)
    bid = image.repeat(copies)
    content = torch.zeros(B, P, d, device=device, dtype=label_enc.weight.dtype)
    box_logits = torch.zeros(B, P, 4, device=device)
    out_boxes = torch.zeros(B, P, 4, device=device)
    out_labels = torch.full((B, P), -1, dtype=torch.int64, device=device)
    if M:
        content[bid, where] = label_enc(rep_labels)
        box_logits[bid, where] = inv_sigmoid(rep_boxes)
        out_boxes[bid, where] = rep_boxes
        out_labels[bid, where] = rep_labels
    mask = dn_attention_mask(P, G, num_queries, device=device)
    return DenoisingGroups(content, box_logits, mask, P, G, S, out_boxes, out_labels)
