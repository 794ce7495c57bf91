"""DETR's outputs -> detections in original image pixels, and COCO result records.

``postprocess(outputs, orig_sizes)``: per image, for every query the most likely real class
(softmax over K + 1, "no object" excluded, as DETR's ``PostProcess``), its probability as the
score, and the box (cx, cy, w, h) normalised to the image, scaled to ``orig_sizes`` (h, w) and
returned as (x0, y0, x1, y1). Boxes are predicted relative to each image's valid (unpadded)
area, and resizing keeps relative coordinates, so the original file's size is the scale.

A sigmoid class head (``outputs["class_head"] == "sigmoid"``, Conditional / DAB-DETR) gives the
``num_select`` (100) best (query, class) pairs of each image over all Q x K sigmoid scores, as
their ``PostProcess`` (a query may then report several classes).

``to_coco_results(outputs, targets)``: the same as pycocotools' result records
``{"image_id", "category_id", "bbox": [x, y, w, h], "score"}`` (labels are category ids, DETR's
convention), ready for ``COCO.loadRes`` + ``COCOeval`` (``vispe.data.coco_eval.coco_evaluate``).
"""
from __future__ import annotations

import torch
from torchvision.ops import box_convert


@torch.no_grad()
def postprocess(outputs: dict, orig_sizes: torch.Tensor, num_select: int = 100) -> list[dict]:
    """``orig_sizes`` (B, 2) as (h, w) -> ``[{"scores" (Q,), "labels" (Q,), "boxes" (Q, 4) xyxy px}]``."""
    logits, boxes = outputs["pred_logits"], outputs["pred_boxes"]  # (B, Q, K+1), (B, Q, 4)
    orig_sizes = torch.as_tensor(orig_sizes, device=boxes.device)
    if orig_sizes.shape != (logits.shape[0], 2):
        raise ValueError(f"orig_sizes has shape {tuple(orig_sizes.shape)}: expected ({logits.shape[0]}, 2) as (h, w)")
    if outputs.get("class_head", "softmax") == "sigmoid":
        prob = logits.float().sigmoid().flatten(1)  # (B, Q*K)
        scores, index = prob.topk(min(num_select, prob.shape[1]), dim=1)  # (B, S) each
        K = logits.shape[-1]
        labels = index % K
        boxes = torch.gather(boxes, 1, (index // K)[..., None].expand(-1, -1, 4))  # (B, S, 4)
    else:
        scores, labels = logits.float().softmax(-1)[..., :-1].max(-1)  # (B, Q) each
    h, w = orig_sizes.float().unbind(-1)  # (B,) each
    scale = torch.stack([w, h, w, h], dim=-1)[:, None]  # (B, 1, 4)
    xyxy = box_convert(boxes.float(), "cxcywh", "xyxy") * scale  # (B, Q|S, 4)
    return [{"scores": s, "labels": lab, "boxes": b} for s, lab, b in zip(scores, labels, xyxy)]


def to_coco_results(outputs: dict, targets: list[dict]) -> list[dict]:
    """COCO result records of a batch; ``targets`` give ``image_id`` and ``orig_size`` (h, w)."""
    sizes = torch.stack([torch.as_tensor(t["orig_size"]) for t in targets])  # (B, 2)
    records = []
    for t, det in zip(targets, postprocess(outputs, sizes)):
        xywh = box_convert(det["boxes"], "xyxy", "xywh").cpu().tolist()
        image_id = int(t["image_id"])
        for box, label, score in zip(xywh, det["labels"].cpu().tolist(), det["scores"].cpu().tolist()):
            records.append({"image_id": image_id, "category_id": int(label), "bbox": [round(v, 3) for v in box],
                            "score": round(score, 5)})
    return records
