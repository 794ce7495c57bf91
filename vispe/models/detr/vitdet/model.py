"""The ViT real-time detector: LW-DETR (Chen et al., 2024) and RF-DETR (Robinson et al., ICLR 2026).

Data flow (d = d_model, L levels = scale factors, Q queries, G Group-DETR groups in training)::

    images (B, 3, H, W) [+ mask (B, H, W), True = padding]
      -> backbone: windowed ViT (``vit.WindowedViT``), grids after chosen blocks [(B, C, h, w)]
      -> projector: C2f per scale factor (``projector.MultiScaleProjector``) -> maps [(B, d, h_l, w_l)]
         (no transformer encoder: the projector's maps are the memory)
      -> queries: Group-DETR two-stage selection (``queries.GroupTwoStageQueries``) -> content, boxes (B, G*Q, .)
      -> decoder: deformable layers around fixed reference boxes (``decoder.LiteDecoder``)
      -> heads: class_embed (K logits, sigmoid), bbox_embed refining the reference boxes, every layer
    -> {"pred_logits", "pred_boxes", "class_head": "sigmoid", "aux_outputs", "enc_outputs"}

Position: the backbone's (a learned table resampled to the grid, or any vispe encoding by name), the
decoder's boxes; no 2D code on the memory (deformable attention samples at the boxes). Training runs all
G groups (block-diagonal self-attention); eval the first.
"""
from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from vispe.coords import valid_ratios
from vispe.kernels.deformable import Levels
from vispe.models.detr.mlp import MLP
from vispe.models.detr.vitdet.decoder import LiteDecoder, refine
from vispe.models.detr.vitdet.projector import MultiScaleProjector
from vispe.models.detr.vitdet.queries import GroupTwoStageQueries, group_mask
from vispe.models.detr.vitdet.vit import WindowedViT


class ViTDETR(nn.Module):
    """The detector (module docstring). Built by ``vitdet.build.create_vit_detr`` or ``load_detr``."""

    def __init__(self, backbone: WindowedViT, projector: MultiScaleProjector, queries: GroupTwoStageQueries,
                 decoder: LiteDecoder, num_classes: int, aux_loss: bool = True) -> None:
        super().__init__()
        self.backbone, self.projector, self.queries, self.decoder = backbone, projector, queries, decoder
        d = decoder.d_model
        self.class_embed = nn.Linear(d, num_classes)
        self.bbox_embed = MLP(d, d, 4, 3)
        self.num_classes, self.aux_loss = num_classes, aux_loss
        self.num_queries = queries.num_queries

    def forward(self, images: torch.Tensor, mask: torch.Tensor | None = None) -> dict[str, Any]:
        """``images`` (B, 3, H, W), ``mask`` (B, H, W) True = padding -> the output dict (module docstring)."""
        B, _, H, W = images.shape
        if mask is not None and (mask.shape != (B, H, W) or mask.dtype != torch.bool):
            raise ValueError(f"mask has shape {tuple(mask.shape)} and dtype {mask.dtype}: expected a torch.bool "
                             f"({B}, {H}, {W}) tensor, True = padding")
        feats, _ = self.backbone(images, mask)
        maps = self.projector(feats, mask)  # [(B, d, h_l, w_l)]
        pixel = mask if mask is not None else torch.zeros(B, H, W, dtype=torch.bool, device=images.device)
        masks = [F.interpolate(pixel[:, None].float(), size=m.shape[-2:])[:, 0].bool() for m in maps]
        levels = Levels.of(maps)
        memory = levels.flatten(maps)  # (B, N, d)
        kpm = torch.cat([m.flatten(1) for m in masks], 1)  # (B, N)
        ratios = valid_ratios(masks).to(memory.dtype)  # (B, L, 2) (y, x)
        content, ref, enc_logits, enc_boxes = self.queries(memory, kpm, levels)
        G = self.queries.active_groups()
        self_mask = group_mask(G, self.num_queries, images.device) if G > 1 else None
        hs = self.decoder(content, ref, memory, levels, ratios, kpm, self_mask)  # (L, B, G*Q, d)
        logits = self.class_embed(hs)  # (L, B, G*Q, K)
        boxes = refine(ref, self.bbox_embed(hs))  # (L, B, G*Q, 4)
        out: dict[str, Any] = {"pred_logits": logits[-1], "pred_boxes": boxes[-1], "class_head": "sigmoid"}
        if self.aux_loss:
            out["aux_outputs"] = [{"pred_logits": a, "pred_boxes": b, "class_head": "sigmoid"}
                                  for a, b in zip(logits[:-1], boxes[:-1])]
        # the two-stage predictions learn the true classes (LW-DETR's, DINO's), not class-agnostic proposals
        out["enc_outputs"] = {"pred_logits": enc_logits, "pred_boxes": enc_boxes, "class_head": "sigmoid",
                              "classes": True}
        out["groups"] = G
        return out

    class_head = "sigmoid"

    @property
    def stride(self) -> int:
        """Pixels per window row / column: batches are padded to a multiple (windows over the padded grid)."""
        return self.backbone.patch_size * self.backbone.num_windows

    def param_groups(self, lr: float, lr_backbone: float, weight_decay: float) -> list[dict[str, Any]]:
        """The backbone at ``lr_backbone``, the rest at ``lr`` (the train loop's optimiser groups)."""
        named = [(n, p) for n, p in self.named_parameters() if p.requires_grad]
        return [{"params": [p for n, p in named if not n.startswith("backbone.")], "lr": lr, "weight_decay": weight_decay},
                {"params": [p for n, p in named if n.startswith("backbone.")], "lr": lr_backbone,
                 "weight_decay": weight_decay}]

    def wrap_criterion(self, criterion: nn.Module) -> nn.Module:
        """``criterion`` applied to each Group-DETR group apart (``task.GroupCriterion``)."""
        from vispe.models.detr.vitdet.task import GroupCriterion
        return GroupCriterion(criterion)
