"""Positioned object queries: rotary cross-attention from anchors (relative property), BoxRPB against
a copy of Plain-DETR's formula, padded-batch invariance of every design with every mask-aware
encoding, every (design, encoding) pair placed, the designs' options."""
import math

import pytest
import torch

import vispe
from vispe.attention import Attention, PosContext
from vispe.models.detr import create_detr
from vispe.models.detr.transformer.box_bias import BoxRPB

SMALL = dict(backbone="small_cnn", backbone_widths=(8, 16, 16, 32), d_model=32, nheads=4, enc_layers=1,
             dec_layers=2, dim_feedforward=64, num_queries=6, dropout=0.0,
             init="legacy")  # a box head that is not zero: the boxes depend on the image (the papers' start at the anchors)
DESIGNS = {
    "conditional": dict(decoder="conditional"),
    "dab": dict(decoder="dab"),
    "dab+boxrpb": dict(decoder="dab", box_bias="boxrpb", box_bias_kwargs=dict(hidden=16)),
    "dab points": dict(decoder="dab", decoder_kwargs=dict(query_dim=2)),
    "dab rope_axial": dict(decoder="dab", dec_pe="rope_axial"),
    "dab rope_mixed": dict(decoder="dab", dec_pe="rope_mixed"),
    "conditional rope_mixed": dict(decoder="conditional", dec_pe="rope_mixed"),
    "dab fourier anchors": dict(decoder="dab", decoder_kwargs=dict(anchor_pe="fourier",
                                                                   anchor_pe_kwargs=dict(mask_aware=True))),
}


def small(pe="sine", **kw):
    torch.manual_seed(0)
    return create_detr(4, **{**SMALL, "pe": pe, **kw}).eval()


# --- rotary cross-attention: logits depend only on the anchor-to-key offset ---------------------------
@pytest.mark.parametrize("name", ["rope_axial", "rope_mixed"])
def test_rotary_cross_attention_logits_depend_only_on_the_anchor_to_key_offset(name):
    """Same query content at anchors p and p + (dy, dx) cells, same key content at cells c and c + (dy, dx):
    equal logits; at another offset, another logit (so the check can fail)."""
    torch.manual_seed(0)
    attn = Attention(32, 4, qkv_bias=True, pe=vispe.build(name, head_dim=8, num_heads=4)).eval()
    h, w = 5, 7
    q_content, k_content = torch.randn(32), torch.randn(32)
    memory = torch.randn(1, h * w, 32)
    c1, c2 = (1, 2), (3, 5)  # key cells (y, x): offset (2, 3)
    memory[0, c1[0] * w + c1[1]] = k_content
    memory[0, c2[0] * w + c2[1]] = k_content
    p1 = torch.tensor([0.37, 0.21])  # anchor in unit (y, x): cells (1.35, 0.97)
    p2 = p1 + torch.tensor([2 / h, 3 / w])  # shifted by the same (2, 3) cells
    p3 = p1 + torch.tensor([1 / h, 3 / w])
    x = q_content.expand(1, 3, 32)
    ctx = PosContext(coords=torch.stack([p1, p2, p3])[None])
    mem_ctx = PosContext((h, w))
    q, k, _ = attn._cross_qkv(x, ctx, memory, mem_ctx)
    q, k = attn._rotate_cross(q, k, ctx, mem_ctx)
    logits = q @ k.transpose(-1, -2)  # (1, heads, 3, h*w)
    l1, l2, l3 = (logits[0, :, i, c[0] * w + c[1]] for i, c in ((0, c1), (1, c2), (2, c2)))
    torch.testing.assert_close(l1, l2, rtol=0, atol=1e-5)
    assert (l1 - l3).abs().max() > 1e-3


