"""DETR's set criterion: match, then classification and box losses (and the same per decoder layer).

For the predictions matched to targets by ``HungarianMatcher`` (and every other query as "no object"):

    loss_ce   = cross-entropy over K + 1 classes, the "no object" class weighted ``eos_coef`` (0.1)
    loss_bbox = sum of L1 distances of matched boxes / num_boxes
    loss_giou = sum of (1 - GIoU) of matched boxes / num_boxes        (torchvision.ops)
    loss      = 1 * loss_ce + 5 * loss_bbox + 2 * loss_giou  (+ the same for every ``aux_outputs`` entry)

With ``focal_alpha`` (Conditional DETR, DAB-DETR, Deformable DETR: alpha 0.25, gamma 2, weights
2 / 5 / 2) the model has K sigmoid logits (``class_head="sigmoid"``) and ``loss_ce`` is the sigmoid
focal loss (Lin et al. 2017, ``torchvision.ops.sigmoid_focal_loss``) of the one-hot targets, every
unmatched query an all-zero target, summed and divided by ``num_boxes`` (the papers' ``mean(1).sum()
/ num_boxes * num_queries``). The outputs' ``class_head`` must agree with the loss (else ValueError).

Two-stage detectors (Deformable DETR's A.4) also return ``enc_outputs``, every encoder token's proposal:
it gets the same losses against the targets with every label set to class 0 (the papers' class-agnostic
proposals), reported with the suffix ``_enc``; DINO's (``"classes": True``: its top-k selected proposals)
with the true classes. DINO's denoising groups (``dn_outputs``) add ``vispe.models.detr.queries.dn.loss``'s terms
(``loss_ce_dn``, ``loss_bbox_dn``, ``loss_giou_dn``, ``..._dn_{i}`` per layer), weighted as their namesakes.

``num_boxes`` is the number of target boxes in the batch, summed over processes when
torch.distributed is initialised and divided by the world size (DETR), at least 1.
Targets are checked first (``check_targets``): boxes (N, 4) normalised (cx, cy, w, h) inside the
image with positive size, labels int64 in [0, num_classes); anything else is a ValueError
naming the image, the box and its value.
"""
from __future__ import annotations

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torchvision.ops import box_convert, generalized_box_iou_loss, sigmoid_focal_loss

from vispe.models.detr.heads.matcher import HungarianMatcher
from vispe.models.detr.queries.dn.loss import denoising_losses, weighted_total

TOLERANCE = 1e-4  # boxes may exceed the image by this much (rounding of normalised coordinates)


def check_targets(targets: list[dict], num_classes: int, batch: int | None = None) -> None:
    """Refuse malformed targets with a message naming the image and the value (see module docstring)."""
    if not isinstance(targets, (list, tuple)) or (batch is not None and len(targets) != batch):
        got = len(targets) if isinstance(targets, (list, tuple)) else type(targets).__name__
        raise ValueError(f"targets has {got} entries: expected a list of one dict per image ({batch})")
    for i, t in enumerate(targets):
        if not isinstance(t, dict) or "boxes" not in t or "labels" not in t:
            raise ValueError(f"targets[{i}] is {type(t).__name__} without 'boxes' and 'labels': expected a dict "
                             "with boxes (N, 4) normalised cx, cy, w, h and labels (N,)")
        boxes, labels = t["boxes"], t["labels"]
        if boxes.dim() != 2 or boxes.shape[-1] != 4 or labels.shape != boxes.shape[:1]:
            raise ValueError(f"targets[{i}] has boxes {tuple(boxes.shape)} and labels {tuple(labels.shape)}: "
                             "expected (N, 4) and (N,)")
        if labels.dtype not in (torch.int64, torch.int32):
            raise ValueError(f"targets[{i}]['labels'] has dtype {labels.dtype}: expected torch.int64 class ids")
        bad = ((labels < 0) | (labels >= num_classes)).nonzero()
        if len(bad):
            j = int(bad[0])
            raise ValueError(f"targets[{i}]['labels'][{j}]={int(labels[j])}: expected a class id in [0, {num_classes})")
        if not len(boxes):
            continue
        xyxy = box_convert(boxes.float(), "cxcywh", "xyxy")  # (N, 4)
        ok = torch.isfinite(boxes).all(-1) & (boxes[:, 2] > 0) & (boxes[:, 3] > 0) & \
            (xyxy[:, :2] >= -TOLERANCE).all(-1) & (xyxy[:, 2:] <= 1 + TOLERANCE).all(-1)
        if not ok.all():
            j = int((~ok).nonzero()[0])
            raise ValueError(f"targets[{i}]['boxes'][{j}]={[round(float(v), 4) for v in boxes[j]]}: expected a box "
                             "(cx, cy, w, h) normalised to the image, with w > 0 and h > 0 and inside [0, 1]")


