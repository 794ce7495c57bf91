"""Mask-aware ViT detectors: an image alone equals the same image padded in a batch (windows cut from its
valid area, the table resampled to it, padded keys hidden, padded cells zeroed in the projector), where
its valid patch grid is divisible by the window grid; a ValueError where it is not."""
from __future__ import annotations

import pytest
import torch

from vispe.models.detr.vitdet import create_vit_detr


def _model(flavour: str, **kw):
    torch.manual_seed(0)
    model = create_vit_detr(flavour=flavour, num_classes=3, embed_dim=32, depth=4, num_heads=2, patch_size=8,
                            num_windows=2, table_grid=6, d_model=32, num_queries=10, groups=2, **kw).eval()
    with torch.no_grad():  # away from the zero / constant initialisations
        for p in model.parameters():
            p.add_(0.1 * torch.randn_like(p))
    return model


def _alone_and_padded(model):
    g = torch.Generator().manual_seed(1)
    x = torch.randn(1, 3, 64, 96, generator=g)  # 8 x 12 patches: windows of 4 x 6
    batch = torch.randn(2, 3, 96, 128, generator=g)
    batch[0] = 0.0
    batch[0, :, :64, :96] = x[0]
    mask = torch.zeros(2, 96, 128, dtype=torch.bool)
    mask[0, 64:] = True
    mask[0, :, 96:] = True
    with torch.no_grad():
        return model(x), model(batch, mask)


@pytest.mark.parametrize("flavour", ["rfdetr", "lwdetr"])
def test_alone_equals_padded(flavour):
    alone, padded = _alone_and_padded(_model(flavour, mask_aware=True))
    for key in ("pred_logits", "pred_boxes"):
        assert torch.allclose(alone[key][0], padded[key][0], atol=1e-4), (key, (alone[key][0] - padded[key][0]).abs().max())
    enc_a, enc_p = alone["enc_outputs"], padded["enc_outputs"]
    assert torch.allclose(enc_a["pred_boxes"][0], enc_p["pred_boxes"][0], atol=1e-4)
    assert torch.allclose(alone["aux_outputs"][0]["pred_logits"][0], padded["aux_outputs"][0]["pred_logits"][0], atol=1e-4)


def test_without_mask_awareness_the_padding_shows():
    alone, padded = _alone_and_padded(_model("rfdetr", mask_aware=False))
    assert (alone["pred_logits"][0] - padded["pred_logits"][0]).abs().max() > 1e-3


def test_valid_grid_not_divisible_is_refused():
    model = _model("rfdetr", mask_aware=True)
    mask = torch.zeros(1, 64, 96, dtype=torch.bool)
    mask[:, 56:] = True  # 7 valid rows of patches, 2 windows per side
    with pytest.raises(ValueError, match=r"valid patch grids \[\(7, 12\)\].*num_windows=2"):
        model(torch.randn(1, 3, 64, 96), mask)
