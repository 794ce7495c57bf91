"""LW-DETR (transformers' ``LwDetrForObjectDetection``) loaded into vispe's ViT detector: the same logits,
boxes, per-layer (auxiliary) and two-stage outputs within 1e-4, at a square and a non-square size (its
window reshape is correct in transformers), every parameter perturbed; ``load_detr`` takes the model or
its state_dict with its config."""
from __future__ import annotations

import typing

import pytest
import torch

from tests._vit_detr_refs import lw_detr, max_errors, reference_outputs
from vispe.models.detr import load_detr
from vispe.models.detr.vitdet import ViTDETR, load_vit_detr


@pytest.fixture(scope="module")
def ref():
    return lw_detr()


@pytest.fixture(scope="module")
def strong():
    return lw_detr(scale=0.1)


@pytest.mark.parametrize("scale", [0.02, 0.1])
@pytest.mark.parametrize("size", [(64, 64), (64, 96)])
def test_lwdetr_parity(ref, strong, size, scale):
    ref = ref if scale == 0.02 else strong
    model = load_vit_detr(ref).eval()
    x = torch.randn(2, 3, *size, generator=torch.Generator().manual_seed(1))
    r = reference_outputs(ref, x)
    with torch.no_grad():
        out = model(x)
    err = max_errors(out, r)
    assert max(err.values()) < 1e-4, err
    assert r["layer_logits"].shape[0] == 2 and r["logits"].abs().max() > 0.1  # two layers, non-trivial logits
    assert r["boxes"].std() > 1e-3


def test_lwdetr_parity_with_padding(strong):
    """A padded batch: the decoder's valid ratios, the masked values and the proposals on the valid area."""
    ref = strong
    model = load_vit_detr(ref).eval()
    x = torch.randn(2, 3, 64, 96, generator=torch.Generator().manual_seed(2))
    mask = torch.zeros(2, 64, 96, dtype=torch.bool)
    mask[1, 48:] = True
    mask[1, :, 64:] = True
    err = max_errors(model(x, mask), reference_outputs(ref, x, mask))
    assert max(err.values()) < 1e-4, err


def test_load_detr_dispatch(ref):
    """``load_detr`` takes transformers' model, or its state_dict with its config; its return annotation
    names the class it returns (mypy and readers trust it)."""
    x = torch.randn(1, 3, 64, 64, generator=torch.Generator().manual_seed(3))
    a = load_detr(ref)
    b = load_detr(ref.state_dict(), ref.config)
    assert isinstance(a, ViTDETR) and isinstance(b, ViTDETR)
    assert ViTDETR in typing.get_args(typing.get_type_hints(load_detr)["return"])
    with torch.no_grad():
        assert torch.equal(a.eval()(x)["pred_logits"], b.eval()(x)["pred_logits"])


def test_load_refuses_a_wrong_state(ref):
    state = dict(ref.state_dict())
    state.pop("class_embed.bias")
    with pytest.raises(ValueError, match="missing"):
        load_vit_detr(state, ref.config)
    with pytest.raises(ValueError, match="expected config"):
        load_vit_detr(ref.state_dict())
    extra = {**ref.state_dict(), "model.decoder.extra_head.weight": torch.zeros(2)}
    with pytest.raises(ValueError, match=r"no rule knows: \['model\.decoder\.extra_head\.weight'\]"):
        load_vit_detr(extra, ref.config)
