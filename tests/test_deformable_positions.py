"""Multi-scale positions of Deformable DETR: valid ratios and reference points (vispe.coords), the sine
with offset -0.5 (vispe's ``sine``) and the level embedding (LevelPositions), against transformers'
functions, position by position on non-square padded maps."""
import pytest
import torch
from transformers.models.deformable_detr.modeling_deformable_detr import (
    DeformableDetrEncoder,
    DeformableDetrModel,
    DeformableDetrSinePositionEmbedding,
)

import vispe
from vispe.coords import level_reference_points, points_at_levels, resize_mask, valid_ratios
from vispe.kernels.deformable import Levels
from vispe.models.detr.neck.level_pos import DEFORMABLE_SINE, LevelPositions
from vispe.registry import build_in

STRIDES = (8, 16, 32, 64)


def padded_masks(H=128, W=192, valid=((128, 192), (64, 128))):
    """Pixel masks of a batch (True = padding, at the bottom / right) and their levels (nearest)."""
    mask = torch.ones(len(valid), H, W, dtype=torch.bool)
    for b, (h, w) in enumerate(valid):
        mask[b, :h, :w] = False
    return mask, [resize_mask(mask, (H // s, W // s)) for s in STRIDES]


def test_valid_ratios_equal_transformers_get_valid_ratio_in_hw_order():
    _, masks = padded_masks(valid=((128, 192), (64, 128), (72, 40)))
    ratios = valid_ratios(masks)  # (B, L, 2) as (h, w)
    theirs = torch.stack([DeformableDetrModel.get_valid_ratio(None, ~m) for m in masks], 1)  # (w, h), True = valid
    torch.testing.assert_close(ratios, theirs.flip(-1), rtol=0, atol=0)
    torch.testing.assert_close(ratios[2, 0], torch.tensor([72 / 128, 40 / 192]))  # level 0 of the third image


def test_encoder_reference_points_equal_transformers_in_yx_order():
    _, masks = padded_masks(valid=((128, 192), (64, 128), (72, 40)))
    shapes = [tuple(m.shape[-2:]) for m in masks]
    ratios = valid_ratios(masks)
    ours = level_reference_points(shapes, ratios)  # (B, N, L, 2) as (y, x)
    theirs = DeformableDetrEncoder.get_reference_points(shapes, ratios.flip(-1), device="cpu")  # (x, y)
    assert ours.shape == (3, sum(h * w for h, w in shapes), 4, 2)
    torch.testing.assert_close(ours, theirs.flip(-1), rtol=0, atol=1e-7)


def test_reference_points_of_an_image_alone_and_padded_in_a_batch_sample_the_same_cells():
    """On every level l', a valid token's point in cells of l' (unit point times the map's (h, w)) is
    the same for the image alone (64 x 128 pixels) and padded into a 128 x 192 batch."""
    _, alone = padded_masks(H=64, W=128, valid=((64, 128),))
    _, batch = padded_masks(valid=((128, 192), (64, 128)))
    pts = []
    for masks in (alone, batch):
        shapes = [tuple(m.shape[-2:]) for m in masks]
        cells = level_reference_points(shapes, valid_ratios(masks)) * torch.tensor(shapes).float()[None, None]
        valid = Levels(tuple(shapes)).flatten(masks)[-1] == 0  # the image's own valid tokens
        pts.append(cells[-1][valid])  # (n_valid, L, 2) in cells of every level, row-major per level
    torch.testing.assert_close(pts[1], pts[0], rtol=0, atol=1e-5)


def test_points_at_levels_is_the_papers_decoder_input():
    _, masks = padded_masks(valid=((128, 192), (64, 128)))
    ratios = valid_ratios(masks)
    ref = torch.rand(2, 5, 4)  # (cy, cx, h, w)
    xy = ref[..., [1, 0, 3, 2]]
    theirs = xy[:, :, None] * torch.cat([ratios.flip(-1), ratios.flip(-1)], -1)[:, None]  # transformers' decoder
    torch.testing.assert_close(points_at_levels(ref, ratios), theirs[..., [1, 0, 3, 2]], rtol=0, atol=0)
    theirs2 = xy[..., :2][:, :, None] * ratios.flip(-1)[:, None]
    torch.testing.assert_close(points_at_levels(ref[..., :2], ratios), theirs2.flip(-1), rtol=0, atol=0)


def test_vispe_sine_with_offset_is_deformable_detrs_position_by_position():
    """``sine`` with DEFORMABLE_SINE equals DeformableDetrSinePositionEmbedding (offset -0.5, normalize,
    scale 2 pi, temperature 10000) on a non-square map with a padded image, every position and channel."""
    d = 32
    _, masks = padded_masks(valid=((128, 192), (72, 40)))
    ours_pe = vispe.build("sine", dim=d, **DEFORMABLE_SINE)
    theirs_pe = DeformableDetrSinePositionEmbedding(d // 2, normalize=True)
    for m in masks:
        B, h, w = m.shape
        theirs = theirs_pe((B, d, h, w), "cpu", torch.float32, mask=~m)  # (B, d, h, w), transformers: True = valid
        ours = ours_pe((h, w), m).view(B, h, w, d).permute(0, 3, 1, 2)
        valid = ~m[:, None].expand_as(ours)
        # valid cells: equal to float rounding (6e-8); padded cells of an all-padding column divide by eps (both)
        # and take the sine of ~-3e6, where float32 rounding differs by up to 6e-3 (their keys are masked)
        torch.testing.assert_close(ours[valid], theirs[valid], rtol=0, atol=1e-6)
    assert h != w


def test_level_positions_add_the_level_embedding_to_each_levels_code():
    d = 16
    _, masks = padded_masks(valid=((128, 192), (72, 40)))
    levels = Levels.of(masks)
    pe = vispe.build("sine", dim=d, **DEFORMABLE_SINE)
    lp = LevelPositions(pe, d, 4)
    out = lp(levels, masks)
    assert out.shape == (2, levels.num_tokens, d)
    for l, (m, s) in enumerate(zip(masks, levels.start)):
        n = m.shape[1] * m.shape[2]
        torch.testing.assert_close(out[:, s:s + n], pe(tuple(m.shape[-2:]), m) + lp.level_embed[l], rtol=0, atol=0)
    assert lp.level_embed.std() > 0.5  # N(0, 1) as the papers
    none = LevelPositions(pe, d, 4, level_pe=None)
    assert none.level_embed is None and "level_embed" not in none.state_dict()
    torch.testing.assert_close(none(levels, masks), out - torch.cat([lp.level_embed[l].expand(m[0].numel(), d)
                                                                   for l, m in enumerate(masks)])[None])
    assert LevelPositions(None, d, 4, level_pe=None)(levels, masks) is None


@pytest.mark.parametrize("name", ["rope_axial", "relbias"])
def test_encodings_without_an_additive_code_are_refused_with_the_reason(name):
    pe = build_in(name, dict(dim=16, num_heads=2, head_dim=8, num_prefix_tokens=0, grid=(4, 4)))
    with pytest.raises(ValueError, match="no query-key dot product"):
        LevelPositions(pe, 16, 4)


def test_level_positions_bad_options():
    with pytest.raises(ValueError, match="level_pe"):
        LevelPositions(None, 16, 4, level_pe="sine")
    with pytest.raises(ValueError, match="dim=8"):
        LevelPositions(vispe.build("sine", dim=8), 16, 4)
    with pytest.raises(ValueError, match="num_levels=4"):
        LevelPositions(None, 16, 4)(Levels(((2, 3),)))
