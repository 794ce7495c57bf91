"""AIFI's position (``vispe.models.detr.realtime``): the 2D sin-cos in transformers' and the original layouts,
each against a faithful copy of its reference formula, and any vispe encoding swapped in by name after
loading (``rope_mixed``, ``relbias``): runs, trains a step, and an image alone = padded where mask-aware."""
import pytest
import torch
from test_rtdetr import images, reference
from transformers.models.rt_detr.modeling_rt_detr import build_2d_sinusoidal_position_embedding

from vispe.models.detr import load_detr
from vispe.models.detr.realtime import AIFI, aifi_sincos, original_table


def transformers_sincos(h, w, dim, temperature=10000.0):
    """Copy of transformers 5.23 ``build_2d_sinusoidal_position_embedding`` (models/rt_detr/modeling_rt_detr.py)."""
    pos_dim = dim // 4
    omega = 1.0 / temperature ** (torch.arange(pos_dim, dtype=torch.float64) / pos_dim)
    gh, gw = torch.meshgrid(torch.arange(h, dtype=torch.float64), torch.arange(w, dtype=torch.float64), indexing="ij")
    eh, ew = gh.flatten().outer(omega), gw.flatten().outer(omega)
    return torch.cat([eh.sin(), eh.cos(), ew.sin(), ew.cos()], 1).float()


def lyuwenyu_sincos(w, h, dim, temperature=10000.0):
    """Copy of lyuwenyu/RT-DETR ``HybridEncoder.build_2d_sincos_position_embedding`` (rtdetr_pytorch/src/zoo/
    rtdetr/hybrid_encoder.py; D-FINE and DEIM keep it): note its (w, h) argument order."""
    grid_w = torch.arange(int(w), dtype=torch.float32)
    grid_h = torch.arange(int(h), dtype=torch.float32)
    grid_w, grid_h = torch.meshgrid(grid_w, grid_h, indexing="ij")
    pos_dim = dim // 4
    omega = torch.arange(pos_dim, dtype=torch.float32) / pos_dim
    omega = 1.0 / (temperature ** omega)
    out_w = grid_w.flatten()[..., None] @ omega[None]
    out_h = grid_h.flatten()[..., None] @ omega[None]
    return torch.concat([out_w.sin(), out_w.cos(), out_h.sin(), out_h.cos()], dim=1)


@pytest.mark.parametrize("h, w", [(15, 20), (3, 4), (12, 12)])
def test_each_layout_equals_its_reference(h, w):
    ours_t = aifi_sincos(32, layout="transformers")((h, w))[0]  # (h*w, 32)
    ours_o = aifi_sincos(32, layout="original")((h, w))[0]
    torch.testing.assert_close(ours_t, transformers_sincos(h, w, 32), rtol=0, atol=1e-5)
    torch.testing.assert_close(ours_t, build_2d_sinusoidal_position_embedding(h, w, 32).float(), rtol=0, atol=1e-5)
    torch.testing.assert_close(ours_o, lyuwenyu_sincos(w, h, 32), rtol=0, atol=1e-5)
    torch.testing.assert_close(original_table(h, w, 32), ours_o, rtol=0, atol=0)


@pytest.mark.parametrize("h, w", [(15, 20), (3, 4), (7, 5)])
def test_float64_table_is_transformers_table_to_the_bit_and_the_default_is_float32_math(h, w):
    """``float64=True``: transformers' arithmetic (float64, then cast), equal to the last bit; the default
    (float32 math, the original code's and the training configs') differs from it by about one ulp."""
    ours = aifi_sincos(32, float64=True)((h, w))[0]  # (h*w, 32)
    torch.testing.assert_close(ours, transformers_sincos(h, w, 32), rtol=0, atol=0)
    torch.testing.assert_close(ours, build_2d_sinusoidal_position_embedding(h, w, 32).float(), rtol=0, atol=0)
    default = aifi_sincos(32)((h, w))[0]
    assert 0 < (default - ours).abs().max().item() < 3e-7
    mask = torch.zeros(2, h + 2, w + 3, dtype=torch.bool)
    mask[1, h:] = True
    mask[1, :, w:] = True
    padded = aifi_sincos(32, float64=True, mask_aware=True)((h + 2, w + 3), mask)[1].view(h + 2, w + 3, 32)[:h, :w]
    torch.testing.assert_close(padded.reshape(h * w, 32), ours, rtol=0, atol=0)
    with pytest.raises(ValueError, match="float64=True with layout='original'"):
        aifi_sincos(32, layout="original", float64=True)
    with pytest.raises(ValueError, match="float64=1: expected True or False"):
        aifi_sincos(32, float64=1)


def test_loaded_models_use_the_float64_table():
    pe = load_detr(reference()).encoder.aifi[0].pe
    assert pe is not None and "float64=True" in repr(pe)