def test_rotary_cross_attention_of_a_padded_image_uses_its_valid_extent():
    """The anchors are unit coordinates of each image's valid area: an image alone (3 x 4 keys) and the
    same keys padded into 5 x 6 give the same attention output."""
    torch.manual_seed(0)
    attn = Attention(32, 4, qkv_bias=True, pe=vispe.build("rope_axial", head_dim=8, num_heads=4)).eval()
    mem_small = torch.randn(1, 3, 4, 32)
    mem_big = torch.randn(1, 5, 6, 32)
    mem_big[:, :3, :4] = mem_small
    mask = torch.ones(1, 5, 6, dtype=torch.bool)
    mask[:, :3, :4] = False
    x, coords = torch.randn(1, 4, 32), torch.rand(1, 4, 2)
    alone = attn(x, ctx=PosContext(coords=coords), memory=mem_small.flatten(1, 2), memory_ctx=PosContext((3, 4)))
    padded = attn(x, ctx=PosContext(coords=coords), memory=mem_big.flatten(1, 2), memory_ctx=PosContext((5, 6), mask=mask))
    torch.testing.assert_close(alone, padded, rtol=0, atol=1e-5)


# --- BoxRPB against Plain-DETR's formula ---------------------------------------------------------------
def plain_detr_box_rpb(mlp_x, mlp_y, boxes, h, w, stride, rpe_type):
    """Plain-DETR's GlobalCrossAttention bias, written from its formula (one image, no padding)."""
    ref = boxes[:, :, None]  # (B, Q, 1, 4) cx, cy, w, h
    pts = torch.cat([ref[..., :2] - ref[..., 2:] / 2, ref[..., :2] + ref[..., 2:] / 2], -1)  # x1 y1 x2 y2
    pts[..., 0::2] *= w * stride
    pts[..., 1::2] *= h * stride
    pos_x = torch.linspace(0.5, w - 0.5, w)[None, None, :, None] * stride
    pos_y = torch.linspace(0.5, h - 0.5, h)[None, None, :, None] * stride
    dx, dy = pts[..., 0::2] - pos_x, pts[..., 1::2] - pos_y  # (B, Q, w, 2), (B, Q, h, 2)
    if rpe_type == "abs_log8":
        dx = torch.sign(dx) * torch.log2(dx.abs() + 1.0) / math.log2(8)
        dy = torch.sign(dy) * torch.log2(dy.abs() + 1.0) / math.log2(8)
    rx, ry = mlp_x(dx), mlp_y(dy)  # (B, Q, w, heads), (B, Q, h, heads)
    return (rx[:, :, None] + ry[:, :, :, None]).flatten(2, 3).permute(0, 3, 1, 2)  # (B, heads, Q, h*w)


@pytest.mark.parametrize("transform", ["linear", "abs_log8"])
def test_boxrpb_equals_plain_detr_formula_element_by_element(transform):
    torch.manual_seed(0)
    rpb = BoxRPB(3, hidden=16, transform=transform, stride=8.0)
    boxes = torch.rand(2, 5, 4) * 0.5 + 0.2
    h, w = 3, 7  # non-square: a swapped axis would not match
    ours = rpb(boxes, (h, w))
    ref = plain_detr_box_rpb(rpb.mlp_x, rpb.mlp_y, boxes, h, w, 8.0, transform)
    torch.testing.assert_close(ours, ref, rtol=1e-5, atol=1e-5)
    swapped = plain_detr_box_rpb(rpb.mlp_y, rpb.mlp_x, boxes, h, w, 8.0, transform)
    assert (ours - swapped).abs().max() > 1e-3


def test_boxrpb_of_a_padded_image_equals_the_image_alone_on_its_cells():
    torch.manual_seed(0)
    rpb = BoxRPB(2, hidden=8, stride=4.0)
    boxes = torch.rand(1, 3, 4) * 0.5 + 0.2
    mask = torch.ones(1, 5, 6, dtype=torch.bool)
    mask[:, :3, :4] = False
    alone = rpb(boxes, (3, 4)).view(1, 2, 3, 3, 4)
    padded = rpb(boxes, (5, 6), mask).view(1, 2, 3, 5, 6)[..., :3, :4]
    torch.testing.assert_close(alone, padded, rtol=0, atol=1e-5)


