"""Every reference convention reproduced by a named option, element by element on non-square grids:
DETR / transformers learned row-column, MAE and big_vision sin-cos, timm's resampling, rope-vit and
timm RoPE (axial, EVA-02's reference grid, mixed), and what ``python -m vispe`` says of masks.
(DeBERTa's p2c conventions: tests/test_axis_relative.py.)"""
import inspect

import numpy as np
import pytest
import torch

import vispe
from vispe.image.learned_rowcol import convert_detr_state_dict
from vispe.image.rope_axial import axis_pair_permutation, convert_rope_axis_order
from vispe.image.rope_mixed import from_rope_vit_freqs
from vispe.models.vit import create_vit

SHAPES = [(3, 5), (5, 3)]


def grid_of(pe, shape, **kw):
    return pe(shape, **kw)[0].view(*shape, -1)  # (h, w, C)


# ---------------------------------------------------------------- DETR learned row / column
def detr_learned_ref(row, col, h, w):
    """DETR's PositionEmbeddingLearned.forward, written out: cat([col(x), row(y)]).  # (h, w, 2C)"""
    x_emb, y_emb = col[torch.arange(w)], row[torch.arange(h)]
    return torch.cat([x_emb.unsqueeze(0).repeat(h, 1, 1), y_emb.unsqueeze(1).repeat(1, w, 1)], dim=-1)


@pytest.mark.parametrize("shape", SHAPES)
def test_learned_rowcol_xy_is_detr_and_loads_its_keys(shape):
    torch.manual_seed(0)
    row, col = torch.rand(50, 8), torch.rand(50, 8)
    pe = vispe.build("learned_rowcol", dim=16, axis_order="xy")
    pe.load_state_dict({"row_embed.weight": row, "col_embed.weight": col})  # DETR's keys
    torch.testing.assert_close(grid_of(pe, shape), detr_learned_ref(row, col, *shape), rtol=0, atol=0)
    yx = vispe.build("learned_rowcol", dim=16)
    yx.load_state_dict({"row.weight": row, "col.weight": col})
    torch.testing.assert_close(grid_of(yx, shape), grid_of(pe, shape).roll(8, dims=-1), rtol=0, atol=0)


def test_learned_rowcol_matches_transformers_module():
    from transformers.models.detr.modeling_detr import DetrLearnedPositionEmbedding

    torch.manual_seed(0)
    ref = DetrLearnedPositionEmbedding(embedding_dim=8)
    pe = vispe.build("learned_rowcol", dim=16, axis_order="xy")
    pe.load_state_dict(ref.state_dict())  # row_embeddings / column_embeddings
    feats = torch.zeros(2, 4, 3, 5)  # (B, C, h, w): transformers reads the shape
    want = ref(feats.shape, feats.device, feats.dtype)  # (B, 16, h, w)
    got = pe((3, 5), torch.zeros(2, 3, 5, dtype=torch.bool))  # (B, h*w, 16)
    torch.testing.assert_close(got.transpose(1, 2).reshape(2, 16, 3, 5), want, rtol=0, atol=0)


def test_detr_keys_are_converted_or_refused_by_a_y_first_module():
    sd = {"backbone.1.row_embed.weight": torch.ones(50, 8), "backbone.1.col_embed.weight": torch.zeros(50, 8),
          "x.row_embeddings.weight": torch.ones(1), "x.column_embeddings.weight": torch.ones(1), "other": torch.ones(1)}
    assert set(convert_detr_state_dict(sd)) == {"backbone.1.row.weight", "backbone.1.col.weight",
                                                 "x.row.weight", "x.col.weight", "other"}
    with pytest.raises(ValueError, match="axis_order='xy'"):
        vispe.build("learned_rowcol", dim=16).load_state_dict({"row_embed.weight": torch.rand(50, 8),
                                                               "col_embed.weight": torch.rand(50, 8)})
    with pytest.raises(ValueError, match="axis_order"):
        vispe.build("learned_rowcol", dim=16, axis_order="x")


