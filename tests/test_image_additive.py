"""Additive image encodings (sine, learned_rowcol, learned_abs, fourier, sincos2d, normidx2d, axis2d)
and "none", against references written here (DETR, MAE, ViT resampling), on non-square grids."""
import math

import pytest
import torch
import torch.nn.functional as F

import vispe
from vispe.axis.learned import resize_table_1d
from vispe.encoding import GRID_KEY

# name -> (registered name, kwargs); plain kwargs only, as a config would give them
CONFIGS = {
    "sine": ("sine", dict(dim=16)),
    "sine_deformable": ("sine", dict(dim=16, offset=-0.5, layout="concat")),
    "sine_raw": ("sine", dict(dim=16, normalize=False)),
    "learned_rowcol": ("learned_rowcol", dict(dim=16, max_size=(6, 6))),
    "learned_abs": ("learned_abs", dict(dim=16, grid=(4, 6), num_prefix_tokens=2)),
    "fourier": ("fourier", dict(dim=16)),
    "fourier_learned": ("fourier", dict(dim=16, learnable=True, mlp_dim=8, mask_aware=True)),
    "fourier_normalized": ("fourier", dict(dim=16, coords="normalized", mask_aware=True, sigma=2.0)),
    "sincos2d": ("sincos2d", dict(dim=16, mask_aware=True)),
    "sincos2d_normalized": ("sincos2d", dict(dim=16, coords="normalized", mask_aware=True)),
    "normidx2d": ("normidx2d", dict(dim=16, mask_aware=True)),
    "axis2d_sum": ("axis2d", dict(dim=16, compose="sum", coords="centered", mask_aware=True)),
    "axis2d_product": ("axis2d", dict(dim=16, compose="product", layout="interleaved")),
    "axis2d_learned": ("axis2d", dict(dim=16, axis="learned", grid=(4, 6), num_prefix_tokens=1)),
    "axis2d_learned_sum": ("axis2d", dict(dim=16, axis="learned", compose="sum", grid=(4, 6))),
}
FIXED = ["sine", "sine_deformable", "sine_raw", "fourier", "fourier_normalized", "sincos2d", "sincos2d_normalized",
         "axis2d_sum", "axis2d_product"]


def make(key, **over):
    name, kw = CONFIGS[key]
    torch.manual_seed(0)
    return vispe.build(name, **{**kw, **over})


def grid_of(pe, shape, **kw):
    return pe(shape, **kw)[0].view(*shape, -1)  # (h, w, C)


