"""DINO's denoising losses (IDEA-Research/DINO ``SetCriterion.forward``, its ``_dn`` terms): the
denoising queries are assigned by construction, no matching.

Group g of image b holds its positive copy of box j at query ``g * 2S + j`` (``vispe.models.detr.queries.dn.groups``);
those ``G * n_b`` queries get box j's class and box, every other denoising query (the negatives, the
padding slots) "no object"::

    loss_ce_dn   = sigmoid focal loss (alpha, gamma) of the one-hot targets, summed over every
                   denoising query and class                                    / (num_boxes * G)
    loss_bbox_dn = L1 of the positives' boxes, summed                            / (num_boxes * G)
    loss_giou_dn = 1 - GIoU of the positives' boxes, summed                      / (num_boxes * G)

for the last layer, and with the suffix ``_dn_{i}`` for the outputs of layer i before it
(``aux_outputs``). ``num_boxes`` is the set loss's (the batch's box count, averaged over processes,
at least 1). The criterion weights them as their set-loss namesakes (DINO: 1, 5, 2).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torchvision.ops import box_convert, generalized_box_iou_loss, sigmoid_focal_loss

NAMES = ("loss_ce", "loss_bbox", "loss_giou")


def positive_index(counts: list[int], num_groups: int, single_pad: int,
                   device=None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(image (M,), denoising query (M,), target box (M,)) of every positive copy, M = G * sum n_b."""
    img, query, box = [], [], []
    for b, n in enumerate(counts):
        j = torch.arange(n, device=device).repeat(num_groups)  # (G n,)
        g = torch.arange(num_groups, device=device).repeat_interleave(n)  # (G n,)
        img.append(torch.full_like(j, b))
        query.append(g * 2 * single_pad + j)
        box.append(j)
    return torch.cat(img), torch.cat(query), torch.cat(box)


def _layer(out: dict, targets: list[dict], index, norm: torch.Tensor, alpha: float, gamma: float) -> dict:
    logits, boxes = out["pred_logits"], out["pred_boxes"]  # (B, P, K), (B, P, 4)
    img, query, box = index
    labels = torch.cat([t["labels"][box[img == b]] for b, t in enumerate(targets)]).to(logits.device)  # (M,)
    onehot = torch.zeros(logits.shape, dtype=torch.float32, device=logits.device)  # (B, P, K)
    onehot[img, query, labels] = 1.0
    loss_ce = sigmoid_focal_loss(logits.float(), onehot, alpha=alpha, gamma=gamma, reduction="sum") / norm
    src = boxes[img, query].float()  # (M, 4)
    tgt = torch.cat([t["boxes"][box[img == b]] for b, t in enumerate(targets)]).to(src)  # (M, 4)
    loss_bbox = F.l1_loss(src, tgt, reduction="sum") / norm
    loss_giou = generalized_box_iou_loss(box_convert(src, "cxcywh", "xyxy"), box_convert(tgt, "cxcywh", "xyxy"),
                                         reduction="sum") / norm
    return {"loss_ce": loss_ce, "loss_bbox": loss_bbox, "loss_giou": loss_giou}


def denoising_losses(dn_outputs: dict, targets: list[dict], *, num_groups: int, single_pad: int,
                     num_boxes: torch.Tensor | float, focal_alpha: float = 0.25, focal_gamma: float = 2.0) -> dict:
    """``{"loss_ce_dn", "loss_bbox_dn", "loss_giou_dn", "loss_ce_dn_0", ...}`` of the denoising outputs
    (``dn_post_process``'s: "pred_logits" (B, P, K), "pred_boxes" (B, P, 4), "aux_outputs") for the
    ``num_groups`` groups of ``2 * single_pad`` queries built from ``targets`` (module docstring)."""
    P = dn_outputs["pred_logits"].shape[1]
    if P != 2 * num_groups * single_pad:
        raise ValueError(f"the denoising outputs have {P} queries: expected 2 * num_groups * single_pad = "
                         f"{2 * num_groups * single_pad} (num_groups={num_groups}, single_pad={single_pad})")
    counts = [len(t["labels"]) for t in targets]
    if len(targets) != dn_outputs["pred_logits"].shape[0]:
        raise ValueError(f"targets has {len(targets)} entries: expected one per image "
                         f"({dn_outputs['pred_logits'].shape[0]})")
    if max(counts, default=0) != single_pad:
        raise ValueError(f"single_pad={single_pad}: the targets' largest box count is {max(counts, default=0)}; "
                         "expected the targets the groups were built from")
    device = dn_outputs["pred_logits"].device
    index = positive_index(counts, num_groups, single_pad, device)
    norm = torch.as_tensor(num_boxes, dtype=torch.float32, device=device) * num_groups
    losses = {}
    for k, v in _layer(dn_outputs, targets, index, norm, focal_alpha, focal_gamma).items():
        losses[k + "_dn"] = v
    for i, aux in enumerate(dn_outputs.get("aux_outputs", [])):
        for k, v in _layer(aux, targets, index, norm, focal_alpha, focal_gamma).items():
            losses[f"{k}_dn_{i}"] = v
    return losses


def weighted_total(losses: dict, weights: dict) -> torch.Tensor:
    """``sum(weights[name] * value)`` of ``denoising_losses``' terms, each weighted as its set-loss
    namesake (``loss_ce_dn_2`` as ``loss_ce``).  # ()"""
    total = torch.zeros(())
    for k, v in losses.items():
        name = k.split("_dn")[0]
        if name not in weights:
            raise ValueError(f"weights has no {name!r} (for {k!r}): expected weights of {', '.join(NAMES)}")
        total = total.to(v.device) + weights[name] * v
    return total