# --- padded-batch invariance of every design with every mask-aware encoding -----------------------------
def mask_aware_encodings():
    """Every registered encoding that is mask-aware, or can be made so, with the kwargs that do it."""
    out = []
    for name in vispe.available():
        cls = vispe.registry.get(name)
        if cls.mask_aware:
            out.append((name, {}))
        elif cls.mask_aware_option:  # e.g. "mask_aware=True", "padding_mode='zeros', the default"
            key, value = cls.mask_aware_option.split(",")[0].split("=")
            out.append((name, {key: True if value == "True" else value.strip("'")}))
    return out


def detector_for(design: str, name: str, kw: dict):
    spec = dict(DESIGNS[design])
    family = vispe.registry.get(name).family
    spec["pe_kwargs"] = kw
    if name == "learned_abs":  # a grid-sized table (resampled to each image's own grid when mask-aware)
        spec["grid"] = (3, 4)
    if family == "conditional":  # PEG at the encoder input; the keys then take the sine
        spec["pe_at"] = {"encoder": "input", "decoder": "attn"}
        spec.setdefault("dec_pe", "sine")
    return small(name, **spec)  # a rotary pe without dec_pe rotates the decoder's cross-attention too


def test_mask_aware_encodings_are_listed():
    names = {n for n, _ in mask_aware_encodings()}
    assert {"sine", "rope_axial", "rope_mixed", "peg", "sincos2d", "fourier"} <= names


@pytest.mark.parametrize("design", list(DESIGNS))
def test_every_design_with_every_mask_aware_encoding_is_batch_invariant(design):
    torch.manual_seed(3)
    a = torch.randn(1, 3, 48, 64)  # multiples of the backbone's stride (16), as collate pads them
    images = torch.zeros(2, 3, 80, 112)
    images[0, :, :48, :64], images[1] = a[0], torch.randn(3, 80, 112)
    mask = torch.ones(2, 80, 112, dtype=torch.bool)
    mask[0, :48, :64] = False
    mask[1] = False
    checked = 0
    for name, kw in mask_aware_encodings():
        if vispe.registry.get(name).family == "bias":
            continue  # none is mask-aware
        model = detector_for(design, name, kw)
        with torch.no_grad():
            alone, both = model(a), model(images, mask)
        for key in ("pred_logits", "pred_boxes"):
            torch.testing.assert_close(both[key][0], alone[key][0], rtol=0, atol=1e-4, msg=f"{design} {name} {key}")
        checked += 1
    assert checked >= 5


def test_invariance_check_can_fail_without_the_mask():
    """Control: the same padded batch without its mask differs from the image alone."""
    model = small("sine", decoder="dab", dec_pe="rope_axial")
    torch.manual_seed(3)
    a = torch.randn(1, 3, 48, 64)
    images = torch.zeros(2, 3, 80, 112)
    images[0, :, :48, :64] = a[0]
    with torch.no_grad():
        alone, unmasked = model(a), model(images)
    assert (unmasked["pred_boxes"][0] - alone["pred_boxes"][0]).abs().max() > 1e-3


# --- every (design, encoding) pair is accepted or refused with a reason -------------------------------
EXPECTED = {  # the family of the decoder's keys -> accepted by the positioned designs?
    "additive": True, "rotary": True, "bias": False, "conditional": False, "none": False,
}


@pytest.mark.parametrize("design", ["conditional", "dab"])
def test_every_registered_encoding_is_placed_for_every_design(design):
    for name in vispe.available():
        family = vispe.registry.get(name).family
        assert family in EXPECTED, f"{name}: family {family!r} is not placed for positioned queries"
        kw = {"grid": (3, 4)} if name in ("learned_abs", "relbias") else {}
        try:
            model = create_detr(4, **{**SMALL, "decoder": design, "dec_pe": name, **kw})
        except ValueError as e:
            assert not EXPECTED[family], f"{name} ({family}) refused: {e}"
            assert name in str(e) and ("decoder" in str(e) or "keys" in str(e)), str(e)
            continue
        assert EXPECTED[family], f"{name} ({family}) accepted but expected refused"
        with torch.no_grad():
            out = model.eval()(torch.randn(1, 3, 48, 64))
        assert torch.isfinite(out["pred_boxes"]).all()


