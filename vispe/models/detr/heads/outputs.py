"""The detectors' output dict, and the extra (denoising) queries a strategy may run before the matching ones.

    {"pred_logits": (B, Q, K | K+1), "pred_boxes": (B, Q, 4), "class_head": "softmax" | "sigmoid",
     "aux_outputs": [{"pred_logits", "pred_boxes", "class_head"} of layers 0 .. L-2]   (aux_loss=True),
     "enc_outputs": {...}                                                             (two-stage),
     "dn_outputs": {"pred_logits", "pred_boxes", "class_head", "aux_outputs", "meta"}   (extra queries)}

Extra queries (``queries.ExtraQueries``, e.g. DN-DETR / DINO's denoising groups built from the targets)
go first in the decoder: ``with_extra_queries`` puts their content and anchors before the Q matching
queries and turns their mask (True = blocked, DINO's convention) into the self-attention's (True = may
attend, scaled_dot_product_attention's); ``outputs_dict`` splits every layer's predictions back, the
first D into ``dn_outputs`` (with the strategy's ``meta`` for the loss), the rest as usual, so the set
loss and the matcher see the Q matching queries only.
"""
from __future__ import annotations

import torch


def with_extra_queries(t: torch.Tensor, anchors, extra):
    """(queries (B, D + Q, d), anchors (B, D + Q, 4), self-attention mask (D + Q, D + Q) True = may attend,
    or None) with ``extra``'s D queries first; ``t``, ``anchors``, None unchanged without extras."""
    if extra is None:
        return t, anchors, None
    B, Q, d = t.shape
    D = extra.content.shape[1]
    if extra.content.shape != (B, D, d):
        raise ValueError(f"extra queries' content has shape {tuple(extra.content.shape)}: expected ({B}, D, {d})")
    if anchors is None or anchors.shape[-1] != extra.anchors.shape[-1] or extra.anchors.shape[:2] != (B, D):
        have = None if anchors is None else tuple(anchors.shape)
        raise ValueError(f"extra queries' anchors have shape {tuple(extra.anchors.shape)}: expected ({B}, {D}, n) "
                         f"beside the matching queries' anchors {have} (a design with anchors of the same size)")
    mask = None
    if extra.attn_mask is not None:
        if extra.attn_mask.shape != (D + Q, D + Q) or extra.attn_mask.dtype != torch.bool:
            raise ValueError(f"extra queries' attn_mask is {extra.attn_mask.dtype} {tuple(extra.attn_mask.shape)}: "
                             f"expected bool ({D + Q}, {D + Q}), True = blocked")
        mask = ~extra.attn_mask
    anchors = torch.cat([extra.anchors.to(anchors.dtype), anchors.expand(B, -1, -1)], 1)  # (B, D + Q, 4)
    return torch.cat([extra.content.to(t.dtype), t], 1), anchors, mask


def outputs_dict(logits, boxes, class_head: str, aux_loss: bool, extra=None) -> dict:
    """The output dict (module docstring) of every kept layer's ``logits`` [(B, Q', K)] and ``boxes``
    (L, B, Q', 4), the last layer's first; with ``extra``, its first D queries go to ``dn_outputs``."""
    def pack(lg, bx):
        out = {"pred_logits": lg[-1], "pred_boxes": bx[-1], "class_head": class_head}
        if aux_loss:
            out["aux_outputs"] = [{"pred_logits": a, "pred_boxes": b, "class_head": class_head}
                                  for a, b in zip(lg[:-1], bx[:-1])]
        return out

    if extra is None:
        return pack(logits, boxes)
    D = extra.content.shape[1]
    out = pack([lg[:, D:] for lg in logits], [b[:, D:] for b in boxes])
    out["dn_outputs"] = {**pack([lg[:, :D] for lg in logits], [b[:, :D] for b in boxes]), "meta": extra.meta}
    return out
