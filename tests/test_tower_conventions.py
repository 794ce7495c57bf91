"""The vision towers' 2D position conventions as options of vispe's encodings, element by element
against faithful copies of transformers 5.23's functions, on non-square grids (which axis goes where,
position by position): Qwen2-VL / Qwen2.5-VL RoPE (rope_axial defaults + base, in merge-block order),
Pixtral (``freq_split="even_odd"``), Llama 4 (``axis_order="xy", layout="interleaved", offset=1``,
class token last and unrotated), Qwen3-VL's learned table (learned_abs ``interpolation="bilinear",
align_corners=True, antialias=False``); and the refusals of the new options."""
from __future__ import annotations

import pytest
import torch

from vispe.axis.rope import apply_rope
from vispe.models.towers.qwen_vl import merge_block_cells
from vispe.registry import build

SHAPES = [(4, 6), (6, 2)]  # non-square both ways, multiples of the merge size 2


def qwen2_vl_reference(grid_thw: torch.Tensor, head_dim: int, theta: float, merge: int):
    """transformers 5.23 ``Qwen2VLVisionRotaryEmbedding`` (compute_axial_rope_parameters, forward,
    recomposition_frequencies) at ``vision_utils.get_vision_position_ids``' ids.  # cos, sin (N, head_dim)"""
    spatial_dim = head_dim // 2
    inv_freq = 1.0 / (theta ** (torch.arange(0, spatial_dim, 2, dtype=torch.float) / spatial_dim))
    position_ids = []
    for t, h, w in grid_thw.tolist():
        hpos_ids, wpos_ids = torch.meshgrid(torch.arange(h), torch.arange(w), indexing="ij")
        block_shape = (h // merge, merge, w // merge, merge)
        hpos_ids = hpos_ids.reshape(block_shape).transpose(1, 2).flatten()
        wpos_ids = wpos_ids.reshape(block_shape).transpose(1, 2).flatten()
        position_ids.append(torch.stack([hpos_ids, wpos_ids], dim=-1).repeat(t, 1))
    position_ids = torch.cat(position_ids, dim=0)
    freqs = position_ids[..., None].float() * inv_freq

    def recomposition(freq):
        freq_h, freq_w = freq[:, 0], freq[:, 1]
        freq_hw = torch.cat([freq_h, freq_w], dim=-1)
        return torch.cat([freq_hw, freq_hw], dim=-1)

    return recomposition(freqs.cos()), recomposition(freqs.sin())


def pixtral_reference(h: int, w: int, head_dim: int, theta: float):
    """transformers 5.23 ``PixtralVisionRotaryEmbedding`` at ``PixtralVisionModel``'s position ids of one
    (h, w) image.  # cos, sin (h*w, head_dim)"""
    inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.float) / head_dim))
    inv_freq_2d = torch.cat([inv_freq[0::2], inv_freq[1::2]])
    hpos_ids, wpos_ids = torch.meshgrid(torch.arange(h), torch.arange(w), indexing="ij")
    position_ids = torch.stack([hpos_ids.flatten(), wpos_ids.flatten()], dim=-1)
    freqs = position_ids[..., None].float() * inv_freq_2d

    def recomposition(freq):
        freq_h, freq_w = (m[:, i % 2] for i, m in enumerate(freq.chunk(2, dim=-1)))
        freq_hw = torch.cat([freq_h, freq_w], dim=-1)
        return torch.cat([freq_hw, freq_hw], dim=-1)

    return recomposition(freqs.cos()), recomposition(freqs.sin())