def test_layouts_differ_on_a_non_square_grid_and_agree_on_a_square_one():
    t, o = aifi_sincos(256, layout="transformers"), aifi_sincos(256, layout="original")
    gap = (t((15, 20)) - o((15, 20))).abs().max().item()
    print(f"\nAIFI sin-cos, transformers' vs original layout at 15x20, dim 256: max abs diff {gap:.3f}")
    assert gap > 1.9  # the "up to 2.0"
    torch.testing.assert_close(t((12, 12)), o((12, 12)), rtol=0, atol=1e-5)
    # transformers' layout: y channels first, token (y, x) row-major
    code = t((3, 5))[0].view(3, 5, 256)
    torch.testing.assert_close(code[2, 4, 0:64], torch.sin(2.0 * 10000.0 ** -(torch.arange(64) / 64.0)), rtol=0, atol=1e-5)
    torch.testing.assert_close(code[2, 4, 128:192], torch.sin(4.0 * 10000.0 ** -(torch.arange(64) / 64.0)), rtol=0, atol=1e-5)


def test_mask_aware_layout_gives_a_padded_image_its_code_alone_and_the_original_refuses():
    pe = aifi_sincos(32, mask_aware=True)
    mask = torch.zeros(2, 6, 8, dtype=torch.bool)
    mask[1, 4:] = True
    mask[1, :, 5:] = True
    padded = pe((6, 8), mask)[1].view(6, 8, 32)[:4, :5]
    torch.testing.assert_close(padded, pe((4, 5))[0].view(4, 5, 32), rtol=0, atol=0)
    with pytest.raises(ValueError, match="mask_aware=True with layout='original'"):
        aifi_sincos(32, layout="original", mask_aware=True)
    with pytest.raises(ValueError, match="layout='diagonal'"):
        aifi_sincos(32, layout="diagonal")


def step(model, x):
    out = model.train()(x)
    loss = out["pred_logits"].sigmoid().mean() + out["pred_boxes"].mean() + out["enc_outputs"]["pred_boxes"].mean() \
        + sum(a["pred_logits"].sigmoid().mean() for a in out["aux_outputs"])
    model.zero_grad()
    loss.backward()
    return out


@pytest.mark.parametrize("name, kw", [("rope_mixed", {}), ("relbias", {"grid": (3, 4)})])
def test_swapping_the_encoding_after_loading_runs_and_trains(name, kw):
    hf = reference(seed=8)
    model = load_detr(hf)
    x = images()
    with torch.no_grad():
        before = model.eval()(x)["pred_logits"]
    model.set_encoding(name, **kw)
    aifi = model.encoder.aifi[0]
    assert aifi.pe is None and all(type(layer.self_attn.pe).__name__ for layer in aifi.layers)
    assert {layer.self_attn.pe.family for layer in aifi.layers} == {"rotary" if name == "rope_mixed" else "bias"}
    with torch.no_grad():
        after = model.eval()(x)["pred_logits"]
    assert (after - before).abs().max() > 1e-3  # the position changed the outputs
    step(model, x)
    grads = {n: p.grad for n, p in aifi.named_parameters() if p.requires_grad}
    assert grads and all(g is not None and torch.isfinite(g).all() for g in grads.values())
    pe_grads = [p.grad for n, p in aifi.named_parameters() if ".pe." in n]
    assert len(pe_grads) > 0 and all(g.abs().sum() > 0 for g in pe_grads)  # the encoding's own parameters learn


@pytest.mark.parametrize("name, kw", [("rtdetr_sincos", {"mask_aware": True}), ("rope_mixed", {})])
def test_aifi_image_alone_equals_it_padded_where_mask_aware(name, kw):
    """Not ``relbias``: its learned table is resized to the grid it is given (vispe.image.relbias), so an image
    alone (4x5) reads a resized table where the padded batch (6x8) reads the table itself."""
    torch.manual_seed(0)
    aifi = AIFI(32, 4, 64, 2, pe=name, pe_kwargs=kw).eval()
    alone = torch.randn(1, 32, 4, 5)
    batch = torch.randn(2, 32, 6, 8)
    batch[1, :, :4, :5] = alone[0]
    mask = torch.zeros(2, 6, 8, dtype=torch.bool)
    mask[1, 4:] = True
    mask[1, :, 5:] = True
    with torch.no_grad():
        got = aifi(batch, mask)[1, :, :4, :5]
        want = aifi(alone)[0]
    torch.testing.assert_close(got, want, rtol=0, atol=1e-5)


def test_original_layout_is_not_mask_aware():
    torch.manual_seed(0)
    aifi = AIFI(32, 4, 64, 1, pe="rtdetr_sincos", pe_kwargs={"layout": "original"}).eval()
    alone = torch.randn(1, 32, 4, 5)
    batch = torch.randn(2, 32, 6, 8)
    batch[1, :, :4, :5] = alone[0]
    mask = torch.zeros(2, 6, 8, dtype=torch.bool)
    mask[1, 4:] = True
    mask[1, :, 5:] = True
    with torch.no_grad():
        gap = (aifi(batch, mask)[1, :, :4, :5] - aifi(alone)[0]).abs().max()
    assert gap > 1e-2


def test_set_encoding_refuses_what_aifi_cannot_use():
    aifi = AIFI(32, 4, 64, 1)
    with pytest.raises(ValueError, match="conditional encoding"):
        aifi.set_encoding("peg")
    with pytest.raises(ValueError, match=r"pe_kwargs \['scale'\]"):
        aifi.set_encoding("rtdetr_sincos", scale=2.0)
    with pytest.raises(ValueError, match="channels"):
        aifi(torch.randn(1, 16, 3, 4))