def test_every_additive_encoding_either_evaluates_at_coordinates_or_says_why():
    """The contract's extension, registry-wide: encodings that support coordinates agree with their grid
    (offset convention per docstring); the others refuse naming the reason."""
    for name in vispe.available():
        cls = vispe.registry.get(name)
        pe = vispe.registry.build_in(name, dict(dim=32, num_heads=4, head_dim=8, num_prefix_tokens=0, grid=(3, 5)))
        coords = torch.rand(1, 4, 2)
        if not pe.supports_coords:  # an instance's answer: fourier evaluates at coordinates when mask-aware
            with pytest.raises(ValueError, match="cannot be evaluated at continuous coordinates: "):
                pe.at(coords, torch.tensor([[3.0, 5.0]]))
            continue
        assert cls.family in ("additive", "rotary"), name
        out = pe.at(coords, torch.tensor([[3.0, 5.0]]))
        tokens = -4 if getattr(pe, "block_size", 2) > 2 else -2  # block rotations (B|1, H, N, nb, b, b)
        assert torch.isfinite(out).all() and out.shape[tokens] == 4, name


def test_anchor_pe_must_support_coordinates():
    with pytest.raises(ValueError, match="anchor_pe='learned_abs'.*cannot"):
        create_detr(4, **{**SMALL, "decoder": "dab",
                          "decoder_kwargs": dict(anchor_pe="learned_abs", anchor_pe_kwargs=dict(grid=(4, 4)))})


# --- options ---------------------------------------------------------------------------------------------
def test_design_options_are_checked():
    with pytest.raises(ValueError, match=r"decoder_kwargs has \['modulate'\] for decoder='dab'"):
        small(decoder="dab", decoder_kwargs=dict(modulate=True))
    with pytest.raises(ValueError, match="modulate_hw=True with query_dim=2"):
        small(decoder="dab", decoder_kwargs=dict(query_dim=2, modulate_hw=True))
    with pytest.raises(ValueError, match="box_bias='boxrpb' with decoder='conditional': it needs anchor boxes"):
        small(decoder="conditional", box_bias="boxrpb")
    with pytest.raises(ValueError, match="box_bias='boxrpb' with decoder='detr'"):
        small(box_bias="boxrpb")
    with pytest.raises(ValueError, match="decoder='yolo'"):
        small(decoder="yolo")
    with pytest.raises(ValueError, match="relbias.*decoder='dab' needs"):
        small(decoder="dab", dec_pe="relbias", grid=(3, 4))
    with pytest.raises(ValueError, match="pe_at decoder='input' with decoder='dab'"):
        small(decoder="dab", pe_at={"encoder": "attn", "decoder": "input"})


def test_dab_options_change_the_model():
    """Same weights (seed 0; the options add or drop no parameter used here): refinement moves the
    last layer's anchors, so its boxes differ without it."""
    images = torch.randn(1, 3, 48, 64)
    base, fixed = small(decoder="dab"), small(decoder="dab", decoder_kwargs=dict(iter_refine=False))
    with torch.no_grad():
        o1, o2 = base(images), fixed(images)
    torch.testing.assert_close(o1["aux_outputs"][0]["pred_boxes"], o2["aux_outputs"][0]["pred_boxes"])  # layer 0
    assert (o1["pred_boxes"] - o2["pred_boxes"]).abs().max() > 1e-4
    assert small(decoder="dab", decoder_kwargs=dict(modulate_hw=False)).queries.ref_anchor_head is None


def test_random_refpoints_xy_stay_fixed_while_wh_train():
    model = small(decoder="dab", decoder_kwargs=dict(random_refpoints_xy=True)).train()
    before = model.query_embed.weight.detach().clone()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    out = model(torch.randn(2, 3, 48, 64))
    (out["pred_boxes"].sum() + out["pred_logits"].sum()).backward()
    opt.step()
    after = model.query_embed.weight.detach()
    torch.testing.assert_close(after[:, :2], before[:, :2], rtol=0, atol=0)
    assert (after[:, 2:] - before[:, 2:]).abs().max() > 0


