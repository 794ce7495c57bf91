"""Multi-scale deformable attention (vispe.kernels.deformable, vispe.deformable_attention) against
the papers' ms_deform_attn_core_pytorch (a faithful copy below), transformers' module with the same
weights, and the sampling's geometry (a feature moved by k cells, an offset of one cell)."""
import math

import pytest
import torch
import torch.nn.functional as F
from transformers import DeformableDetrConfig
from transformers.models.deformable_detr.modeling_deformable_detr import DeformableDetrMultiscaleDeformableAttention

from vispe.deformable_attention import MSDeformAttn
from vispe.kernels.deformable import Levels, ms_deform_attn, sampling_locations, swap_xy

SHAPES = ((5, 7), (3, 4), (2, 3), (1, 2))  # non-square at every level


def ms_deform_attn_core_pytorch(value, value_spatial_shapes, sampling_locations, attention_weights):
    """fundamentalvision/Deformable-DETR models/ops/functions/ms_deform_attn_func.py (11169a6), verbatim
    but for names: locations are the papers' (x, y)."""
    N_, S_, M_, D_ = value.shape
    _, Lq_, M_, L_, P_, _ = sampling_locations.shape
    value_list = value.split([H_ * W_ for H_, W_ in value_spatial_shapes], dim=1)
    sampling_grids = 2 * sampling_locations - 1
    sampling_value_list = []
    for lid_, (H_, W_) in enumerate(value_spatial_shapes):
        value_l_ = value_list[lid_].flatten(2).transpose(1, 2).reshape(N_ * M_, D_, H_, W_)
        sampling_grid_l_ = sampling_grids[:, :, :, lid_].transpose(1, 2).flatten(0, 1)
        sampling_value_l_ = F.grid_sample(value_l_, sampling_grid_l_, mode="bilinear", padding_mode="zeros",
                                          align_corners=False)
        sampling_value_list.append(sampling_value_l_)
    attention_weights = attention_weights.transpose(1, 2).reshape(N_ * M_, 1, Lq_, L_ * P_)
    output = (torch.stack(sampling_value_list, dim=-2).flatten(-2) * attention_weights).sum(-1).view(N_, M_ * D_, Lq_)
    return output.transpose(1, 2).contiguous()


def inputs(seed=0, B=2, Q=6, M=3, D=4, P=3, dtype=torch.float64):
    g = torch.Generator().manual_seed(seed)
    levels = Levels(SHAPES)
    value = torch.randn(B, levels.num_tokens, M, D, generator=g, dtype=dtype)
    loc = torch.rand(B, Q, M, len(SHAPES), P, 2, generator=g, dtype=dtype) * 1.4 - 0.2  # some outside the map
    weights = torch.rand(B, Q, M, len(SHAPES), P, generator=g, dtype=dtype)
    return levels, value, loc, weights


def test_core_equals_papers_pytorch_core_element_by_element():
    levels, value, loc, weights = inputs()
    ref = ms_deform_attn_core_pytorch(value, SHAPES, loc.flip(-1), weights)  # the papers take (x, y)
    torch.testing.assert_close(ms_deform_attn(value, levels, loc, weights), ref, rtol=0, atol=1e-12)
    # and the gradients of value, locations and weights
    leaves = [t.clone().requires_grad_() for t in (value, loc, weights)]
    g = torch.randn_like(ref)
    ours = torch.autograd.grad((ms_deform_attn(*leaves[:1], levels, *leaves[1:]) * g).sum(), leaves)
    v, lo, w = (t.clone().requires_grad_() for t in (value, loc, weights))
    theirs = torch.autograd.grad((ms_deform_attn_core_pytorch(v, SHAPES, lo.flip(-1), w) * g).sum(), (v, lo, w))
    for a, b in zip(ours, theirs):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-10)


def test_core_float32_matches_float64():
    levels, value, loc, weights = inputs(seed=3)
    ref = ms_deform_attn(value, levels, loc, weights)
    out = ms_deform_attn(value.float(), levels, loc.float(), weights.float())
    torch.testing.assert_close(out.double(), ref, rtol=0, atol=1e-5)


