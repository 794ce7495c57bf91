"""Export a ViT detector with symbolic height and width (``torch.export``), the fix users of
RF-DETR ask for (rf-detr #212: its exporter bakes the size in).

    ep = export_vit_detr(model)            # images (B, 3, H, W) -> (pred_logits, pred_boxes)
    logits, boxes = ep.module()(images)    # any H, W that are multiples of patch_size * num_windows

The batch is the example's (default 1; a symbolic batch left a guard that failed at batch 1 on
torch 2.14). H and W are exported as multiples of ``patch_size * num_windows`` (the windows are rectangles of the
patch grid), from the smallest grid whose tokens cover ``num_queries`` (the two-stage top-k) up to
``max_grid`` windows-rows per side. Nothing in the graph depends on the example's size: the table is
resampled at the input's grid, the windows are cut from it, the deformable levels stay symbolic.
Not exported: the padding mask (export a ``mask=None`` model: one image, or a batch of one size) and
the training-time groups (eval mode).
"""
from __future__ import annotations

import math

import torch
from torch import nn
from torch.export import Dim

from vispe.models.detr.vitdet.model import ViTDETR


class _Boxes(nn.Module):
    """``images`` -> (pred_logits (B, Q, K), pred_boxes (B, Q, 4)): the exported signature."""

    def __init__(self, model: ViTDETR) -> None:
        super().__init__()
        self.model = model

    def forward(self, images: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        out = self.model(images)
        return out["pred_logits"], out["pred_boxes"]


def export_vit_detr(model: ViTDETR, example: torch.Tensor | None = None, *,
                    max_grid: int = 64) -> torch.export.ExportedProgram:
    """``torch.export.export`` of ``model`` (eval mode) with symbolic H and W (module docstring)."""
    if not isinstance(model, ViTDETR):
        raise ValueError(f"model is a {type(model).__name__}: expected vispe's ViTDETR")
    b = model.backbone
    unit = b.patch_size * b.num_windows  # pixels per window row / column
    low = max(1, math.ceil(math.sqrt(model.num_queries) / b.num_windows))
    if max_grid < low:
        raise ValueError(f"max_grid={max_grid}: expected at least {low} (num_queries={model.num_queries} tokens)")
    if example is None:
        example = torch.randn(1, 3, unit * (low + 1), unit * (low + 2))
    kh, kw = Dim("rows", min=low, max=max_grid), Dim("cols", min=low, max=max_grid)
    shapes = {"images": {2: unit * kh, 3: unit * kw}}
    was = model.training
    model.eval()
    try:
        return torch.export.export(_Boxes(model), (example,), dynamic_shapes=shapes, strict=False)
    finally:
        model.train(was)