def test_gradients_reach_the_anchors_the_rotary_frequencies_and_the_box_bias():
    model = small("sine", decoder="dab", dec_pe="rope_mixed").train()
    out = model(torch.randn(2, 3, 48, 64))
    (out["pred_boxes"].sum() + out["pred_logits"].sum()).backward()
    assert model.query_embed.weight.grad.abs().sum() > 0
    assert model.transformer.decoder[0].cross_attn.pe.freqs.grad.abs().sum() > 0
    model = small("sine", decoder="dab", box_bias="boxrpb", box_bias_kwargs=dict(hidden=8)).train()
    out = model(torch.randn(2, 3, 48, 64))
    out["pred_logits"].sum().backward()
    assert model.transformer.decoder[1].box_bias.mlp_x[0].weight.grad.abs().sum() > 0


@pytest.mark.parametrize("name, kw", [("sine", dict(offset=-0.5, eps=0.0)), ("rope_axial", {}),
                                      ("rope_axial", dict(coords="normalized", ref_grid=(4, 4), scale=0.7)),
                                      ("rope_axial", dict(coords="centered")), ("rope_mixed", {}),
                                      ("fourier", dict(mask_aware=True)),
                                      ("fourier", dict(mask_aware=True, coords="index", learnable=True, mlp_dim=8))])
def test_at_cell_centres_equals_the_grid_code_position_by_position(name, kw):
    """Unit coordinates (i + 0.5) / n of a non-square grid, with a padded second image: ``at`` gives the
    grid path's values token by token (y first: a swap would differ on 3 x 5)."""
    pe = vispe.registry.build_in(name, dict(dim=32, num_heads=2, head_dim=16, num_prefix_tokens=0), **kw)
    mask = torch.zeros(2, 4, 6, dtype=torch.bool)
    mask[1, 3:] = True
    mask[1, :, 5:] = True  # image 1: 3 x 5 valid
    grid = pe((4, 6), mask)  # (2, ..., 24, C)
    extent = torch.tensor([[4.0, 6.0], [3.0, 5.0]])
    ys, xs = torch.meshgrid(torch.arange(4.0), torch.arange(6.0), indexing="ij")
    cells = torch.stack([ys, xs], -1).reshape(1, 24, 2)
    coords = (cells + 0.5) / extent[:, None]  # (2, 24, 2)
    at = pe.at(coords, extent)
    valid = ~mask.reshape(2, 24)
    for b in range(2):
        torch.testing.assert_close(at[b][..., valid[b], :], grid[b][..., valid[b], :], rtol=0, atol=1e-5)
    transposed = pe.at(coords.flip(-1), extent.flip(-1))
    assert (transposed[0] - grid[0]).abs().max() > 1e-3


@pytest.mark.parametrize("name", ["sine", "rope_axial", "rope_mixed"])
def test_at_is_computed_in_float32_under_bfloat16_autocast(name):
    """FIELD-NOTES: low-precision angles. Under autocast the codes and angles at coordinates are the
    float32 ones (rotary: float32 angles; additive: float32 math, cast at the end)."""
    pe = vispe.registry.build_in(name, dict(dim=64, num_heads=2, head_dim=32, num_prefix_tokens=0))
    coords, extent = torch.rand(2, 7, 2), torch.tensor([[37.0, 53.0]])  # large grids: large angles
    ref = pe.at(coords, extent)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        low = pe.at(coords, extent, dtype=torch.bfloat16)
    if pe.family == "rotary":
        assert low.dtype == torch.float32
        torch.testing.assert_close(low, ref, rtol=0, atol=0)
    else:
        assert low.dtype == torch.bfloat16
        torch.testing.assert_close(low.float(), ref, rtol=0, atol=8e-3)  # one bf16 rounding of values in [-1, 1]
        assert (coords.bfloat16().float() * 2 * math.pi - coords * 2 * math.pi).abs().max() > 1e-3  # bf16 math would not be