# ---------------------------------------------------------------- independent references
def detr_sine_ref(h, w, dim, *, normalize, temperature=10000.0, scale=2 * math.pi, eps=1e-6, offset=0.0):
    """DETR's PositionEmbeddingSine, position by position, in float64 Python math.  # (h, w, dim)"""
    npf = dim // 2
    out = torch.zeros(h, w, dim, dtype=torch.float64)
    for y in range(h):
        for x in range(w):
            py, px = y + 1, x + 1  # DETR counts from 1
            if normalize:
                py = (py + offset) / (h + eps) * scale
                px = (px + offset) / (w + eps) * scale
            for c in range(npf):
                t = temperature ** (2 * (c // 2) / npf)
                f = math.sin if c % 2 == 0 else math.cos
                out[y, x, c] = f(py / t)  # y first
                out[y, x, npf + c] = f(px / t)
    return out


def mae_1d_ref(p, d, temperature=10000.0):
    """MAE's 1D sin-cos of position p with d channels: [sin(p w_i)..., cos(p w_i)...]."""
    om = [temperature ** (-i / (d / 2)) for i in range(d // 2)]
    return [math.sin(p * o) for o in om] + [math.cos(p * o) for o in om]


# ---------------------------------------------------------------- which channels encode y
@pytest.mark.parametrize("key", ["sine", "sine_deformable", "sincos2d", "learned_rowcol", "axis2d_learned"])
def test_y_is_encoded_by_the_first_half_of_the_channels(key):
    pe = make(key)
    g = grid_of(pe, (3, 5))  # (3, 5, 16)
    half = g.shape[-1] // 2
    for x in range(5):
        for y in range(1, 3):  # moving along y changes only the first half
            assert torch.equal(g[y, x, half:], g[0, x, half:])
            assert not torch.allclose(g[y, x, :half], g[0, x, :half])
    for y in range(3):
        for x in range(1, 5):  # moving along x changes only the second half
            assert torch.equal(g[y, x, :half], g[y, 0, :half])
            assert not torch.allclose(g[y, x, half:], g[y, 0, half:])


def test_sincos2d_axis_order_xy_puts_x_first_as_mae():
    g = grid_of(make("sincos2d", axis_order="xy"), (3, 5))
    assert torch.equal(g[2, 1, :8], g[0, 1, :8]) and not torch.equal(g[0, 3, :8], g[0, 1, :8])


# ---------------------------------------------------------------- references on non-square grids
@pytest.mark.parametrize("shape", [(3, 5), (5, 3)])
@pytest.mark.parametrize("normalize,offset", [(True, 0.0), (True, -0.5), (False, 0.0)])
def test_sine_matches_detr_position_by_position(shape, normalize, offset):
    pe = vispe.build("sine", dim=16, normalize=normalize, offset=offset, temperature=100.0)
    ref = detr_sine_ref(*shape, 16, normalize=normalize, offset=offset, temperature=100.0)
    torch.testing.assert_close(grid_of(pe, shape).double(), ref, atol=1e-5, rtol=0)
    masked = pe(shape, torch.zeros(2, *shape, dtype=torch.bool))  # an all-valid mask: the same code
    torch.testing.assert_close(masked, pe(shape).expand(2, -1, -1))


def test_sine_offset_without_normalize_shifts_the_count():
    a = grid_of(vispe.build("sine", dim=8, normalize=False, offset=-0.5), (3, 5))
    ref = detr_sine_ref(3, 5, 8, normalize=False)
    assert not torch.allclose(a.double(), ref, atol=1e-3)  # the option takes effect
    c = 0  # channel 0 is sin(y_count + offset) (lowest frequency 1)
    torch.testing.assert_close(a[:, 0, c].double(), torch.tensor([math.sin(k + 0.5) for k in range(3)],
                                                                  dtype=torch.float64), atol=1e-6, rtol=0)


def test_sine_concat_layout_is_a_permutation_of_detr():
    inter = grid_of(vispe.build("sine", dim=16), (3, 5))
    concat = grid_of(vispe.build("sine", dim=16, layout="concat"), (3, 5))
    perm = [0, 2, 4, 6, 1, 3, 5, 7]  # per axis: sin channels, then cos channels
    perm = perm + [8 + p for p in perm]
    torch.testing.assert_close(concat, inter[..., perm])


@pytest.mark.parametrize("shape", [(3, 5), (5, 3)])
def test_sincos2d_matches_mae_and_timm(shape):
    from timm.layers.pos_embed_sincos import build_sincos2d_pos_embed

    g = grid_of(make("sincos2d"), shape)
    for y in range(shape[0]):
        for x in range(shape[1]):
            ref = torch.tensor(mae_1d_ref(y, 8) + mae_1d_ref(x, 8))
            torch.testing.assert_close(g[y, x], ref, atol=1e-6, rtol=0)
    # timm's layout is [sin y, sin x, cos y, cos x]: the same numbers, regrouped per axis
    t = build_sincos2d_pos_embed(list(shape), dim=16).view(*shape, 2, 2, 4)  # (h, w, sincos, axis, k)
    torch.testing.assert_close(g, t.permute(0, 1, 3, 2, 4).reshape(*shape, 16), atol=1e-6, rtol=0)


@pytest.mark.parametrize("compose", ["sum", "product"])
def test_axis2d_sum_and_product_match_the_formula(compose):
    pe = make("axis2d_product", compose=compose, layout="concat")
    g = grid_of(pe, (3, 5))
    for y in range(3):
        for x in range(5):
            ey, ex = torch.tensor(mae_1d_ref(y, 16)), torch.tensor(mae_1d_ref(x, 16))
            torch.testing.assert_close(g[y, x], ey + ex if compose == "sum" else ey * ex, atol=1e-6, rtol=0)
    sq = grid_of(pe, (4, 4))  # the same fixed code on both axes is symmetric (documented)
    torch.testing.assert_close(sq, sq.transpose(0, 1))


def test_axis2d_learned_sum_reads_one_table_per_axis():
    pe = make("axis2d_learned_sum")
    g = grid_of(pe, (4, 6))
    ref = pe.row.weight[:, None, :] + pe.col.weight[None, :, :]  # (4, 6, 16)
    torch.testing.assert_close(g, ref)


def test_normidx2d_code_and_projection():
    raw = grid_of(vispe.build("normidx2d", dim=2, project=False), (3, 5))
    for y in range(3):
        for x in range(5):
            torch.testing.assert_close(raw[y, x], torch.tensor([y / 2, x / 4]))
    assert torch.equal(grid_of(vispe.build("normidx2d", dim=2, project=False), (1, 1)), torch.zeros(1, 1, 2))
    pe = make("normidx2d")
    torch.testing.assert_close(grid_of(pe, (3, 5)), pe.proj(raw))


def test_fourier_matches_tancik_formula_and_seed():
    pe = make("fourier")
    B = pe._frequencies(torch.device("cpu"))  # (8, 2) as (y, x) columns
    g = grid_of(pe, (3, 5))
    for y in range(3):
        for x in range(5):
            v = torch.tensor([(y + 0.5) / 3 * 2 - 1, (x + 0.5) / 5 * 2 - 1])  # centred coordinates
            a = 2 * math.pi * (B @ v)
            torch.testing.assert_close(g[y, x], torch.cat([a.cos(), a.sin()]), atol=1e-5, rtol=0)
    assert torch.equal(make("fourier")((3, 5)), pe((3, 5)))  # the seed fixes B
    assert not torch.allclose(make("fourier", seed=1)((3, 5)), pe((3, 5)))


# ---------------------------------------------------------------- batch invariance with a padding mask
MASK_AWARE = [k for k in CONFIGS if make(k).mask_aware] + ["learned_rowcol"]


@pytest.mark.parametrize("key", MASK_AWARE)
def test_image_alone_and_padded_in_a_batch_get_the_same_code(key):
    pe = make(key)
    small, big = (3, 4), (5, 6)  # within learned_rowcol's max_size (past it the table is resampled)
    mask = torch.zeros(2, *big, dtype=torch.bool)
    mask[1, small[0]:] = True  # image 1 is the small one, padded bottom and right
    mask[1, :, small[1]:] = True
    alone = grid_of(pe, small)
    padded = pe(big, mask)[1].view(*big, -1)[: small[0], : small[1]]
    torch.testing.assert_close(padded, alone, atol=1e-6, rtol=1e-6)
    if key == "sine":  # the mask matters: without it the big grid's normalisation differs
        assert not torch.allclose(grid_of(pe, big)[: small[0], : small[1]], alone, atol=1e-3)


# ---------------------------------------------------------------- learned tables: resize and overflow
def test_learned_abs_same_size_is_identity_and_resize_matches_run_time():
    pe = make("learned_abs")
    before = pe.pos_embed.detach().clone()
    assert pe((4, 6)) is not None and torch.equal(pe((4, 6))[0], before[0])
    pe.resize_((4, 6))
    assert torch.equal(pe.pos_embed, before)
    run_time = pe((6, 3)).detach()  # one axis grows, the other shrinks: non-square both ways
    pe.resize_((6, 3))
    assert pe.grid == (6, 3) and pe.pos_embed.shape == (1, 18, 16)
    torch.testing.assert_close(pe((6, 3)), run_time, atol=0, rtol=0)


@pytest.mark.parametrize("mode", ["bicubic", "bilinear"])
def test_learned_abs_resamples_like_an_image_by_target_size(mode):
    pe = make("learned_abs", interpolation=mode)
    img = pe.pos_embed.detach()[0].view(4, 6, 16).permute(2, 0, 1)[None]  # (1, C, 4, 6)
    up = F.interpolate(img, size=(9, 10), mode=mode, align_corners=False)[0].permute(1, 2, 0)
    torch.testing.assert_close(grid_of(pe, (9, 10)), up, atol=1e-6, rtol=1e-5)
    down = F.interpolate(img, size=(2, 3), mode=mode, align_corners=False, antialias=True)[0].permute(1, 2, 0)
    torch.testing.assert_close(grid_of(pe, (2, 3)), down, atol=1e-6, rtol=1e-5)


def test_learned_abs_keeps_y_and_x_apart_when_resampled():
    pe = make("learned_abs", interpolation="bilinear")
    with torch.no_grad():  # channel 0 = row index, channel 1 = column index
        g = torch.zeros(4, 6, 16)
        g[..., 0] = torch.arange(4.0)[:, None]
        g[..., 1] = torch.arange(6.0)[None, :]
        pe.pos_embed.copy_(g.view(1, 24, 16))
    r = grid_of(pe, (7, 9))
    assert torch.allclose(r[:, :1, 0].expand(7, 9), r[..., 0])  # channel 0 varies along y only
    assert torch.allclose(r[:1, :, 1].expand(7, 9), r[..., 1])  # channel 1 along x only
    assert r[-1, 0, 0] > r[0, 0, 0] and r[0, -1, 1] > r[0, 0, 1]


def test_learned_tables_refuse_a_larger_grid_in_error_mode():
    with pytest.raises(ValueError, match="overflow"):
        make("learned_abs", overflow="error")((5, 6))
    assert make("learned_abs", overflow="error")((3, 6)).shape == (1, 18, 16)  # shrinking still resamples
    with pytest.raises(ValueError, match="max_size"):
        make("learned_rowcol", overflow="error")((7, 3))
    with pytest.raises(ValueError, match="overflow"):
        make("axis2d_learned", overflow="error")((4, 7))


def test_learned_rowcol_reads_the_first_entries_and_interpolates_past_max_size():
    pe = make("learned_rowcol")
    g = grid_of(pe, (3, 5))
    torch.testing.assert_close(g[:, 0, :8], pe.row.weight[:3])
    torch.testing.assert_close(g[0, :, 8:], pe.col.weight[:5])
    big = grid_of(pe, (9, 4))  # rows past max_size 6: the whole row table resampled to 9
    torch.testing.assert_close(big[:, 0, :8], resize_table_1d(pe.row.weight, 9))
    torch.testing.assert_close(big[0, :, 8:], pe.col.weight[:4])
    same = pe.row.weight.detach().clone()
    pe.resize_((6, 6))
    assert torch.equal(pe.row.weight, same)
    pe.resize_((9, 4))  # load time = run time: rows grow to 9, the 6 columns are kept
    assert pe.max_size == (9, 6)
    torch.testing.assert_close(grid_of(pe, (9, 4)), big)


def test_learned_rowcol_init_and_resize_mode_take_effect():
    uni = make("learned_rowcol").row.weight
    assert uni.min() >= 0 and uni.max() <= 1 and uni.std() > 0.2  # DETR's U(0, 1)
    assert make("learned_rowcol", init="trunc_normal").row.weight.std() < 0.04
    pe = make("learned_rowcol", resize_mode="bicubic")
    torch.testing.assert_close(grid_of(pe, (9, 2))[:, 0, :8], resize_table_1d(pe.row.weight, 9, "bicubic"))
    assert not torch.allclose(grid_of(pe, (9, 2)), grid_of(make("learned_rowcol"), (9, 2)))


def test_axis2d_learned_resize_to_same_size_is_identity():
    pe = make("axis2d_learned")
    before, row = pe((4, 6)).detach(), pe.row.weight
    pe.resize_((4, 6))
    assert torch.equal(pe((4, 6)), before) and pe.row.weight is row
    run_time = pe((6, 3)).detach()
    pe.resize_((6, 3))
    assert pe.row.length == 6 and torch.equal(pe((6, 3)), run_time)  # load time = run time


# ---------------------------------------------------------------- state_dict and prefix tokens
@pytest.mark.parametrize("key", FIXED)
def test_fixed_encodings_keep_nothing_in_the_state_dict(key):
    pe = make(key)
    pe((3, 5))  # a cached table must not appear either
    assert len(pe.state_dict()) == 0 and len(list(pe.buffers())) == 0


def test_fixed_fourier_survives_a_module_cast():
    pe = make("fourier")
    ref = pe((3, 5))
    torch.testing.assert_close(pe.to(torch.bfloat16)((3, 5), dtype=torch.float32), ref, atol=0, rtol=0)


@pytest.mark.parametrize("key", [k for k in CONFIGS if k not in FIXED])
def test_learned_encodings_save_only_their_parameters_and_round_trip(key):
    a = make(key)
    params = {n for n, _ in a.named_parameters()}
    record = {GRID_KEY} if key in ("learned_rowcol", "learned_abs", "axis2d_learned", "axis2d_learned_sum") else set()
    assert params and set(a.state_dict()) == params | record  # + the grid of grid-sized tables (issue 19)
    torch.manual_seed(123)
    b = vispe.build(CONFIGS[key][0], **CONFIGS[key][1])
    assert not torch.allclose(a((3, 5)), b((3, 5)))
    b.load_state_dict(a.state_dict())
    assert torch.equal(a((3, 5)), b((3, 5)))


def test_prefix_vectors():
    pe = make("learned_abs")
    p = pe.prefix(dtype=torch.bfloat16)
    assert p.shape == (1, 2, 16) and p.dtype == torch.bfloat16 and "prefix_embed" in pe.state_dict()
    assert make("sine").prefix() is None and make("learned_rowcol").prefix() is None
    assert vispe.build("sine", dim=8, num_prefix_tokens=1).prefix().shape == (1, 1, 8)


def test_none_encoding():
    pe = vispe.build("none", dim=16)
    assert pe.family == "none" and pe((3, 5)) is None and pe.prefix() is None and not pe.state_dict()


# ---------------------------------------------------------------- numerics
@pytest.mark.parametrize("key", list(CONFIGS))
def test_float32_table_under_bfloat16_autocast(key):
    pe = make(key).eval()
    shape = (9, 13)
    ref = pe(shape)  # float32
    pe._cache.clear()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        full = pe(shape, dtype=torch.float32)
        pe._cache.clear()
        low = pe(shape, dtype=torch.bfloat16)
    torch.testing.assert_close(full, ref, atol=1e-6, rtol=1e-6)  # float32-accurate under autocast
    assert low.dtype == torch.bfloat16 and torch.equal(low, ref.to(torch.bfloat16))  # one final cast


SHAPES = [(1, 1), (1, 7), (7, 1), (2, 3), (32, 32)]


@pytest.mark.parametrize("key", list(CONFIGS))
def test_forward_backward_finite_on_every_grid_and_with_padding(key):
    pe = make(key)
    mask = torch.zeros(3, 4, 5, dtype=torch.bool)
    mask[1, 2:] = True  # all-padding rows
    mask[1, :, 3:] = True
    mask[2] = True  # an image that is all padding
    outs = [pe(s) for s in SHAPES] + [pe((4, 5), mask)]
    assert outs[-1].shape == (3, 20, 16)
    for out, s in zip(outs, SHAPES + [(4, 5)]):
        assert out.shape[1:] == (s[0] * s[1], 16) and torch.isfinite(out).all()
    params = list(pe.parameters())
    if not params:
        assert not any(o.requires_grad for o in outs)
        return
    loss = sum((o * torch.randn_like(o)).sum() for o in outs)
    if pe.prefix() is not None:
        loss = loss + pe.prefix().sum()
    loss.backward()
    for p in params:
        assert p.grad is not None and torch.isfinite(p.grad).all() and p.grad.abs().sum() > 0


# ---------------------------------------------------------------- bad input
def test_bad_input_is_refused_naming_the_argument():
    with pytest.raises(ValueError, match="dim=6: expected a multiple of 4"):
        vispe.build("sine", dim=6)
    with pytest.raises(ValueError, match="scale"):
        vispe.build("sine", dim=8, normalize=False, scale=1.0)
    with pytest.raises(ValueError, match="layout='blocked'"):
        vispe.build("sine", dim=8, layout="blocked")
    with pytest.raises(ValueError, match="dim=10"):
        vispe.build("sincos2d", dim=10)
    with pytest.raises(ValueError, match="overflow=.*only applies to axis='learned'"):
        vispe.build("axis2d", dim=8, overflow="error")
    with pytest.raises(ValueError, match="temperature=.*only applies to axis='sinusoidal'"):
        vispe.build("axis2d", dim=8, axis="learned", grid=(3, 3), temperature=100.0)
    with pytest.raises(ValueError, match="axis_order"):
        vispe.build("axis2d", dim=8, compose="sum", axis_order="xy")
    with pytest.raises(ValueError, match="grid=None"):
        vispe.build("axis2d", dim=8, axis="learned")
    with pytest.raises(ValueError, match="dim=4 with project=False"):
        vispe.build("normidx2d", dim=4, project=False)
    with pytest.raises(ValueError, match="interpolation='area'"):
        vispe.build("learned_abs", dim=8, grid=(2, 2), interpolation="area")
    with pytest.raises(ValueError, match="coords='pixel'"):
        vispe.build("fourier", dim=8, coords="pixel")


@pytest.mark.parametrize("key", list(CONFIGS))
def test_mask_of_the_wrong_shape_is_refused(key):
    pe = make(key)
    with pytest.raises(ValueError, match=r"mask has shape \(2, 3, 4\): expected \(B, 3, 5\)"):
        pe((3, 5), torch.zeros(2, 3, 4, dtype=torch.bool))
    with pytest.raises(ValueError, match="mask has dtype"):
        pe((3, 5), torch.zeros(2, 3, 5))
    with pytest.raises(ValueError, match="shape="):
        pe((0, 5))
