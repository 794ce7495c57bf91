"""RF-DETR (transformers' ``RfDetrForObjectDetection``) loaded into vispe's ViT detector.

* At a square size: the same logits, boxes, per-layer and two-stage outputs within 1e-4, at the table's
  own grid and at a resampled one, every parameter perturbed.
* At a non-square size vispe's windows are rectangles and transformers' are not (a deliberate
  difference, ``tests/test_rfdetr_windows.py``): the outputs differ; with one window (no windowing)
  they agree again, which pins the difference on the windows alone.
* The DINOv2 table is resampled as transformers does (bicubic, antialias, by target size), checked
  against a copy of its formula on a non-square grid; or replaced by a vispe encoding by name.
"""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from tests._vit_detr_refs import max_errors, reference_outputs, rf_detr
from vispe.models.detr.vitdet import load_vit_detr
from vispe.models.detr.vitdet.table import resample_table
from vispe.models.detr.vitdet.vit import WindowedViT


@pytest.fixture(scope="module")
def ref():
    return rf_detr()


@pytest.fixture(scope="module")
def strong():
    return rf_detr(scale=0.1)


@pytest.mark.parametrize("scale", [0.02, 0.1])
@pytest.mark.parametrize("size", [48, 64])  # the table's own 6 x 6 grid, and 8 x 8 (resampled)
def test_rfdetr_parity_square(ref, strong, size, scale):
    ref = ref if scale == 0.02 else strong
    model = load_vit_detr(ref).eval()
    x = torch.randn(2, 3, size, size, generator=torch.Generator().manual_seed(1))
    r = reference_outputs(ref, x)
    with torch.no_grad():
        out = model(x)
    err = max_errors(out, r)
    assert max(err.values()) < 1e-4, err
    assert r["logits"].abs().max() > 0.1 and r["boxes"].std() > 1e-3


def test_rfdetr_non_square_differs_only_by_the_windows(ref):
    x = torch.randn(1, 3, 64, 96, generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        err = max_errors(load_vit_detr(ref).eval()(x), reference_outputs(ref, x))
    assert err["logits"] > 1e-2  # transformers' scattered windows (8 x 12 grid, 2 x 2 windows)
    one = rf_detr(num_windows=1)
    with torch.no_grad():
        err = max_errors(load_vit_detr(one).eval()(x), reference_outputs(one, x))
    assert max(err.values()) < 1e-4, err


def _reference_resample(table: torch.Tensor, h: int, w: int) -> torch.Tensor:
    """transformers 5.23 ``RfDetrDinov2Embeddings.interpolate_pos_encoding``, its patch part (copied formula)."""
    patch = table[:, 1:]
    n = int(patch.shape[1] ** 0.5)
    patch = patch.reshape(1, n, n, -1).permute(0, 3, 1, 2)
    patch = F.interpolate(patch.to(torch.float32), size=(h, w), mode="bicubic", align_corners=False, antialias=True)
    return patch.permute(0, 2, 3, 1)


@pytest.mark.parametrize("grid", [(4, 9), (9, 4), (12, 7)])
def test_table_resampled_as_transformers(grid):
    table = torch.randn(1, 1 + 36, 8, generator=torch.Generator().manual_seed(0))
    got = resample_table(table, grid, antialias=True)
    assert torch.allclose(got, _reference_resample(table, *grid), atol=1e-6)
    assert not torch.allclose(got, resample_table(table, grid, antialias=False), atol=1e-4)  # the flag is used
    assert torch.equal(resample_table(table, (6, 6), antialias=True)[0], table[0, 1:].reshape(6, 6, 8))


def test_rope_instead_of_the_table():
    """``encoding="rope_mixed"`` and no table: a window's output depends on its content only, not on where
    the window sits (RoPE scores depend on offsets); with the table it does depend on the place."""
    def block(**kw):
        torch.manual_seed(0)
        return WindowedViT(embed_dim=16, depth=1, num_heads=2, patch_size=4, num_windows=2, window_blocks=[0],
                           out_indices=[1], **kw).eval()

    tile = torch.randn(1, 3, 16, 24, generator=torch.Generator().manual_seed(3))
    x = torch.cat([torch.cat([tile, tile], 3), torch.cat([tile, tile], 3)], 2)  # (1, 3, 32, 48): 4 equal windows
    rope = block(encoding="rope_mixed", table_grid=None)
    assert rope.pos_embed is None and rope.blocks[0].attn.pe is not None
    with torch.no_grad():
        f = rope(x)[0][0][0]  # (C, 8, 12)
    assert torch.allclose(f[:, :4, :6], f[:, 4:, 6:], atol=1e-5)
    assert (f[:, :4, :6] - rope.patch_embed(tile)[0]).abs().max() > 1e-2  # the block did something
    with torch.no_grad():
        plain = block(table_grid=None)(x)[0][0][0]
    assert (f - plain).abs().max() > 1e-3  # and the rotation is in it
    with torch.no_grad():
        g = block(table_grid=4)(x)[0][0][0]
    assert (g[:, :4, :6] - g[:, 4:, 6:]).abs().max() > 1e-3


def test_load_with_an_encoding_instead_of_the_table(ref):
    model = load_vit_detr(ref, encoding="rope_mixed", table_grid=None).eval()
    assert model.backbone.pos_embed is None and model.backbone.blocks[0].attn.pe is not None
    x = torch.randn(1, 3, 48, 48, generator=torch.Generator().manual_seed(5))
    with torch.no_grad():  # the same weights otherwise: close to, not equal to, transformers' outputs
        assert max(max_errors(model(x), reference_outputs(ref, x)).values()) > 1e-4
        assert torch.equal(model.class_embed.weight, ref.class_embed.weight)
