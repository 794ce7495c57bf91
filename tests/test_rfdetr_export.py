"""The loaded RF-DETR exported with symbolic height and width (``torch.export``) gives the eager
model's logits and boxes within 1e-4 at sizes other than the example's, square and not."""
from __future__ import annotations

import pytest
import torch

from tests._vit_detr_refs import rf_detr
from vispe.models.detr.vitdet import load_vit_detr
from vispe.models.detr.vitdet.export import export_vit_detr


@pytest.mark.slow
def test_export_dynamic_size_equals_eager():
    model = load_vit_detr(rf_detr()).eval()
    ep = export_vit_detr(model)  # example 1 x 3 x 64 x 80 (unit 16: patch 8, 2 windows)
    for size in [(64, 64), (48, 112), (96, 64)]:
        x = torch.randn(1, 3, *size, generator=torch.Generator().manual_seed(sum(size)))
        with torch.no_grad():
            out = model(x)
            logits, boxes = ep.module()(x)
        assert (logits - out["pred_logits"]).abs().max() < 1e-4
        assert (boxes - out["pred_boxes"]).abs().max() < 1e-4
        assert out["pred_logits"].std() > 1e-2


def test_export_refuses_too_small_a_grid():
    model = load_vit_detr(rf_detr()).eval()
    with pytest.raises(ValueError, match="max_grid=1: expected at least 3"):
        export_vit_detr(model, max_grid=1)