def test_one_cell_offset_reads_the_neighbouring_cell_at_every_level():
    """Offsets are in cells of each level, x by the level's width, y by its height: a point at a cell
    centre with offset (dx, dy) = (1, 0) reads the next column, (0, 1) the next row (non-square levels,
    where an (h, w) slip moves the sample off the cell centre)."""
    levels = Levels(SHAPES)
    B, M, D = 1, 1, 3
    value = torch.randn(B, levels.num_tokens, M, D, dtype=torch.float64)
    for l, (h, w) in enumerate(SHAPES):
        iy, ix = torch.meshgrid(torch.arange(h, dtype=torch.float64), torch.arange(w, dtype=torch.float64), indexing="ij")
        ref = torch.stack([(iy + 0.5) / h, (ix + 0.5) / w], -1).view(1, h * w, 1, 2)  # (1, Q, 1, 2) (y, x)
        ref = ref.expand(1, h * w, len(SHAPES), 2)
        for dx, dy in ((1, 0), (0, 1)):
            off = torch.zeros(B, h * w, M, len(SHAPES), 1, 2, dtype=torch.float64)
            off[..., 0], off[..., 1] = dx, dy  # the papers' (x, y) layout
            loc = sampling_locations(ref, off, levels)
            wts = torch.zeros(B, h * w, M, len(SHAPES), 1, dtype=torch.float64)
            wts[:, :, :, l] = 1.0
            out = ms_deform_attn(value, levels, loc, wts).view(h, w, D)
            level = value[0, levels.start[l]:levels.start[l] + h * w, 0].view(h, w, D)
            want = torch.zeros_like(level)  # beyond the last row / column: zeros
            want[:h - dy, :w - dx] = level[dy:, dx:]
            torch.testing.assert_close(out, want, rtol=0, atol=1e-12)


