"""Splitting the decoder's outputs into the denoising groups' and the matching queries'
(IDEA-Research/DINO ``dn_post_process``): every query of the decoder is ``[denoising (pad_size) |
matching (Q)]`` (``vispe.models.detr.queries.dn.groups``)."""
from __future__ import annotations

import torch


def dn_post_process(logits: torch.Tensor, boxes: torch.Tensor, pad_size: int,
                    aux_loss: bool = True) -> tuple[torch.Tensor, torch.Tensor, dict | None]:
    """Per-layer ``logits`` (L, B, P + Q, K) and ``boxes`` (L, B, P + Q, 4) -> the matching queries'
    (L, B, Q, K), (L, B, Q, 4) and the denoising outputs {"pred_logits" (B, P, K), "pred_boxes" (B, P, 4)
    of the last layer, "aux_outputs": the layers before it (with ``aux_loss``)}, None when ``pad_size``
    is 0 (a batch without boxes: nothing to split)."""
    if logits.dim() != 4 or boxes.shape[:3] != logits.shape[:3] or boxes.shape[-1] != 4:
        raise ValueError(f"logits {tuple(logits.shape)} and boxes {tuple(boxes.shape)}: expected (L, B, T, K) "
                         "and (L, B, T, 4)")
    if not 0 <= pad_size <= logits.shape[2]:
        raise ValueError(f"pad_size={pad_size}: expected a count in [0, {logits.shape[2]}] (the decoder's queries)")
    if pad_size == 0:
        return logits, boxes, None
    dn_logits, dn_boxes = logits[:, :, :pad_size], boxes[:, :, :pad_size]
    out: dict = {"pred_logits": dn_logits[-1], "pred_boxes": dn_boxes[-1]}
    if aux_loss:
        out["aux_outputs"] = [{"pred_logits": a, "pred_boxes": b} for a, b in zip(dn_logits[:-1], dn_boxes[:-1])]
    return logits[:, :, pad_size:], boxes[:, :, pad_size:], out