def test_learned_rowcol_inits():
    torch.manual_seed(0)
    big = dict(dim=2000, max_size=(50, 50))
    uni = vispe.build("learned_rowcol", **big).row.weight
    nor = vispe.build("learned_rowcol", init="normal", **big).row.weight
    assert uni.min() >= 0 and uni.max() <= 1 and abs(uni.mean() - 0.5) < 0.01
    assert abs(nor.std() - 1) < 0.02 and nor.min() < 0


def test_sine_matches_transformers_module_with_padding():
    from transformers.models.detr.modeling_detr import DetrSinePositionEmbedding

    ref = DetrSinePositionEmbedding(num_position_features=8, normalize=True)
    pad = torch.zeros(2, 5, 7, dtype=torch.bool)
    pad[0, 3:] = True  # image 0 is 3 x 5, padded at the bottom and right (DETR's batches)
    pad[0, :, 5:] = True
    want = ref((2, 16, 5, 7), "cpu", torch.float32, mask=(~pad).long())  # transformers: 1 = valid pixel
    got = vispe.build("sine", dim=16)((5, 7), pad)  # (B, h*w, 16)
    torch.testing.assert_close(got.transpose(1, 2).reshape(2, 16, 5, 7)[0, :, :3, :5], want[0, :, :3, :5],
                               atol=1e-5, rtol=0)
    torch.testing.assert_close(got.transpose(1, 2).reshape(2, 16, 5, 7)[1], want[1], atol=1e-5, rtol=0)


