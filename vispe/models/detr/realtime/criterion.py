"""RT-DETR's loss (lyuwenyu/RT-DETR ``RTDETRCriterionv2``; transformers' ``RTDetrLoss``): VFL + L1 + GIoU.

Predictions are matched to targets by the Hungarian matcher with the focal class cost (alpha 0.25,
gamma 2; costs class 2, L1 5, GIoU 2). Then, over the B x Q x K sigmoid logits::

    VFL (Zhang et al., "VarifocalNet"; the paper's IoU-aware classification):
        t = IoU(matched box, its target) at the matched query's true class, 0 elsewhere   (detached)
        w = alpha * sigmoid(logit)^gamma * (1 - onehot) + t                          alpha 0.75, gamma 2
        loss_vfl = sum_q mean_k BCE_with_logits(logit, t; weight w) * Q / num_boxes
    loss_bbox = L1 of matched boxes / num_boxes;  loss_giou = (1 - GIoU) / num_boxes
    loss = 1 * loss_vfl + 5 * loss_bbox + 2 * loss_giou

for the last layer (keys ``loss_ce`` = the VFL term, so train.py's ``loss_ce`` column reads it,
``loss_bbox``, ``loss_giou``), every earlier layer (suffix ``_{i}``), the selected encoder proposals
(``_enc``) and, in training with denoising, every layer's denoising queries (``_dn_{i}``), whose
positives are assigned by construction (no matching), normalised by ``num_boxes * G``. ``num_boxes``:
the batch's box count (averaged over processes), at least 1.

D-FINE (its layers' outputs carry ``pred_corners`` and ``ref_points``) adds on each such layer, matched and
denoising alike, ``loss_fgl`` (weight 0.15) and ``loss_ddf`` (weight 1.5) of ``dfine_loss``, the teacher
being the last layer of the same kind (its own ``loss_ddf`` is 0): as transformers' ``DFineLoss`` applied to
every layer with its own distributions. (transformers' ``DFineForObjectDetectionLoss`` pairs layer i - 1's
logits and boxes with layer i's distributions, because its logits have the pre-box head's entry in front
and its distributions not, and gives the last layer no FGL; the original D-FINE pairs them as here.)
"""
from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from torchvision.ops import box_convert, box_iou, generalized_box_iou_loss

from vispe.models.detr.heads.criterion import _num_boxes, check_targets
from vispe.models.detr.heads.matcher import HungarianMatcher
from vispe.models.detr.realtime.dfine_loss import ddf, fgl


def vfl(logits: torch.Tensor, target_class: torch.Tensor, iou: torch.Tensor, num_boxes: float | torch.Tensor, *, alpha: float = 0.75,
        gamma: float = 2.0) -> torch.Tensor:
    """``logits`` (B, Q, K), ``target_class`` (B, Q) in [0, K] (K = none), ``iou`` (B, Q) (module docstring).  # ()"""
    K = logits.shape[-1]
    onehot = F.one_hot(target_class, K + 1)[..., :-1].to(logits.dtype)  # (B, Q, K)
    score = iou.detach()[..., None].to(logits.dtype) * onehot  # (B, Q, K)
    weight = alpha * logits.detach().sigmoid().pow(gamma) * (1 - onehot) + score
    loss = F.binary_cross_entropy_with_logits(logits, score, weight=weight, reduction="none")
    return loss.mean(1).sum() * logits.shape[1] / num_boxes