def test_moving_a_feature_by_k_cells_moves_the_output_with_its_reference_point():
    """A feature blob moved by k = (2, 4) cells of level 0 (1, 2 cells of level 1) gives, at every
    reference point moved by the same amount, the output of the unmoved blob at the unmoved point,
    position by position on non-square levels; moving the point along the other axis does not."""
    torch.manual_seed(0)
    shapes = ((12, 16), (6, 8))
    levels = Levels(shapes)
    attn = MSDeformAttn(16, 2, 2, 3).double()
    with torch.no_grad():
        for p in attn.parameters():
            p.normal_(0, 0.3)
        attn.value_proj.bias.zero_()  # zero features -> zero values, as the zeros beyond the map
    ky, kx = 2, 4
    maps, moved = [], []
    for h, w in shapes:
        f = torch.zeros(1, 16, h, w, dtype=torch.float64)
        f[..., h // 4: h // 2, w // 4: w // 2] = torch.randn(1, 16, h // 2 - h // 4, w // 2 - w // 4, dtype=torch.float64)
        sy, sx = ky * h // shapes[0][0], kx * w // shapes[0][1]
        maps.append(f)
        moved.append(torch.roll(f, (sy, sx), (-2, -1)))  # blob far from the borders: a pure move
    h, w = shapes[0]
    iy, ix = torch.meshgrid(torch.arange(h - ky, dtype=torch.float64), torch.arange(w - kx, dtype=torch.float64),
                            indexing="ij")
    yx = torch.stack([(iy + 0.5) / h, (ix + 0.5) / w], -1).view(1, -1, 1, 2).expand(1, -1, 2, 2)
    q = torch.randn(1, 1, 16, dtype=torch.float64).expand(1, yx.shape[1], 16)  # the same query everywhere
    shift = torch.tensor([ky / h, kx / w], dtype=torch.float64)
    out = attn(q, yx, levels.flatten(maps), levels)
    out_moved = attn(q, yx + shift, levels.flatten(moved), levels)
    assert out.abs().max() > 0.1  # the blob is read
    torch.testing.assert_close(out_moved, out, rtol=0, atol=1e-12)
    swapped = attn(q, yx + shift.flip(0), levels.flatten(moved), levels)  # a (y, x) slip
    assert (swapped - out).abs().max() > 1e-2


def perturbed_hf_attention(L, M=4, P=3, d=32, seed=0):
    torch.manual_seed(seed)
    cfg = DeformableDetrConfig(d_model=d, num_feature_levels=L, encoder_attention_heads=M, use_timm_backbone=False,
                               backbone_config={"model_type": "resnet"})
    hf = DeformableDetrMultiscaleDeformableAttention(cfg, num_heads=M, n_points=P).eval()
    with torch.no_grad():
        for name, p in hf.named_parameters():  # every parameter perturbed, O(1) activations
            p.normal_(0, (1.0 / p.shape[-1] ** 0.5 if p.dim() > 1 else 0.3))
    return hf


@pytest.mark.parametrize("coords", [2, 4])
def test_module_equals_transformers_with_the_same_weights(coords):
    L, M, P, d = len(SHAPES), 4, 3, 32
    hf = perturbed_hf_attention(L, M, P, d)
    ours = MSDeformAttn(d, M, L, P)
    ours.load_state_dict(hf.state_dict())  # the same names, one to one
    levels = Levels(SHAPES)
    B, Q = 2, 7
    g = torch.Generator().manual_seed(1)
    query, pos = torch.randn(B, Q, d, generator=g), torch.randn(B, Q, d, generator=g)
    value = torch.randn(B, levels.num_tokens, d, generator=g)
    pad = torch.zeros(B, levels.num_tokens, dtype=torch.bool)
    pad[1, levels.start[0] + 5 * 7 - 9:] = True  # some of image 1's tokens are padding
    ref_xy = torch.rand(B, Q, L, coords, generator=g) * 0.8 + 0.1  # the papers' (x, y[, w, h])
    with torch.no_grad():
        want, _ = hf(query, attention_mask=~pad, encoder_hidden_states=value, position_embeddings=pos,
                     reference_points=ref_xy, spatial_shapes=levels.tensor(), spatial_shapes_list=list(SHAPES),
                     level_start_index=torch.tensor(levels.start))
        got = ours(query, swap_xy(ref_xy), value, levels, pad, query_pos=pos)
    assert want.abs().max() > 0.5
    torch.testing.assert_close(got, want, rtol=0, atol=1e-5)


def papers_grid_init(n_heads, n_levels, n_points):
    """fundamentalvision/Deformable-DETR MSDeformAttn._reset_parameters' offset bias (11169a6), verbatim."""
    thetas = torch.arange(n_heads, dtype=torch.float32) * (2.0 * math.pi / n_heads)
    grid_init = torch.stack([thetas.cos(), thetas.sin()], -1)
    grid_init = (grid_init / grid_init.abs().max(-1, keepdim=True)[0]).view(n_heads, 1, 1, 2).repeat(1, n_levels, n_points, 1)
    for i in range(n_points):
        grid_init[:, :, i, :] *= i + 1
    return grid_init.view(-1)


def test_initialisation_equals_the_papers():
    torch.manual_seed(0)
    ours = MSDeformAttn(64, 8, 3, 4)
    torch.testing.assert_close(ours.sampling_offsets.bias.data, papers_grid_init(8, 3, 4), rtol=0, atol=0)
    for lin in ("sampling_offsets", "attention_weights"):
        assert getattr(ours, lin).weight.abs().max() == 0
    assert ours.attention_weights.bias.abs().max() == 0 and ours.value_proj.bias.abs().max() == 0
    assert ours.output_proj.bias.abs().max() == 0
    bound = math.sqrt(6 / (64 + 64))  # Xavier-uniform
    assert 0.8 * bound < ours.value_proj.weight.abs().max() <= bound


def test_bad_inputs_are_refused_with_their_names():
    attn = MSDeformAttn(16, 2, 2, 2)
    levels = Levels(((3, 4), (2, 2)))
    q, v = torch.randn(1, 3, 16), torch.randn(1, levels.num_tokens, 16)
    ref = torch.rand(1, 3, 2, 2)
    with pytest.raises(ValueError, match="num_levels=2"):
        attn(q, ref[:, :, :1], v, Levels(((3, 4),)))
    with pytest.raises(ValueError, match="reference has shape"):
        attn(q, torch.rand(1, 3, 2, 3), v, levels)
    with pytest.raises(ValueError, match="value has 15 tokens"):
        attn(q, ref, v[:, 1:], levels)
    with pytest.raises(ValueError, match="key_padding_mask"):
        attn(q, ref, v, levels, torch.zeros(1, levels.num_tokens))
    with pytest.raises(ValueError, match="d_model=10"):
        MSDeformAttn(10, 4)
    with pytest.raises(ValueError, match="maps have shapes"):
        levels.flatten([torch.zeros(1, 2, 3, 4)])


def test_bfloat16_samples_at_float32_locations():
    """bf16 values and offsets (a bf16 model, or autocast) still sample at float32 locations: a bf16
    location is off by up to 1/256 of the map, a quarter of a cell on a 64-wide level."""
    from vispe.kernels.deformable import deform_attn
    levels = Levels(((48, 64),))
    g = torch.Generator().manual_seed(0)
    value = torch.randn(1, levels.num_tokens, 1, 4, generator=g).bfloat16().float()  # exact in bf16
    ref = torch.rand(1, 50, 1, 2, generator=g) * 0.8 + 0.1  # (y, x), float32
    off = torch.randint(-2, 3, (1, 50, 1, 1, 2, 2), generator=g).float()  # whole cells: exact in bf16
    w = torch.full((1, 50, 1, 1, 2), 0.5)
    want = deform_attn(value, levels, ref, off, w)
    got = deform_attn(value.bfloat16(), levels, ref, off.bfloat16(), w.bfloat16())
    assert got.dtype == torch.bfloat16
    torch.testing.assert_close(got.float(), want, rtol=1e-2, atol=1e-2)  # the output's bf16 rounding only
    attn = MSDeformAttn(16, 2, 1, 2)
    q, v = torch.randn(1, 50, 16, generator=g), torch.randn(1, levels.num_tokens, 16, generator=g)
    ref2 = ref.expand(1, 50, 1, 2)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        mixed = attn(q, ref2, v, levels)
    torch.testing.assert_close(mixed.float(), attn(q, ref2, v, levels), rtol=0.05, atol=0.05)