class SetCriterion(nn.Module):
    """DETR's loss (module docstring). ``forward(outputs, targets) -> {"loss", "loss_ce", ...}``."""

    def __init__(self, num_classes: int, matcher: HungarianMatcher | None = None, *, eos_coef: float = 0.1,
                 weight_ce: float = 1.0, weight_bbox: float = 5.0, weight_giou: float = 2.0,
                 focal_alpha: float | None = None, focal_gamma: float = 2.0) -> None:
        super().__init__()
        if focal_alpha is not None and not (isinstance(focal_alpha, (int, float)) and 0 < focal_alpha < 1):
            raise ValueError(f"focal_alpha={focal_alpha!r}: expected None (cross-entropy) or a weight in (0, 1) (0.25)")
        if not (isinstance(focal_gamma, (int, float)) and focal_gamma >= 0):
            raise ValueError(f"focal_gamma={focal_gamma!r}: expected a non-negative number (2)")
        self.focal_alpha, self.focal_gamma = focal_alpha, float(focal_gamma)
        if not isinstance(num_classes, int) or num_classes < 1:
            raise ValueError(f"num_classes={num_classes!r}: expected a positive integer")
        if not 0 < eos_coef <= 1:
            raise ValueError(f"eos_coef={eos_coef!r}: expected a weight in (0, 1]")
        self.num_classes = num_classes
        self.matcher = matcher or HungarianMatcher()
        self.weights = {"loss_ce": float(weight_ce), "loss_bbox": float(weight_bbox), "loss_giou": float(weight_giou)}
        empty_weight = torch.ones(num_classes + 1)
        empty_weight[-1] = eos_coef
        self.register_buffer("empty_weight", empty_weight, persistent=False)

    def forward(self, outputs: dict, targets: list[dict]) -> dict:
        check_targets(targets, self.num_classes, outputs["pred_logits"].shape[0])
        head, want = outputs.get("class_head", "softmax"), "sigmoid" if self.focal_alpha is not None else "softmax"
        if head != want:
            raise ValueError(f"the model's class_head={head!r} does not fit this criterion ({want!r} logits: "
                             f"focal_alpha={self.focal_alpha}); build SetCriterion with focal_alpha=0.25 for "
                             "'sigmoid' heads, None for 'softmax'")
        if "dn_outputs" in outputs and self.focal_alpha is None:
            raise ValueError("the outputs have denoising groups (dn_outputs, DINO's focal terms): expected a "
                             "criterion with focal_alpha (0.25) and a sigmoid class head")
        device = outputs["pred_logits"].device
        targets = [{"boxes": t["boxes"].to(device), "labels": t["labels"].to(device, torch.int64)} for t in targets]
        num_boxes = _num_boxes(targets, device)
        losses, total = {}, 0.0
        for i, out in enumerate([outputs, *outputs.get("aux_outputs", [])]):  # final layer, then aux layers 0..L-2
            part = self._losses(out, targets, num_boxes)
            total = total + sum(self.weights[k] * v for k, v in part.items())
            suffix = "" if i == 0 else f"_{i - 1}"
            losses.update({k + suffix: v for k, v in part.items()})
        if "enc_outputs" in outputs:  # two-stage proposals: class-agnostic targets (every label 0); DINO's: true ones
            binary = [{"boxes": t["boxes"], "labels": torch.zeros_like(t["labels"])} for t in targets]
            part = self._losses(outputs["enc_outputs"], targets if outputs["enc_outputs"].get("classes") else binary,
                                num_boxes)
            total = total + sum(self.weights[k] * v for k, v in part.items())
            losses.update({k + "_enc": v for k, v in part.items()})
        if "dn_outputs" in outputs:  # denoising groups (DINO): assigned by construction (vispe.models.detr.queries.dn.loss)
            dn = outputs["dn_outputs"]
            part = denoising_losses(dn, targets, num_boxes=num_boxes, focal_alpha=self.focal_alpha,
                                    focal_gamma=self.focal_gamma, **dn["meta"])
            total = total + weighted_total(part, self.weights)
            losses.update(part)
        losses["loss"] = total
        return losses

    def _losses(self, outputs: dict, targets: list[dict], num_boxes: torch.Tensor) -> dict:
        logits, boxes = outputs["pred_logits"], outputs["pred_boxes"]  # (B, Q, K+1), (B, Q, 4)
        indices = self.matcher(outputs, targets)
        batch_idx = torch.cat([torch.full_like(src, b) for b, (src, _) in enumerate(indices)]).to(logits.device)
        src_idx = torch.cat([src for src, _ in indices]).to(logits.device)
        target_classes = torch.full(logits.shape[:2], self.num_classes, dtype=torch.int64, device=logits.device)
        target_classes[batch_idx, src_idx] = torch.cat([t["labels"][j] for t, (_, j) in zip(targets, indices)])
        if self.focal_alpha is None:
            loss_ce = F.cross_entropy(logits.float().transpose(1, 2), target_classes, self.empty_weight)
        else:  # one-hot over K + 1, "no object" column dropped: unmatched queries have all-zero targets
            onehot = F.one_hot(target_classes, self.num_classes + 1)[..., :-1].float()  # (B, Q, K)
            loss_ce = sigmoid_focal_loss(logits.float(), onehot, alpha=self.focal_alpha, gamma=self.focal_gamma,
                                         reduction="sum") / num_boxes
        src_boxes = boxes[batch_idx, src_idx].float()  # (M, 4)
        tgt_boxes = torch.cat([t["boxes"][j] for t, (_, j) in zip(targets, indices)]).float()  # (M, 4)
        loss_bbox = F.l1_loss(src_boxes, tgt_boxes, reduction="sum") / num_boxes
        loss_giou = generalized_box_iou_loss(box_convert(src_boxes, "cxcywh", "xyxy"),
                                             box_convert(tgt_boxes, "cxcywh", "xyxy"), reduction="sum") / num_boxes
        return {"loss_ce": loss_ce, "loss_bbox": loss_bbox, "loss_giou": loss_giou}


def _num_boxes(targets: list[dict], device) -> torch.Tensor:
    n = torch.tensor(float(sum(len(t["labels"]) for t in targets)), device=device)
    if dist.is_available() and dist.is_initialized():
        dist.all_reduce(n)
        n = n / dist.get_world_size()
    return n.clamp(min=1.0)
