"""DETR's Hungarian matcher: a one-to-one assignment of predictions to ground-truth boxes.

For each image, the cost of predicting target j with query i is

    C[i, j] = w_class * (-p_i(c_j)) + w_bbox * ||b_i - b_j||_1 + w_giou * (-GIoU(b_i, b_j))

(p = softmax of the class logits, boxes normalised (cx, cy, w, h)), and scipy's
``linear_sum_assignment`` finds the minimal-cost matching (min(Q, N) pairs). DETR's weights: 1, 5, 2.

With ``focal_alpha`` (sigmoid class heads, Conditional / DAB / Deformable DETR: weights 2, 5, 2) the
class term is the focal cost of the target class, p = sigmoid of its logit:
``alpha (1 - p)^gamma (-log p) - (1 - alpha) p^gamma (-log(1 - p))``.
"""
from __future__ import annotations

import torch
from scipy.optimize import linear_sum_assignment
from torch import nn
from torchvision.ops import box_convert, generalized_box_iou


def _non_negative(name: str, value) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0:
        raise ValueError(f"{name}={value!r}: expected a non-negative number")
    return float(value)


class HungarianMatcher(nn.Module):
    """``forward(outputs, targets) -> [(pred_idx (M,), target_idx (M,)) per image]``, int64 on the CPU."""

    def __init__(self, cost_class: float = 1.0, cost_bbox: float = 5.0, cost_giou: float = 2.0, *,
                 focal_alpha: float | None = None, focal_gamma: float = 2.0) -> None:
        super().__init__()
        if focal_alpha is not None and not (isinstance(focal_alpha, (int, float)) and 0 < focal_alpha < 1):
            raise ValueError(f"focal_alpha={focal_alpha!r}: expected None (softmax cost) or a weight in (0, 1) (0.25)")
        self.focal_alpha, self.focal_gamma = focal_alpha, _non_negative("focal_gamma", focal_gamma)
        self.cost_class = _non_negative("cost_class", cost_class)
        self.cost_bbox = _non_negative("cost_bbox", cost_bbox)
        self.cost_giou = _non_negative("cost_giou", cost_giou)
        if not (self.cost_class or self.cost_bbox or self.cost_giou):
            raise ValueError("cost_class, cost_bbox and cost_giou are all 0: expected at least one positive cost")

    @torch.no_grad()
    def cost_matrix(self, logits: torch.Tensor, boxes: torch.Tensor, labels: torch.Tensor,
                    tgt_boxes: torch.Tensor) -> torch.Tensor:
        """Costs of every (query, target) pair.  # (Q', N') for Q' predictions and N' targets"""
        if self.focal_alpha is None:
            cost = -self.cost_class * logits.float().softmax(-1)[:, labels]  # (Q', N')
        else:
            p = logits.float().sigmoid()[:, labels]  # (Q', N')
            a, g = self.focal_alpha, self.focal_gamma
            pos = a * (1 - p) ** g * -(p + 1e-8).log()
            neg = (1 - a) * p ** g * -(1 - p + 1e-8).log()
            cost = self.cost_class * (pos - neg)  # (Q', N')
        cost = cost + self.cost_bbox * torch.cdist(boxes.float(), tgt_boxes.float(), p=1)
        giou = generalized_box_iou(box_convert(boxes.float(), "cxcywh", "xyxy"),
                                   box_convert(tgt_boxes.float(), "cxcywh", "xyxy"))  # (Q', N')
        return cost - self.cost_giou * giou

    @torch.no_grad()
    def forward(self, outputs: dict, targets: list[dict]) -> list[tuple[torch.Tensor, torch.Tensor]]:
        logits, boxes = outputs["pred_logits"], outputs["pred_boxes"]  # (B, Q, K+1), (B, Q, 4)
        B, Q = logits.shape[:2]
        if len(targets) != B:
            raise ValueError(f"targets has {len(targets)} entries: expected one per image ({B})")
        sizes = [len(t["labels"]) for t in targets]
        empty = torch.empty(0, dtype=torch.int64)
        if sum(sizes) == 0:
            return [(empty, empty) for _ in range(B)]
        labels = torch.cat([t["labels"] for t in targets]).to(logits.device)  # (N,)
        tgt = torch.cat([t["boxes"] for t in targets]).to(boxes.device)  # (N, 4)
        cost = self.cost_matrix(logits.flatten(0, 1), boxes.flatten(0, 1), labels, tgt)  # (B*Q, N)
        cost = cost.view(B, Q, -1).cpu()
        out = []
        for b, c in enumerate(cost.split(sizes, dim=-1)):  # c (B, Q, n_b): image b's block is c[b]
            if sizes[b] == 0:
                out.append((empty, empty))
                continue
            rows, cols = linear_sum_assignment(c[b].numpy())
            out.append((torch.as_tensor(rows, dtype=torch.int64), torch.as_tensor(cols, dtype=torch.int64)))
        return out