# ---------------------------------------------------------------- MAE and big_vision sin-cos
def mae_2d_ref(h, w, dim):
    """MAE's get_2d_sincos_pos_embed (numpy, as in util/pos_embed.py), for an (h, w) grid."""
    def one_d(d, pos):
        omega = np.arange(d // 2, dtype=np.float64) / (d / 2.0)
        omega = 1.0 / 10000 ** omega
        out = np.einsum("m,d->md", pos.reshape(-1), omega)
        return np.concatenate([np.sin(out), np.cos(out)], axis=1)

    grid = np.meshgrid(np.arange(w, dtype=np.float32), np.arange(h, dtype=np.float32))  # w goes first
    grid = np.stack(grid, axis=0).reshape([2, 1, h, w])
    emb_h = one_d(dim // 2, grid[0])  # MAE's "emb_h" encodes w (x)
    emb_w = one_d(dim // 2, grid[1])
    return torch.from_numpy(np.concatenate([emb_h, emb_w], axis=1)).view(h, w, dim)


def big_vision_ref(h, w, width, temperature=10000.0):
    """big_vision's posemb_sincos_2d (numpy for jnp)."""
    y, x = np.mgrid[:h, :w]
    omega = np.arange(width // 4) / (width // 4 - 1)
    omega = 1.0 / (temperature ** omega)
    y = np.einsum("m,d->md", y.flatten(), omega)
    x = np.einsum("m,d->md", x.flatten(), omega)
    pe = np.concatenate([np.sin(x), np.cos(x), np.sin(y), np.cos(y)], axis=1)
    return torch.from_numpy(pe).view(h, w, width)


@pytest.mark.parametrize("shape", SHAPES)
def test_sincos2d_options_reproduce_mae_and_big_vision(shape):
    mae = grid_of(vispe.build("sincos2d", dim=16, axis_order="xy"), shape).double()
    torch.testing.assert_close(mae, mae_2d_ref(*shape, 16), atol=1e-6, rtol=0)
    bv = grid_of(vispe.build("sincos2d", dim=16, axis_order="xy", endpoint=True), shape).double()
    torch.testing.assert_close(bv, big_vision_ref(*shape, 16), atol=1e-6, rtol=0)
    assert not torch.allclose(bv, mae, atol=1e-3)  # the frequency spacing is not the same
    ax = grid_of(vispe.build("axis2d", dim=16, axis_order="xy", endpoint=True), shape).double()
    torch.testing.assert_close(ax, bv)


def test_endpoint_is_checked():
    with pytest.raises(ValueError, match="endpoint"):
        vispe.build("sincos2d", dim=4, endpoint=True)  # one frequency per axis: nothing to space
    with pytest.raises(ValueError, match="endpoint"):
        vispe.build("axis2d", dim=16, axis="learned", grid=(4, 4), endpoint=True)


# ---------------------------------------------------------------- timm's resampling
def test_learned_abs_antialias_always_is_timm_dynamic_img_size():
    import timm

    torch.manual_seed(0)
    kw = dict(img_size=16, patch_size=4, embed_dim=32, depth=1, num_heads=2, num_classes=3)
    ref = timm.create_model("vit_tiny_patch16_224", dynamic_img_size=True, **kw).eval()
    x = torch.randn(2, 3, 24, 20)  # 6 x 5 patches: both axes grow from 4 x 4
    with torch.no_grad():
        want, want_tokens = ref(x), ref._pos_embed(ref.patch_embed(x))  # timm's tokens + resampled table
        ours = create_vit("vit_tiny", pe="learned_abs", pe_kwargs=dict(antialias="always"), **kw).eval()
        ours.load_state_dict(ref.state_dict())
        torch.testing.assert_close(ours._tokens(x, None)[0], want_tokens, atol=1e-6, rtol=0)
        torch.testing.assert_close(ours(x), want, atol=1e-5, rtol=1e-5)
        default = create_vit("vit_tiny", pe="learned_abs", **kw).eval()
        default.load_state_dict(ref.state_dict())
        # vispe's default does not antialias when growing (torch's antialiased bicubic is another kernel)
        assert (default._tokens(x, None)[0] - want_tokens).abs().max() > 1e-4
        small = torch.randn(2, 3, 8, 12)  # 2 x 3 patches, shrinking: both rules antialias
        torch.testing.assert_close(default._tokens(small, None)[0], ours._tokens(small, None)[0], atol=1e-7, rtol=0)


# ---------------------------------------------------------------- RoPE: rope-vit and timm
def rope_vit_apply(t, h, w, head_dim, theta=100.0):
    """rope-vit's compute_axial_cis + apply_rotary_emb (complex numbers, x first, interleaved)."""
    freqs = 1.0 / (theta ** (torch.arange(0, head_dim, 4)[: head_dim // 4].float() / head_dim))
    idx = torch.arange(h * w, dtype=torch.float32)
    t_x, t_y = idx % w, torch.div(idx, w, rounding_mode="floor")
    cis = torch.cat([torch.polar(torch.ones(h * w, head_dim // 4), torch.outer(t_x, freqs)),
                     torch.polar(torch.ones(h * w, head_dim // 4), torch.outer(t_y, freqs))], dim=-1)
    tc = torch.view_as_complex(t.float().reshape(*t.shape[:-1], -1, 2))
    return torch.view_as_real(tc * cis).flatten(-2)


@pytest.mark.parametrize("shape", SHAPES)
def test_rope_axial_xy_interleaved_is_rope_vit_and_timm(shape):
    from timm.layers.pos_embed_sincos import build_rotary_pos_embed

    from vispe.axis.rope import apply_rope

    h, w = shape
    pe = vispe.build("rope_axial", head_dim=16, num_heads=2, axis_order="xy", layout="interleaved")
    a = pe(shape)[0, 0]  # (N, 8)
    q = torch.randn(2, h * w, 16)
    torch.testing.assert_close(apply_rope(q, a, "interleaved"), rope_vit_apply(q, h, w, 16), atol=1e-5, rtol=0)
    sin, cos = build_rotary_pos_embed([h, w], dim=16, temperature=100.0, in_pixels=False, grid_indexing="xy")
    torch.testing.assert_close(a.sin().repeat_interleave(2, -1), sin, atol=1e-6, rtol=0)
    torch.testing.assert_close(a.cos().repeat_interleave(2, -1), cos, atol=1e-6, rtol=0)
    yx = vispe.build("rope_axial", head_dim=16, num_heads=2, layout="interleaved")
    assert not torch.allclose(yx(shape), pe(shape))


def test_rope_axial_ref_grid_is_eva02():
    from timm.layers.pos_embed_sincos import build_rotary_pos_embed

    pe = vispe.build("rope_axial", head_dim=16, num_heads=2, base=10000.0, ref_grid=(4, 4))
    a = pe((3, 7))[0, 0]  # (N, 8), y first as timm's default "ij" grid
    sin, _ = build_rotary_pos_embed([3, 7], dim=16, temperature=10000.0, in_pixels=False, ref_feat_shape=[4, 4],
                                    rotate_half=True)
    torch.testing.assert_close(torch.cat([a, a], -1).sin(), sin, atol=1e-6, rtol=0)
    mask = torch.zeros(2, 5, 9, dtype=torch.bool)
    mask[1, 3:] = True
    mask[1, :, 7:] = True  # image 1 is 3 x 7, padded to 5 x 9
    padded = pe((5, 9), mask).view(2, 5, 9, -1)[1, :3, :7].reshape(21, -1)
    torch.testing.assert_close(padded, a)  # the reference grid is taken over the valid area


def test_rope_mixed_from_rope_vit_freqs_is_timm():
    from timm.layers.pos_embed_sincos import get_mixed_freqs, get_mixed_grid

    torch.manual_seed(0)
    depth, heads, d = 2, 3, 16
    timm_freqs = torch.randn(2, depth, heads, d // 2)  # timm's (fx, fy) per layer
    t_x, t_y = get_mixed_grid([3, 5], grid_indexing="xy")
    want = get_mixed_freqs(timm_freqs, t_x, t_y)  # (depth, heads, N, 2d) = [sin, cos], interleaved
    ours = from_rope_vit_freqs(timm_freqs.flatten(2), heads)  # rope-vit's flat layout gives the same
    torch.testing.assert_close(ours, from_rope_vit_freqs(timm_freqs, heads))
    for i in range(depth):
        pe = vispe.build("rope_mixed", head_dim=d, num_heads=heads, layout="interleaved")
        with torch.no_grad():
            pe.freqs.copy_(ours[i])
        a = pe((3, 5))[0]  # (heads, N, d/2)
        got = torch.cat([a.sin().repeat_interleave(2, -1), a.cos().repeat_interleave(2, -1)], -1)
        torch.testing.assert_close(got, want[i], atol=1e-5, rtol=0)


def test_rope_axis_order_checkpoint_converter_gives_the_same_model():
    torch.manual_seed(0)
    kw = dict(embed_dim=32, depth=2, num_heads=2, img_size=(8, 12), patch_size=4, num_classes=3)
    for layout in ("half", "interleaved"):
        xy = create_vit("vit_pico", pe="rope_axial", pe_kwargs=dict(axis_order="xy", layout=layout), **kw).eval()
        yx = create_vit("vit_pico", pe="rope_axial", pe_kwargs=dict(layout=layout), **kw).eval()
        sd = convert_rope_axis_order(xy.state_dict(), num_heads=2, head_dim=16, layout=layout)
        x = torch.randn(2, 3, 12, 20)
        with torch.no_grad():
            yx.load_state_dict(xy.state_dict())
            assert not torch.allclose(yx(x), xy(x), atol=1e-4)  # the axis order matters
            yx.load_state_dict(sd)
            torch.testing.assert_close(yx(x), xy(x), atol=1e-5, rtol=1e-5)
    perm = axis_pair_permutation(16, "half")
    assert torch.equal(perm[perm], torch.arange(16))  # an involution
    with pytest.raises(ValueError, match="qkv.weight"):
        convert_rope_axis_order({"blocks.0.attn.qkv.weight": torch.zeros(10, 4)}, num_heads=2, head_dim=16)


# ---------------------------------------------------------------- mask-awareness as shown
def test_python_m_vispe_shows_the_mask_option():
    """The docs' encodings table is made from the same function when the site is built
    (tests/test_docs_site.py checks the page against the registry)."""
    from vispe.__main__ import table

    for name in vispe.available():
        cls = vispe.registry.get(name)
        takes_option = "mask_aware" in inspect.signature(cls.__init__).parameters
        assert bool(cls.mask_aware_option) == (takes_option or name == "peg"), name
    shown = {r.split("|")[1].strip(): r.split("|")[3].strip() for r in table().splitlines()[2:]}
    assert shown["sincos2d"] == "option: mask_aware=True" and shown["sine"] == "yes" and shown["relbias"] == "no"
