"""DINO's positional queries: ``p_q = ref_point_head(A(b))`` of each query's reference box ``b`` at every
decoder layer (IDEA-Research/DINO ``TransformerDecoder``: ``gen_sineembed_for_position`` then the MLP).

``A`` is the detector's anchor code, any additive encoding that can be evaluated at unit coordinates
(``vispe.models.detr.queries.positioned.build_anchor_pe``): ``A(cx, cy, w, h) = [A(cy, cx), A(w, h)]``, y channels
first. The default, ``sine`` at temperature 10000 with scale 2 pi and d_model / 2 interleaved features
per coordinate, is DINO's ``gen_sineembed_for_position`` (128 per coordinate at d_model 256), as
``tests/test_dino_parts.py`` checks against a copy of it.

The boxes are in units of each image's valid area (batch-invariant); DINO codes them scaled by level
0's valid ratio (units of the padded canvas), the same on an unpadded image.
"""
from __future__ import annotations

import torch
from torch import nn

from vispe.models.detr.mlp import MLP


class DinoQueryPos(nn.Module):
    """``p_q = ref_point_head(A(boxes))`` (module docstring); ``ref_point_head``: MLP(2d, d, d, 2)."""

    def __init__(self, d_model: int, anchor_pe: nn.Module) -> None:
        super().__init__()
        self.d_model, self.anchor_pe = d_model, anchor_pe
        self.ref_point_head = MLP(2 * d_model, d_model, d_model, 2)

    def code(self, boxes: torch.Tensor) -> torch.Tensor:
        """``[A(cy, cx), A(w, h)]`` of unit (cx, cy, w, h) ``boxes`` (B, T, 4).  # (B, T, 2d)"""
        if boxes.shape[-1] != 4:
            raise ValueError(f"boxes {tuple(boxes.shape)}: expected (..., 4) unit (cx, cy, w, h)")
        return torch.cat([self.anchor_pe.at(boxes[..., [1, 0]]), self.anchor_pe.at(boxes[..., 2:])], -1)

    def forward(self, boxes: torch.Tensor, dtype: torch.dtype | None = None) -> torch.Tensor:
        """Positional queries of ``boxes`` (B, T, 4).  # (B, T, d)"""
        code = self.code(boxes.float())
        return self.ref_point_head(code.to(dtype or self.ref_point_head.layers[0].weight.dtype))
