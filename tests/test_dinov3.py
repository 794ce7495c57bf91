"""DINOv3's RoPE as rope_axial options, and DINOv3 ViTs from timm and transformers converted exactly."""
from __future__ import annotations

import copy
import math

import pytest
import torch

from vispe.models.dinov3 import dinov3_rope_kwargs
from vispe.registry import build

HEAD_DIM, HEADS = 16, 2


def dinov3_reference_angles(H: int, W: int, head_dim: int, *, base=100.0, min_period=None, max_period=None,
                            normalize_coords="separate") -> torch.Tensor:
    """A faithful copy of facebookresearch/dinov3 RopePositionEmbedding (eval mode), stopped at the
    angles before ``tile(2)``.  # (H*W, head_dim/2)"""
    dd = {"dtype": torch.float32}
    if base is not None:
        periods = base ** (2 * torch.arange(head_dim // 4, **dd) / (head_dim // 2))
    else:
        b = max_period / min_period
        exponents = torch.linspace(0, 1, head_dim // 4, **dd)
        periods = b ** exponents / b * max_period
    if normalize_coords == "max":
        coords_h = torch.arange(0.5, H, **dd) / max(H, W)
        coords_w = torch.arange(0.5, W, **dd) / max(H, W)
    elif normalize_coords == "min":
        coords_h = torch.arange(0.5, H, **dd) / min(H, W)
        coords_w = torch.arange(0.5, W, **dd) / min(H, W)
    else:
        coords_h = torch.arange(0.5, H, **dd) / H
        coords_w = torch.arange(0.5, W, **dd) / W
    coords = torch.stack(torch.meshgrid(coords_h, coords_w, indexing="ij"), dim=-1).flatten(0, 1)
    coords = 2.0 * coords - 1.0
    angles = 2 * math.pi * coords.unsqueeze(dim=-1) / periods  # (HW, 2, D/4)
    return angles.flatten(-2, -1)


PERIODS = [dict(base=100.0), dict(base=7.0), dict(base=None, min_period=0.5, max_period=40.0)]


@pytest.mark.parametrize("normalize", ["separate", "min", "max"])
@pytest.mark.parametrize("periods", PERIODS, ids=["base100", "base7", "min_max_period"])
def test_angles_equal_dinov3_formula(normalize, periods):
    enc = build("rope_axial", head_dim=HEAD_DIM, num_heads=HEADS,
                **dinov3_rope_kwargs(normalize_coords=normalize, **periods)).eval()
    for shape in [(5, 8), (7, 3)]:
        got = enc(shape)[0, 0]  # (N, d/2)
        want = dinov3_reference_angles(*shape, HEAD_DIM, normalize_coords=normalize, **periods)
        torch.testing.assert_close(got, want, rtol=1e-6, atol=2e-6)


@pytest.mark.parametrize("normalize", ["separate", "min", "max"])
def test_padded_image_gets_the_angles_of_its_own_grid(normalize):
    enc = build("rope_axial", head_dim=HEAD_DIM, num_heads=HEADS, **dinov3_rope_kwargs(normalize_coords=normalize))
    mask = torch.ones(2, 6, 8, dtype=torch.bool)
    mask[0, :3, :7] = False  # image 0: 3 x 7 valid, top-left
    mask[1, :6, :4] = False  # image 1: 6 x 4
    a = enc((6, 8), mask)  # (2, 1, 48, d/2)
    for b, (h, w) in enumerate([(3, 7), (6, 4)]):
        valid = (~mask[b]).flatten()
        want = dinov3_reference_angles(h, w, HEAD_DIM, normalize_coords=normalize)
        torch.testing.assert_close(a[b, 0, valid], want, rtol=1e-6, atol=2e-6)


def _fixed_and_train(gen_seed=0, **aug):
    enc = build("rope_axial", head_dim=HEAD_DIM, num_heads=HEADS, generator=torch.Generator().manual_seed(gen_seed),
                **dinov3_rope_kwargs(**aug))
    fixed = enc.eval()((4, 6))[0, 0]
    train = enc.train()((4, 6))[0, 0]
    return enc, fixed, train


def test_augmentation_off_in_eval_and_seeded_by_the_callers_generator():
    enc, fixed, train = _fixed_and_train(shift_coords=0.3, jitter_coords=1.5, rescale_coords=2.0)
    assert (train - fixed).abs().max() > 1e-2  # train draws change the angles
    torch.testing.assert_close(enc.eval()((4, 6))[0, 0], fixed, rtol=0, atol=0)  # eval: fixed again
    torch.testing.assert_close(fixed, dinov3_reference_angles(4, 6, HEAD_DIM), rtol=1e-6, atol=2e-6)
    _, _, again = _fixed_and_train(shift_coords=0.3, jitter_coords=1.5, rescale_coords=2.0)
    torch.testing.assert_close(again, train, rtol=0, atol=0)  # same seed, same draw
    _, _, other = _fixed_and_train(gen_seed=1, shift_coords=0.3, jitter_coords=1.5, rescale_coords=2.0)
    assert (other - train).abs().max() > 1e-3
    assert enc.fixed_key() is not None and enc.train().fixed_key() is None


def test_rescale_is_one_log_uniform_factor_shared_by_both_axes():
    _, fixed, train = _fixed_and_train(rescale_coords=2.0)
    ratio = train / fixed  # no angle is zero: even sides have no centre patch
    r = ratio.flatten()[0]
    torch.testing.assert_close(ratio, torch.full_like(ratio, float(r)), rtol=1e-5, atol=1e-5)
    assert 0.5 <= r <= 2.0 and abs(float(r) - 1) > 1e-4


def test_stretch_is_one_log_uniform_factor_per_axis():
    _, fixed, train = _fixed_and_train(jitter_coords=3.0)
    q = HEAD_DIM // 4
    ry, rx = (train[:, :q] / fixed[:, :q]), (train[:, q:] / fixed[:, q:])  # y pairs, then x pairs
    for r in (ry, rx):
        torch.testing.assert_close(r, torch.full_like(r, float(r.flatten()[0])), rtol=1e-5, atol=1e-5)
        assert 1 / 3 <= float(r.flatten()[0]) <= 3
    assert abs(float(ry.flatten()[0] - rx.flatten()[0])) > 1e-4


def test_shift_is_one_offset_per_axis_in_coordinate_units():
    _, fixed, train = _fixed_and_train(shift_coords=0.4)
    q = HEAD_DIM // 4
    f = 2 * math.pi / 100.0 ** (2 * torch.arange(q) / (HEAD_DIM // 2))  # 2 pi / period_j
    dy, dx = (train - fixed)[:, :q] / f, (train - fixed)[:, q:] / f  # (N, q) each, the offsets
    for d in (dy, dx):
        torch.testing.assert_close(d, torch.full_like(d, float(d[0, 0])), rtol=0, atol=1e-4)
        assert abs(float(d[0, 0])) <= 0.4


@pytest.mark.parametrize("kwargs, name", [
    (dict(coords="index", normalize_coords="min"), "normalize_coords"),
    (dict(coords="centered", normalize_coords="both"), "normalize_coords"),
    (dict(base=100.0, min_period=1.0, max_period=10.0), "base"),
    (dict(min_period=1.0), "min_period"),
    (dict(stretch=0.5), "stretch"),
    (dict(rescale=float("inf")), "rescale"),
    (dict(generator=0), "generator"),
])
def test_bad_dinov3_options_are_refused_by_name(kwargs, name):
    with pytest.raises(ValueError, match=name):
        build("rope_axial", head_dim=HEAD_DIM, num_heads=HEADS, **kwargs)


# --- converted models ------------------------------------------------------------------------------
def redraw(model: torch.nn.Module, seed: int = 0) -> None:
    """Every parameter redrawn so that nothing is near zero or one by construction (layer scales
    of 1e-5 would hide the blocks): norms and scales in [0.5, 1.5], weights ~ N(0, 1/fan_in)."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() == 1 and any(k in name for k in ("norm", "gamma", "lambda")):
                p.copy_(torch.rand(p.shape, generator=g) + 0.5)
            elif p.dim() >= 2:
                p.copy_(torch.randn(p.shape, generator=g) / math.sqrt(p[0].numel()))
            else:
                p.copy_(torch.randn(p.shape, generator=g) * 0.2)


def test_timm_vit_small_dinov3_converts_exactly():
    timm = pytest.importorskip("timm")
    from vispe.models.vit import convert_vit

    ref = timm.create_model("vit_small_patch16_dinov3", pretrained=False, depth=2, num_classes=0,
                            rope_rescale_coords=2.0).eval()
    redraw(ref)
    model = convert_vit(copy.deepcopy(ref)).eval()
    pe = model.blocks[1].attn.pe
    assert (pe.coords, pe.base, pe.rescale, pe.layout) == ("centered", 100.0, 2.0, "half")
    g = torch.Generator().manual_seed(1)
    for size in [(224, 224), (96, 160)]:
        x = torch.randn(2, 3, *size, generator=g)
        with torch.no_grad():
            want, got = ref.forward_features(x), model.forward_features(x)
        assert want.abs().max() > 1
        torch.testing.assert_close(got, want, rtol=0, atol=1e-4)


@pytest.mark.parametrize("gated, registers, bias", [(False, 4, True), (True, 4, True), (False, 0, False)],
                         ids=["mlp", "swiglu", "no_registers_no_biases"])
def test_transformers_dinov3_converts_exactly(gated, registers, bias):
    transformers = pytest.importorskip("transformers")
    from vispe.models.vit import convert_vit

    cfg = transformers.DINOv3ViTConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                       num_attention_heads=4, num_register_tokens=registers, image_size=64,
                                       patch_size=8, use_gated_mlp=gated, hidden_act="silu" if gated else "gelu",
                                       layerscale_value=1e-5, proj_bias=bias, mlp_bias=bias)
    torch.manual_seed(0)
    hf = transformers.DINOv3ViTModel(cfg).eval()
    redraw(hf)
    model = convert_vit(hf).eval()
    assert model.num_prefix_tokens == 1 + registers and model.blocks[0].attn.pe.rescale == 2.0  # cls + registers
    g = torch.Generator().manual_seed(1)
    for size in [(64, 64), (48, 80)]:
        x = torch.randn(2, 3, *size, generator=g)
        with torch.no_grad():
            want, got = hf(pixel_values=x).last_hidden_state, model.forward_features(x)
        assert want.abs().max() > 1
        torch.testing.assert_close(got, want, rtol=0, atol=1e-4)
    with pytest.raises(ValueError, match="pe"):
        convert_vit(hf, pe="rope_axial")

