"""LookHere (issue 38) against a faithful copy of its reference's bias formula (GreenCUBIC/lookhere,
``lookhere.py``: ``create_lh_layer_tensor`` / ``create_lh_bias_tensor``), on a non-square grid,
element by element; its head plan, layer slopes, masked logits and padding behaviour."""
from __future__ import annotations

from itertools import groupby

import numpy as np
import pytest
import torch
from scipy.spatial.distance import cdist, pdist, squareform

from vispe.image.lookhere import MASKED, LookHere, head_plan
from vispe.models.vit import create_vit


# --- the reference, as written (numpy), for one layer ----------------------------------------------
def get_none_slopes(n):
    slopes = [0.25, 0.0625, 0.015625, 0.00390625]
    if n == 2:
        return slopes[:2]
    elif n == 4:
        return slopes
    else:
        return np.repeat(slopes, n // 4)


def get_slopes(n):
    return np.repeat(np.exp2(-np.arange(1, n / 4 + 1)), 4)


DIR_SHORT_HAND = {
    "none": [[]] * 4, "zero": [["zero"]] * 4, "none1zero3": [[]] + [["zero"]] * 3,
    "none2zero2": [[]] * 2 + [["zero"]] * 2, "none3zero1": [[]] * 3 + [["zero"]], "center": [["center"]] * 4,
    "halves": [["up"], ["down"], ["left"], ["right"]],
    "corners": [["up", "left"], ["up", "right"], ["down", "left"], ["down", "right"]],
    "triangles": [["tri_up"], ["tri_down"], ["tri_left"], ["tri_right"]],
    "diagonals": [["diag_up_right"], ["diag_up_left"], ["diag_down_right"], ["diag_down_left"]],
    "eighths1": [["tri_up", "left"], ["tri_down", "left"], ["tri_left", "up"], ["tri_right", "up"]],
    "eighths2": [["tri_up", "right"], ["tri_down", "right"], ["tri_left", "down"], ["tri_right", "down"]],
    "zerohalves": [["zero", "up"], ["zero", "down"], ["zero", "left"], ["zero", "right"]],
    "zerocorners": [["zero", "up", "left"], ["zero", "up", "right"], ["zero", "down", "left"], ["zero", "down", "right"]],
    "zerotriangles": [["zero", "tri_up"], ["zero", "tri_down"], ["zero", "tri_left"], ["zero", "tri_right"]],
}


def create_lh_layer_tensor(grid_size, direction, num_heads, distance="linear", fill_with="inf"):
    sh = direction.split("-")
    dirs = [DIR_SHORT_HAND[s] for s in sh]
    if num_heads == 6:
        head_names = [sh[0]] * 4 + [sh[1]] * 2
        head_directions = dirs[0] + dirs[1][:2]
    elif len(sh) == 1:
        head_names = [sh[0]] * num_heads
        head_directions = dirs[0] * (num_heads // 4)
    elif len(sh) == 2 and num_heads == 12:
        head_names = [sh[0]] * 8 + [sh[1]] * 4
        head_directions = dirs[0] * 2 + dirs[1]
    elif len(sh) == 2 and num_heads == 16:
        head_names = [sh[0]] * 8 + [sh[1]] * 8
        head_directions = dirs[0] * 2 + dirs[1] * 2
    elif len(sh) == 3 and num_heads == 12:
        head_names = [sh[0]] * 4 + [sh[1]] * 4 + [sh[2]] * 4
        head_directions = dirs[0] + dirs[1] + dirs[2]
    elif len(sh) == 3 and num_heads == 16:
        head_names = [sh[0]] * 8 + [sh[1]] * 4 + [sh[2]] * 4
        head_directions = dirs[0] * 2 + dirs[1] + dirs[2]
    elif len(sh) == 4 and num_heads == 16:
        head_names = [sh[0]] * 4 + [sh[1]] * 4 + [sh[2]] * 4 + [sh[3]] * 4
        head_directions = dirs[0] + dirs[1] + dirs[2] + dirs[3]
    head_slopes = []
    for k, v in groupby(head_names):
        if ("zero" in k) or ("center" in k) or ("none" in k):
            head_slopes.append(get_none_slopes(len(list(v))))
        else:
            head_slopes.append(get_slopes(len(list(v))))
    head_slopes = np.concatenate(head_slopes)
    grid_y, grid_x = grid_size
    num_patch = grid_x * grid_y
    grid_locs = np.meshgrid(range(grid_x), range(grid_y))
    coords = np.stack(grid_locs, axis=-1).reshape((-1, 2))
    center_location = np.array([(grid_x - 1) / 2, (grid_y - 1) / 2], ndmin=2)
    center_map = np.repeat(cdist(center_location, coords, "euclidean"), num_patch, axis=0)
    zero_map = np.zeros_like(center_map)
    compare_x = np.expand_dims(np.arange(grid_x), (1, 2))
    compare_y = np.expand_dims(np.arange(grid_y), (1, 2))
    direction_mask = {
        "right": np.less(grid_locs[0], compare_x)[coords[:, 0]],
        "left": np.greater(grid_locs[0], compare_x)[coords[:, 0]],
        "up": np.greater(grid_locs[1], compare_y)[coords[:, 1]],
        "down": np.less(grid_locs[1], compare_y)[coords[:, 1]],
    }
    diag_coord_ud, diag_label_ud, diag_coord_lr, diag_label_lr = [], [], [], []
    max_dia = np.max((grid_x, grid_y))
    for i in range(-max_dia + 1, max_dia):
        d = np.vstack([np.diag(grid_locs[0], i), np.diag(grid_locs[1], i)])
        diag_label_ud.append(i * np.ones(d.shape[1]))
        diag_coord_ud.append(d)
        d = np.vstack([np.diag(np.fliplr(grid_locs[0]), i), np.diag(np.fliplr(grid_locs[1]), i)])
        diag_label_lr.append(i * np.ones(d.shape[1]))
        diag_coord_lr.append(d)
    diag_coord_ud = np.concatenate(diag_coord_ud, axis=1).T
    diag_label_ud = np.concatenate(diag_label_ud).T
    diag_coord_lr = np.concatenate(diag_coord_lr, axis=1).T
    diag_label_lr = np.concatenate(diag_label_lr).T
    triangles = {dir: np.ones((num_patch, num_patch), dtype=bool) for dir in ["up", "down", "left", "right"]}
    for i in range(coords.shape[0]):
        diag_pos = diag_label_ud[np.all(coords[[i], :] == diag_coord_ud[:, :2], axis=1)]
        diag_neg = diag_label_lr[np.all(coords[[i], :] == diag_coord_lr[:, :2], axis=1)]
        trid = np.tri(grid_y, grid_x, k=diag_pos[0], dtype=bool)
        triu = ~np.tri(grid_y, grid_x, k=diag_pos[0] - 1, dtype=bool)
        trir = np.fliplr(np.tri(grid_y, grid_x, k=diag_neg[0], dtype=bool))
        tril = ~np.fliplr(np.tri(grid_y, grid_x, k=diag_neg[0] - 1, dtype=bool))
        triangles["up"][i, :] = ~(triu & tril).flatten()
        triangles["down"][i, :] = ~(trid & trir).flatten()
        triangles["right"][i, :] = ~(triu & trir).flatten()
        triangles["left"][i, :] = ~(trid & tril).flatten()
    m = squareform(pdist(coords, "euclidean"))
    lh = np.tile(m, (num_heads, 1, 1))
    if distance == "sqrt":
        lh = lh ** 0.5
    elif distance == "square":
        lh = lh ** 2
    for h in range(num_heads):
        dir_mask = np.zeros_like(m, dtype=bool)
        for dir in head_directions[h]:
            if dir == "center":
                lh[h, :] = center_map
            elif dir == "zero":
                lh[h, :] = zero_map
            elif "tri" in dir:
                dir_mask = dir_mask | triangles[dir.split("_")[1]]
            elif "diag" in dir:
                dir_mask = dir_mask | (triangles[dir.split("_")[1]] & triangles[dir.split("_")[2]])
            else:
                dir_mask = dir_mask | direction_mask[dir].reshape((num_patch, -1))
            if fill_with == "inf":
                lh[h, dir_mask] = np.inf
            elif fill_with == "zero":
                lh[h, dir_mask] = 0
            elif fill_with == "max":
                lh[h, dir_mask] = lh[h, :].max()
    return np.expand_dims(head_slopes, (1, 2)) * lh


def reference_bias(grid, direction, heads, global_slope=2.0, layer_slope=1.0, **kw):
    """create_lh_bias_tensor for one layer, before its bfloat16 cast (float64, -inf where masked)."""
    return -(global_slope * layer_slope * create_lh_layer_tensor(grid, direction, heads, **kw))


@pytest.mark.parametrize("variant, heads", [("lh90", 12), ("lh180", 12), ("lh45", 16), ("corners-none", 6)])
def test_lookhere_equals_its_reference_on_a_non_square_grid(variant, heads):
    """The released variants with 12 and 16 heads; 6 heads as the reference can build them (with a
    directed second group its slopes do not broadcast: 4 slopes for 2 heads)."""
    grid = (4, 7)
    kw = dict(variant=variant) if variant.startswith("lh") else dict(directions=variant)
    pe = LookHere(heads, layer=1, depth=3, **kw)  # layer slope linspace(1.5, 0.5, 3)[1] = 1
    assert pe.layer_slope == 1.0
    got = pe(grid)[0].double().numpy()  # (heads, N, N)
    ref = reference_bias(grid, pe.directions, heads)
    masked = np.isinf(ref)
    assert (got[masked] == MASKED).all() and (got[~masked] != MASKED).all()
    np.testing.assert_allclose(got[~masked], ref[~masked], rtol=1e-6, atol=1e-5)
    assert masked.any() and (~masked).any()


@pytest.mark.parametrize("directions, kw", [("center-zerohalves-none", dict(distance="sqrt")),
                                            ("halves-triangles-diagonals", dict(fill_with="max")),
                                            ("corners", dict(distance="square", fill_with="zero"))])
def test_lookhere_options_equal_the_reference(directions, kw):
    grid = (3, 5)
    pe = LookHere(12, directions=directions, global_slope=1.5, layer_slopes=(2.0, 2.0), **kw)
    got = pe(grid)[0].double().numpy()
    ref = reference_bias(grid, directions, 12, global_slope=1.5, layer_slope=2.0, **kw)
    masked = np.isinf(ref)
    np.testing.assert_allclose(got[~masked], ref[~masked], rtol=1e-6, atol=1e-5)
    assert (got[masked] == MASKED).all()


def _assert_equals_reference(pe, grid, directions, heads, **kw):
    got = pe(grid)[0].double().numpy()  # (heads, N, N)
    ref = reference_bias(grid, directions, heads, **kw)
    masked = np.isinf(ref)
    assert (got[masked] == MASKED).all() and (got[~masked] != MASKED).all()  # every head's field of view
    np.testing.assert_allclose(got[~masked], ref[~masked], rtol=1e-6, atol=1e-5)


@pytest.mark.parametrize("group", sorted(DIR_SHORT_HAND))
def test_every_group_equals_the_reference_alone_and_among_others(group):
    """Each of the reference's 15 groups (its ``dir_short_hand``, copied in full above: the list of
    vispe's ``GROUPS`` is checked against it) on a non-square grid: alone (8 heads: each view twice,
    the slopes of a group of 8), as the second of two groups of 8 heads and the third of four groups of
    4 (the reference's 16-head tables), with the slopes and masks of each head."""
    from vispe.image.lookhere import GROUPS

    assert sorted(GROUPS) == sorted(DIR_SHORT_HAND)
    grid = (3, 5)
    other = "corners" if group != "corners" else "halves"  # a group twice in a row is one group to the reference
    last = "diagonals" if group != "diagonals" else "triangles"
    for directions, heads in ((group, 8), (f"{other}-{group}", 16), (f"none-{other}-{group}-{last}", 16)):
        pe = LookHere(heads, directions=directions, layer_slopes=(1.0, 1.0))
        _assert_equals_reference(pe, grid, directions, heads)


def test_head_plan_generalises_the_references_tables():
    views, slopes = head_plan("corners-triangles-none", 4)  # vit_pico's 4 heads: the first group
    assert views == [["up", "left"], ["up", "right"], ["down", "left"], ["down", "right"]] and slopes == [0.5] * 4
    views, slopes = head_plan("corners-triangles-none", 16)  # the reference's [8, 4, 4]
    assert [v[0] for v in views[:8]] == ["up", "up", "down", "down"] * 2 and slopes[:8] == [0.5] * 4 + [0.25] * 4
    assert slopes[12:] == [0.25, 0.0625, 0.015625, 0.00390625]
    with pytest.raises(ValueError, match="unknown group"):
        head_plan("corners-sideways", 8)


def test_layer_slopes_in_a_vit_and_no_nan_where_a_view_is_all_padding():
    m = create_vit("vit_pico", pe="lookhere", embed_dim=32, depth=3, num_heads=4, img_size=(16, 16), patch_size=4,
                   num_classes=3, class_token=True).eval()
    assert [b.attn.pe.layer_slope for b in m.blocks] == [1.5, 1.0, 0.5]
    x = torch.zeros(2, 3, 32, 32)
    x[:, :, :16, :16] = torch.randn(2, 3, 16, 16)
    mask = torch.ones(2, 32, 32, dtype=torch.bool)
    mask[:, :16, :16] = False  # padded tokens at the bottom right: their down-right view is all padding
    with torch.no_grad():
        both = m(x, mask)
        alone = m(x[:, :, :16, :16])
    assert torch.isfinite(both).all()
    torch.testing.assert_close(both, alone, rtol=1e-4, atol=1e-5)


def test_center_heads_use_each_images_valid_area():
    pe = LookHere(4, directions="center")
    mask = torch.ones(1, 5, 6, dtype=torch.bool)
    mask[:, 2:, 3:] = False  # a 3 x 3 image at the bottom right
    padded = pe((5, 6), mask)[0].view(4, 5, 6, 5, 6)[:, 2:, 3:, 2:, 3:].reshape(4, 9, 9)
    torch.testing.assert_close(padded, pe((3, 3))[0])
    assert pe((5, 6))[0].view(4, 5, 6, 5, 6)[:, 2:, 3:, 2:, 3:].reshape(4, 9, 9).sub(padded).abs().max() > 1e-3