def llama4_reference(h: int, w: int, head_dim: int, theta: float) -> torch.Tensor:
    """transformers 5.23 ``Llama4VisionRotaryEmbedding._compute_freqs_ci``, its square idx x idx grid
    written as h x w (``img_idx % w``, ``img_idx // w``; the rest verbatim).  # (h*w + 1, 1, head_dim/2) complex"""
    img_idx = torch.arange(h * w, dtype=torch.int32).reshape(h * w, 1)
    img_idx = torch.cat([img_idx, img_idx[:1]], dim=0)
    img_idx[-1, -1] = -2  # ID_CLS_TOKEN
    frequencies_x = img_idx % w
    frequencies_y = img_idx // w
    freq_dim = head_dim // 2
    rope_freq = 1.0 / (theta ** (torch.arange(0, freq_dim, 2)[: (freq_dim // 2)].float() / freq_dim))
    freqs_x = ((frequencies_x + 1)[..., None] * rope_freq[None, None, :]).repeat_interleave(2, dim=-1)
    freqs_y = ((frequencies_y + 1)[..., None] * rope_freq[None, None, :]).repeat_interleave(2, dim=-1)
    freqs = torch.cat([freqs_x, freqs_y], dim=-1).float().contiguous()[..., ::2]
    freqs = freqs.masked_fill(img_idx.reshape(-1, 1, 1) < 0, 0)
    return torch.view_as_complex(torch.stack([torch.cos(freqs), torch.sin(freqs)], dim=-1))


def llama4_apply(x: torch.Tensor, freqs_ci: torch.Tensor) -> torch.Tensor:
    """transformers 5.23 ``vision_apply_rotary_emb`` on one tensor (B, N, heads, head_dim)."""
    x_ = torch.view_as_complex(x.float().reshape(*x.shape[:-1], -1, 2))
    shape = [d if i == 1 or i == x_.ndim - 1 else 1 for i, d in enumerate(x_.shape)]
    return torch.view_as_real(x_ * freqs_ci.view(*shape)).flatten(3).type_as(x)


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("head_dim", [8, 16])
def test_qwen2_vl_is_rope_axial_base_theta_in_merge_block_order(shape, head_dim):
    h, w = shape
    pe = build("rope_axial", head_dim=head_dim, num_heads=1, base=10000.0)
    a = pe(shape)[0, 0][merge_block_cells(h, w, 2)]  # (N, head_dim/2), raster -> merge-block order
    cos, sin = qwen2_vl_reference(torch.tensor([[2, h, w]]), head_dim, 10000.0, 2)  # two frames
    torch.testing.assert_close(torch.cat([a, a], -1).cos().repeat(2, 1), cos, rtol=0, atol=1e-6)
    torch.testing.assert_close(torch.cat([a, a], -1).sin().repeat(2, 1), sin, rtol=0, atol=1e-6)
    xy = build("rope_axial", head_dim=head_dim, num_heads=1, base=10000.0, axis_order="xy")(shape)[0, 0]
    assert not torch.allclose(xy[merge_block_cells(h, w, 2)].cos(), cos[: h * w, : head_dim // 2], atol=1e-3)


@pytest.mark.parametrize("shape", SHAPES + [(3, 5)])
@pytest.mark.parametrize("head_dim", [8, 16])
def test_pixtral_is_rope_axial_even_odd(shape, head_dim):
    pe = build("rope_axial", head_dim=head_dim, num_heads=1, base=10000.0, freq_split="even_odd")
    a = pe(shape)[0, 0]  # (N, head_dim/2), raster order as Pixtral's
    cos, sin = pixtral_reference(*shape, head_dim, 10000.0)
    torch.testing.assert_close(torch.cat([a, a], -1).cos(), cos, rtol=0, atol=1e-6)
    torch.testing.assert_close(torch.cat([a, a], -1).sin(), sin, rtol=0, atol=1e-6)
    shared = build("rope_axial", head_dim=head_dim, num_heads=1, base=10000.0)(shape)[0, 0]
    assert not torch.allclose(shared.cos(), cos[:, : head_dim // 2], atol=1e-3)  # x takes other frequencies


@pytest.mark.parametrize("shape", SHAPES + [(3, 5)])
def test_llama4_is_rope_axial_xy_interleaved_one_based_class_token_last(shape):
    h, w, head_dim = *shape, 16
    pe = build("rope_axial", head_dim=head_dim, num_heads=2, base=10000.0, axis_order="xy", layout="interleaved",
               offset=1)
    angles = pe(shape)[0, 0]  # (N, head_dim/2)
    angles = torch.cat([angles, angles.new_zeros(1, head_dim // 2)])  # class token appended, unrotated
    ref = llama4_reference(h, w, head_dim, 10000.0)  # (N + 1, 1, head_dim/2)
    torch.testing.assert_close(angles.cos(), ref.real[:, 0], rtol=0, atol=1e-6)
    torch.testing.assert_close(angles.sin(), ref.imag[:, 0], rtol=0, atol=1e-6)
    q = torch.randn(2, h * w + 1, 2, head_dim)  # (B, N + 1, heads, head_dim)
    got = apply_rope(q.transpose(1, 2), angles, "interleaved").transpose(1, 2)
    torch.testing.assert_close(got, llama4_apply(q, ref), rtol=0, atol=1e-5)
    zero_based = build("rope_axial", head_dim=head_dim, num_heads=2, base=10000.0, axis_order="xy",
                       layout="interleaved")(shape)[0, 0]
    assert not torch.allclose(zero_based.cos(), ref.real[:-1, 0], atol=1e-3)


def test_blocked_split_gives_y_the_high_half_and_x_the_low_half():
    F = 10000.0 ** (-torch.arange(0, 16, 2).float() / 16)  # (8,) one schedule over head_dim 16
    a = build("rope_axial", head_dim=16, num_heads=1, base=10000.0, freq_split="blocked")((3, 5))[0, 0]
    y, x = torch.meshgrid(torch.arange(3.0), torch.arange(5.0), indexing="ij")
    want = torch.cat([y.flatten()[:, None] * F[:4], x.flatten()[:, None] * F[4:]], -1)
    torch.testing.assert_close(a, want, rtol=1e-6, atol=1e-6)


def test_offset_cancels_between_patches_and_shows_against_an_unrotated_class_token():
    """A common offset leaves patch-to-patch logits unchanged; against the class token (angle 0) they move."""
    kw = dict(head_dim=8, num_heads=1, base=100.0)
    a0, a1 = (build("rope_axial", offset=o, **kw)((3, 4))[0, 0] for o in (0, 1))
    q, k = torch.randn(12, 8), torch.randn(12, 8)
    s0 = apply_rope(q, a0) @ apply_rope(k, a0).T
    s1 = apply_rope(q, a1) @ apply_rope(k, a1).T
    torch.testing.assert_close(s0, s1, rtol=1e-5, atol=1e-5)
    cls = torch.randn(1, 8)
    assert not torch.allclose(apply_rope(q, a0) @ cls.T, apply_rope(q, a1) @ cls.T, atol=1e-3)


def test_offset_at_cell_centres_equals_the_grid():
    pe = build("rope_axial", head_dim=8, num_heads=1, offset=1, axis_order="xy")
    h, w = 3, 5
    y, x = torch.meshgrid((torch.arange(h) + 0.5) / h, (torch.arange(w) + 0.5) / w, indexing="ij")
    at = pe.at(torch.stack([y, x], -1).reshape(1, -1, 2), torch.tensor([[h, w]]))
    torch.testing.assert_close(at, pe((h, w)), rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("kwargs, match", [
    (dict(freq_split="odd_even"), "freq_split='odd_even': expected one of"),
    (dict(freq_split="even_odd", base=None, min_period=1.0, max_period=10.0), "freq_split='even_odd' with min_period"),
    (dict(freq_split="blocked", scaling="ntk", ref_grid=(4, 4)), "freq_split='blocked' with scaling='ntk'"),
    (dict(offset=1, coords="centered"), "offset=1 with coords='centered'"),
    (dict(offset=1, scaling="pi", ref_grid=(4, 4)), "offset=1 with scaling='pi'"),
    (dict(offset="1"), "offset='1': expected a finite number"),
    (dict(offset=float("nan")), "offset=nan: expected a finite number"),
])
def test_new_options_refused_where_they_make_no_sense(kwargs, match):
    with pytest.raises(ValueError, match=match):
        build("rope_axial", head_dim=16, num_heads=2, **kwargs)


def test_new_options_with_yarn_and_mixed():
    """freq_split takes YaRN (per frequency); rope_mixed takes offset (its coordinate convention)."""
    pe = build("rope_axial", head_dim=16, num_heads=1, freq_split="even_odd", scaling="yarn", ref_grid=(2, 2))
    assert torch.isfinite(pe((4, 6))).all()
    m0, m1 = (build("rope_mixed", head_dim=8, num_heads=2, offset=o) for o in (0, 1))
    m1.load_state_dict(m0.state_dict())
    fy, fx = m0.freqs.detach().unbind(-1)  # (heads, d/2)
    torch.testing.assert_close(m1((2, 3)) - m0((2, 3)), (fy + fx)[None, :, None].expand(1, 2, 6, 4), rtol=1e-5,
                               atol=1e-5)


def qwen3_vl_reference_table(table: torch.Tensor, h: int, w: int, merge: int) -> torch.Tensor:
    """transformers 5.23 ``vision_utils.get_vision_interpolation_indices_and_weights`` (bilinear,
    align_corners=True, one image, t = 1) and ``Qwen3VLVisionModel``'s weighted sum of ``pos_embed``
    rows.  # (h*w, C) in merge-block order"""
    side = int(table.shape[0] ** 0.5)
    within = torch.arange(h * w)
    heights, widths = torch.full_like(within, h), torch.full_like(within, w)
    blocks_w = widths // merge
    in_col = within % merge
    in_row = (within // merge) % merge
    block_col = (within // (merge * merge)) % blocks_w
    block_row = within // (merge * merge * blocks_w)
    row = block_row * merge + in_row
    col = block_col * merge + in_col

    def taps(index, size):  # _interpolation_axis_taps_weights, mode="bilinear", align_corners=True, "border"
        index = index.to(torch.float32)
        src = index * (side - 1) / torch.clamp(size - 1, min=1)
        floor = torch.floor(src)
        offsets = torch.arange(0, 2)
        raw_taps = floor.long()[:, None] + offsets
        t = raw_taps.clamp(0, side - 1)
        distance = (src[:, None] - floor[:, None] - offsets).abs()
        return t, (1 - distance).clamp(min=0)

    h_taps, h_weights = taps(row, heights)
    w_taps, w_weights = taps(col, widths)
    n = h_taps.shape[1]
    indices = (h_taps[:, :, None] * side + w_taps[:, None, :]).reshape(-1, n * n)
    weights = (h_weights[:, :, None] * w_weights[:, None, :]).reshape(-1, n * n)
    return (table[indices] * weights[:, :, None]).sum(1)


@pytest.mark.parametrize("shape", [(4, 6), (8, 2), (2, 2)])  # shrinking, growing, mixed, one block
def test_qwen3_vl_table_is_learned_abs_bilinear_align_corners(shape):
    h, w = shape
    torch.manual_seed(0)  # the table's values must not depend on which tests ran before on this worker
    pe = build("learned_abs", dim=8, grid=(5, 5), interpolation="bilinear", align_corners=True, antialias=False)
    with torch.no_grad():
        pe.pos_embed.normal_()
    got = pe(shape)[0][merge_block_cells(h, w, 2)]  # (h*w, 8) raster -> merge-block order
    # float32 interpolation against a gather of weighted taps: another summation order (1e-5 relative)
    torch.testing.assert_close(got, qwen3_vl_reference_table(pe.pos_embed[0].detach(), h, w, 2), rtol=1e-5, atol=1e-6)
    plain = build("learned_abs", dim=8, grid=(5, 5), interpolation="bilinear", antialias=False)
    plain.load_state_dict(pe.state_dict())
    assert not torch.allclose(plain(shape)[0][merge_block_cells(h, w, 2)], got, atol=1e-3)


def test_qwen3_vl_table_per_image_in_a_padded_batch():
    """mask_aware=True resizes the table to each image's own grid, as Qwen3-VL does per image."""
    pe = build("learned_abs", dim=8, grid=(5, 5), interpolation="bilinear", align_corners=True, antialias=False,
               mask_aware=True)
    mask = torch.ones(2, 6, 8, dtype=torch.bool)
    mask[0, :4, :6] = False
    mask[1, :6, :2] = False
    out = pe((6, 8), mask).view(2, 6, 8, -1)
    for b, (h, w) in enumerate([(4, 6), (6, 2)]):
        want = qwen3_vl_reference_table(pe.pos_embed[0].detach(), h, w, 2)
        got = out[b, :h, :w].reshape(h * w, -1)[merge_block_cells(h, w, 2)]
        torch.testing.assert_close(got, want, rtol=0, atol=1e-6)
    with pytest.raises(ValueError, match="align_corners='yes': expected True or False"):
        build("learned_abs", dim=8, grid=(5, 5), align_corners="yes")


# --- the tower classes' own settings ---------------------------------------------------------------
@pytest.fixture(scope="module")
def converted():
    """Each rotary tower converted from transformers' tiny random model (results/compare/parity_towers.py),
    with the original's rotary theta (its config's, read here, not the tower's)."""
    from tests.conftest import load_compare_script
    from vispe.models.vit import convert_vit

    pt = load_compare_script("parity_towers")
    out = {}
    for name in ("qwen2_vl", "pixtral", "llama4"):
        original = pt.TOWERS[name].build("tiny")
        cfg = getattr(original.config, "vision_config", original.config)
        params = getattr(cfg, "rope_parameters", None) or {}
        theta = float(params.get("rope_theta", getattr(cfg, "rope_theta", 10000.0)))
        out[name] = convert_vit(original).eval(), theta
    return out


def _tower_encodings(model):
    """The rotary encodings of the converted tower's attention layers (one per layer).  # list"""
    pes = [m for n, m in model.named_modules() if n.split(".")[-1] == "pe" and getattr(m, "family", "") == "rotary"]
    assert len(pes) >= 2
    return pes


@pytest.mark.parametrize("shape", SHAPES)
def test_each_towers_own_encoding_is_its_originals_convention(converted, shape):
    """The encodings the tower classes build (``native_pe``: Qwen2-VL's base theta in merge-block order,
    Pixtral's even/odd split, Llama 4's x first, interleaved and 1-based) against the references above,
    position by position on non-square grids, in every layer: the classes' settings, not only
    rope_axial's options."""
    h, w = shape
    model, theta = converted["qwen2_vl"]
    for pe in _tower_encodings(model):
        a = pe(shape)[0, 0][merge_block_cells(h, w, 2)]  # (N, head_dim/2)
        cos, sin = qwen2_vl_reference(torch.tensor([[1, h, w]]), pe.head_dim, theta, 2)
        torch.testing.assert_close(torch.cat([a, a], -1).cos(), cos, rtol=0, atol=1e-6)
        torch.testing.assert_close(torch.cat([a, a], -1).sin(), sin, rtol=0, atol=1e-6)
    model, theta = converted["pixtral"]
    for pe in _tower_encodings(model):
        a = pe(shape)[0, 0]
        cos, sin = pixtral_reference(h, w, pe.head_dim, theta)
        torch.testing.assert_close(torch.cat([a, a], -1).cos(), cos, rtol=0, atol=1e-6)
        torch.testing.assert_close(torch.cat([a, a], -1).sin(), sin, rtol=0, atol=1e-6)
    model, theta = converted["llama4"]
    for pe in _tower_encodings(model):
        a = pe(shape)[0, 0]
        a = torch.cat([a, a.new_zeros(1, a.shape[-1])])  # the class token, appended and unrotated
        ref = llama4_reference(h, w, pe.head_dim, theta)  # (N + 1, 1, head_dim/2)
        q = torch.randn(2, h * w + 1, 1, pe.head_dim)  # (B, N + 1, heads, head_dim)
        got = apply_rope(q.transpose(1, 2), a, pe.layout).transpose(1, 2)
        torch.testing.assert_close(got, llama4_apply(q, ref), rtol=0, atol=1e-5)