class RealtimeCriterion(nn.Module):
    def __init__(self, num_classes: int, matcher: HungarianMatcher | None = None, *, weight_vfl: float = 1.0,
                 weight_bbox: float = 5.0, weight_giou: float = 2.0, alpha: float = 0.75, gamma: float = 2.0,
                 weight_fgl: float = 0.15, weight_ddf: float = 1.5) -> None:
        super().__init__()
        self.num_classes = num_classes
        self.matcher = matcher or HungarianMatcher(2.0, 5.0, 2.0, focal_alpha=0.25, focal_gamma=2.0)
        self.weights = {"loss_ce": float(weight_vfl), "loss_bbox": float(weight_bbox), "loss_giou": float(weight_giou),
                        "loss_fgl": float(weight_fgl), "loss_ddf": float(weight_ddf)}
        self.alpha, self.gamma = float(alpha), float(gamma)

    def forward(self, outputs: dict[str, Any],
                targets: list[dict[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
        check_targets(targets, self.num_classes, outputs["pred_logits"].shape[0])
        device = outputs["pred_logits"].device
        targets = [{"boxes": t["boxes"].to(device), "labels": t["labels"].to(device, torch.int64)} for t in targets]
        num_boxes = _num_boxes(targets, device)
        parts: list[tuple[str, dict[str, Any], list[Any], torch.Tensor, dict[str, Any]]] = []  # (suffix, output, matching, norm, teacher)
        for i, out in enumerate([outputs, *outputs.get("aux_outputs", [])]):
            parts.append(("" if i == 0 else f"_{i - 1}", out, self.matcher(out, targets), num_boxes, outputs))
        if "enc_outputs" in outputs:
            parts.append(("_enc", outputs["enc_outputs"], self.matcher(outputs["enc_outputs"], targets), num_boxes, {}))
        if "dn_outputs" in outputs:
            meta = outputs["dn_meta"]
            idx = [(pos.cpu(), torch.arange(len(t["labels"])).repeat(meta.num_groups)) for pos, t in zip(meta.positive, targets)]
            for i, out in enumerate(outputs["dn_outputs"]):
                parts.append((f"_dn_{i}", out, idx, num_boxes * meta.num_groups, outputs["dn_outputs"][-1]))
        losses, total = {}, torch.zeros((), device=device)
        for suffix, out, indices, norm, teacher in parts:
            terms = self._terms(out, targets, indices, norm)
            if "pred_corners" in out:
                terms.update(self._fdr_terms(out, teacher, outputs, targets, indices, norm))
            for k, v in terms.items():
                losses[k + suffix] = v
                total = total + self.weights[k] * v
        losses["loss"] = total
        return losses

    def _terms(self, out: dict[str, Any], targets: list[dict[str, torch.Tensor]], indices: list[Any],
               norm: torch.Tensor) -> dict[str, torch.Tensor]:
        logits, boxes = out["pred_logits"].float(), out["pred_boxes"].float()  # (B, Q, K), (B, Q, 4)
        b = torch.cat([torch.full_like(src, i) for i, (src, _) in enumerate(indices)]).to(logits.device)
        q = torch.cat([src for src, _ in indices]).to(logits.device)
        src = boxes[b, q]  # (M, 4)
        tgt = torch.cat([t["boxes"][j.to(logits.device)] for t, (_, j) in zip(targets, indices)]).float()  # (M, 4)
        labels = torch.cat([t["labels"][j.to(logits.device)] for t, (_, j) in zip(targets, indices)])
        cls = torch.full(logits.shape[:2], self.num_classes, dtype=torch.int64, device=logits.device)
        cls[b, q] = labels
        iou = torch.zeros(logits.shape[:2], device=logits.device)
        src_xyxy, tgt_xyxy = box_convert(src, "cxcywh", "xyxy"), box_convert(tgt, "cxcywh", "xyxy")
        if len(src):
            iou[b, q] = box_iou(src_xyxy, tgt_xyxy).diagonal().detach()
        return {"loss_ce": vfl(logits, cls, iou, norm, alpha=self.alpha, gamma=self.gamma),
                "loss_bbox": F.l1_loss(src, tgt, reduction="sum") / norm,
                "loss_giou": generalized_box_iou_loss(src_xyxy, tgt_xyxy, reduction="sum") / norm}

    def _fdr_terms(self, out: dict[str, Any], teacher: dict[str, Any], outputs: dict[str, Any],
                   targets: list[dict[str, torch.Tensor]], indices: list[Any],
                   norm: torch.Tensor) -> dict[str, torch.Tensor]:
        """D-FINE's FGL and DDF of one layer (``dfine_loss``; module docstring)."""
        corners, boxes = out["pred_corners"].float(), out["pred_boxes"].float()  # (B, Q, 4 (N+1)), (B, Q, 4)
        b = torch.cat([torch.full_like(src, i) for i, (src, _) in enumerate(indices)]).to(corners.device)
        q = torch.cat([src for src, _ in indices]).to(corners.device)
        tgt = torch.cat([t["boxes"][j.to(corners.device)] for t, (_, j) in zip(targets, indices)]).float()  # (M, 4)
        up, reg_scale = outputs["up"].float(), outputs["reg_scale"].float()
        iou = box_iou(box_convert(boxes[b, q], "cxcywh", "xyxy"), box_convert(tgt, "cxcywh", "xyxy")).diagonal()
        return {"loss_fgl": fgl(corners[b, q], out["ref_points"][b, q].float(), boxes[b, q], tgt, up, reg_scale, norm),
                "loss_ddf": ddf(corners, teacher["pred_corners"].float(), teacher["pred_logits"].float(), (b, q),
                                iou.detach())}
