"""D-FINE's two box-distribution losses (Peng et al., ICLR 2025), as transformers' ``DFineLoss.loss_local``.

D-FINE's decoder predicts each box edge as a distribution over ``N + 1`` bins (``pred_corners``, logits) whose
expectation under the weighting function W(n) (``dfine_decoder.weighting_function``) is the edge's distance from
the initial reference box ``ref_points`` (cx, cy, w, h), in units of its size / reg_scale (``distance_to_box``).

FGL, the fine-grained localization loss, on the matched queries (M of them, 4 edges each)::

    d   = the target edge's distance from ref (left, top, right, bottom), (x_ref - x_t) / (w_ref / s) - s / 2, ...
    n   = the bin with W(n) <= d < W(n + 1); weights w_r = (d - W(n)) / (W(n + 1) - W(n)), w_l = 1 - w_r
          (below W(0): n = 0, w_l = 1; at or past W(N): the last bin, w_r = 1)
    loss_fgl = sum over edges of IoU(box, target) * (w_l CE(corners, n) + w_r CE(corners, n + 1)) / num_boxes

DDF, the decoupled distillation focal loss, every query's distributions against the last layer's (the teacher,
detached), temperature T = 5::

    k   = T^2 KL(softmax(teacher / T) || softmax(corners / T)), summed over bins, per edge
    w   = IoU(box, target) for a matched query, the teacher's top class probability for the others
    loss_ddf = (sqrt(P) mean_matched(w k) + sqrt(U) mean_unmatched(w k)) / (sqrt(P) + sqrt(U))
               P, U = matched / unmatched edge counts divided by the batch size

(transformers' batch scale 1 / B; the original D-FINE uses 32 / B and reuses the matching part's P and U for
the denoising layers). The teacher's own loss_ddf is 0.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torchvision.ops import box_convert, box_iou

from vispe.models.detr.realtime.dfine_decoder import weighting_function

#: DDF's temperature (transformers' and the original's T)
TEMPERATURE = 5.0


def edge_bins(ref: torch.Tensor, target: torch.Tensor, up: torch.Tensor, reg_scale: torch.Tensor,
              num_bins: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """FGL's targets: the left bin of each edge's distance and the two interpolation weights (module docstring).

    ``ref``, ``target`` (M, 4) (cx, cy, w, h); returns ``left`` (M * 4,) integer bins in [0, N - 1] and
    ``w_left``, ``w_right`` (M * 4,)."""
    s = reg_scale.abs()
    t = box_convert(target, "cxcywh", "xyxy")  # (M, 4)
    w, h = ref[:, 2] / s + 1e-16, ref[:, 3] / s + 1e-16
    d = torch.stack([(ref[:, 0] - t[:, 0]) / w, (ref[:, 1] - t[:, 1]) / h,
                     (t[:, 2] - ref[:, 0]) / w, (t[:, 3] - ref[:, 1]) / h], -1) - 0.5 * s  # (M, 4)
    d = d.reshape(-1)
    values = weighting_function(num_bins, up, reg_scale).to(d)  # (N + 1,)
    n = (values[None] <= d[:, None]).sum(1) - 1  # (M * 4,) in [-1, N]
    inside = (n >= 0) & (n < num_bins)
    k = n.clamp(0, num_bins - 1)
    lo, hi = values[k], values[k + 1]
    w_right = torch.where(inside, (d - lo).abs() / ((d - lo).abs() + (hi - d).abs()), (n >= num_bins).to(d))
    return k, 1 - w_right, w_right


def fgl(corners: torch.Tensor, ref: torch.Tensor, boxes: torch.Tensor, target: torch.Tensor, up: torch.Tensor,
        reg_scale: torch.Tensor, norm: float | torch.Tensor) -> torch.Tensor:
    """FGL of the matched queries: ``corners`` (M, 4 (N + 1)), ``ref``, ``boxes``, ``target`` (M, 4).  # ()"""
    num_bins = corners.shape[-1] // 4 - 1
    logits = corners.reshape(-1, num_bins + 1)  # (M * 4, N + 1)
    with torch.no_grad():
        left, w_left, w_right = edge_bins(ref.detach(), target, up, reg_scale, num_bins)
        iou = box_iou(box_convert(boxes, "cxcywh", "xyxy"), box_convert(target, "cxcywh", "xyxy")).diagonal()
    ce = F.cross_entropy(logits, left, reduction="none") * w_left + \
        F.cross_entropy(logits, left + 1, reduction="none") * w_right  # (M * 4,)
    return (ce * iou.repeat_interleave(4)).sum() / norm


def ddf(corners: torch.Tensor, teacher_corners: torch.Tensor, teacher_logits: torch.Tensor,
        matched: tuple[torch.Tensor, torch.Tensor], iou: torch.Tensor, T: float = TEMPERATURE) -> torch.Tensor:
    """DDF of every query: ``corners``, ``teacher_corners`` (B, Q, 4 (N + 1)), ``teacher_logits`` (B, Q, K),
    ``matched`` the (batch, query) index pair of the matched queries, ``iou`` (M,) theirs.  # ()"""
    if torch.equal(corners, teacher_corners):
        return corners.sum() * 0
    B = corners.shape[0]
    num_bins = corners.shape[-1] // 4 - 1
    with torch.no_grad():
        weight = teacher_logits.sigmoid().max(-1).values  # (B, Q)
        weight[matched] = iou.to(weight.dtype)
        mask = torch.zeros_like(weight, dtype=torch.bool)
        mask[matched] = True
        weight, mask = weight.repeat_interleave(4, -1).reshape(-1), mask.repeat_interleave(4, -1).reshape(-1)
        target = F.softmax(teacher_corners.reshape(-1, num_bins + 1) / T, -1)  # (B Q 4, N + 1)
    log_p = F.log_softmax(corners.reshape(-1, num_bins + 1) / T, -1)
    k = weight * T ** 2 * F.kl_div(log_p, target, reduction="none").sum(-1)  # (B Q 4,)
    n_pos, n_neg = (mask.sum() / B) ** 0.5, ((~mask).sum() / B) ** 0.5
    pos = k[mask].mean() if mask.any() else k.sum() * 0
    neg = k[~mask].mean() if (~mask).any() else k.sum() * 0
    return (pos * n_pos + neg * n_neg) / (n_pos + n_neg)
