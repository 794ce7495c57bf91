"""SigLIP2's NaFlex vision tower converted (vispe.models.towers.siglip2): parity with transformers'
Siglip2VisionModel on packed batches of two aspect ratios with padding (every slot, padded ones
included), another encoding swapped in (batch-invariant where mask-aware), refusals."""
from __future__ import annotations

import pytest
import torch

from vispe.models.vit import convert_vit

siglip2 = pytest.importorskip("transformers.models.siglip2.modeling_siglip2")


def hf_siglip2(**kw):
    from transformers import Siglip2VisionConfig

    torch.manual_seed(0)
    cfg = Siglip2VisionConfig(hidden_size=32, intermediate_size=48, num_hidden_layers=2, num_attention_heads=2,
                              num_channels=3, num_patches=16, patch_size=4, **kw)
    m = siglip2.Siglip2VisionModel(cfg)
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for p in m.parameters():  # every parameter off its initial value
            p.add_(torch.randn(p.shape, generator=g) * 0.1)
    return m.eval()


def packed(shapes, L, seed=0):
    """SigLIP2's processor layout: image b's h*w patches first, zeros after, mask 1 on them."""
    g = torch.Generator().manual_seed(seed)
    shapes = torch.tensor(shapes)
    mask = torch.zeros(len(shapes), L, dtype=torch.long)
    for b, (h, w) in enumerate(shapes.tolist()):
        mask[b, :h * w] = 1
    return torch.randn(len(shapes), L, 48, generator=g) * mask[..., None], mask, shapes


@pytest.mark.parametrize("shapes, L", [([[3, 6], [5, 2]], 24), ([[4, 4], [2, 7]], 20)])
def test_parity_on_a_packed_batch_of_two_aspect_ratios_every_slot(shapes, L):
    """The 4x4 table grown and shrunk to non-square grids of both orientations; padded slots included."""
    hf = hf_siglip2()
    m = convert_vit(hf)
    assert type(m).__name__ == "Siglip2VisionTower" and m.pe_name == "learned_abs" and m.pe.pad_value == "first"
    pv, am, ss = packed(shapes, L)
    with torch.no_grad():
        want, got = hf(pv, am, ss, output_hidden_states=True), m(pv, am, ss, output_hidden_states=True)
        assert type(got) is type(want)
        torch.testing.assert_close(got.last_hidden_state, want.last_hidden_state, rtol=1e-4, atol=1e-4)
        torch.testing.assert_close(got.pooler_output, want.pooler_output, rtol=1e-4, atol=1e-4)
        assert len(got.hidden_states) == len(want.hidden_states) == 3
        for a, b in zip(got.hidden_states, want.hidden_states):
            torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-4)
        tup, tup_hf = m(pv, am, ss, return_dict=False), hf(pv, am, ss, return_dict=False)
        assert isinstance(tup, tuple) and len(tup) == len(tup_hf) == 2
        pad = ~am.bool()  # padded slots hold outputs of their own (the first vector, attending to the image)
        assert pad.any() and (got.last_hidden_state[pad] - got.last_hidden_state[pad][:1]).abs().max() > 1e-3


def test_no_head_and_the_table_matters():
    hf = hf_siglip2(vision_use_head=False)
    m = convert_vit(hf)
    pv, am, ss = packed([[3, 5], [2, 2]], 16)
    with torch.no_grad():
        out = m(pv, am, ss)
        assert out.pooler_output is None
        torch.testing.assert_close(out.last_hidden_state, hf(pv, am, ss).last_hidden_state, rtol=1e-4, atol=1e-4)
        m.pe.pos_embed.add_(torch.randn_like(m.pe.pos_embed))
        assert (m(pv, am, ss).last_hidden_state - out.last_hidden_state).abs().max() > 1e-3


@pytest.mark.parametrize("pe, kw", [("rope_axial", None), ("sincos2d", dict(mask_aware=True))])
def test_another_encoding_gives_each_packed_image_what_it_gives_alone(pe, kw):
    """A rotary encoding runs on the canvas, an additive one in the packed order; both mask-aware."""
    m = convert_vit(hf_siglip2(), pe=pe, pe_kwargs=kw)
    assert m.pe_name == pe
    pv, am, ss = packed([[3, 6], [5, 2]], 24)
    with torch.no_grad():
        out = m(pv, am, ss)
        for b, (h, w) in enumerate(ss.tolist()):
            alone = m(pv[b:b + 1, :h * w], am[b:b + 1, :h * w], ss[b:b + 1])
            torch.testing.assert_close(out.last_hidden_state[b, :h * w], alone.last_hidden_state[0], rtol=1e-4, atol=1e-4)
            torch.testing.assert_close(out.pooler_output[b], alone.pooler_output[0], rtol=1e-4, atol=1e-4)
    m.train()
    loss = m(pv, am, ss).pooler_output.square().mean()
    loss.backward()
    assert all(p.grad is not None and torch.isfinite(p.grad).all() for p in m.parameters() if p.requires_grad)


def test_inputs_that_do_not_convert_are_refused_by_name():
    m = convert_vit(hf_siglip2())
    pv, am, ss = packed([[3, 6], [5, 2]], 24)
    bad = am.clone()
    bad[0, 0] = 0  # a padded slot before the image's patches: not SigLIP2's layout
    with pytest.raises(ValueError, match="pixel_attention_mask"):
        m(pv, bad, ss)
    with pytest.raises(ValueError, match=r"spatial_shapes\[1\]"):
        m(pv, am, torch.tensor([[3, 6], [5, 5]]))
    with pytest.raises(ValueError, match="output_attentions=True"):
        m(pv, am, ss, output_attentions=True)
    with pytest.raises(ValueError, match="keep_abs_pos"):
        convert_vit(hf_siglip2(), pe="rope_axial", keep_abs_pos=True)


# --- Idefics3 (SigLIP with NaViT's bucketed fractional positions) -------------------------------------------
def hf_idefics3():
    from transformers import Idefics3VisionConfig
    from transformers.models.idefics3.modeling_idefics3 import Idefics3VisionTransformer

    torch.manual_seed(0)
    cfg = Idefics3VisionConfig(hidden_size=32, intermediate_size=48, num_hidden_layers=2, num_attention_heads=2,
                               image_size=20, patch_size=4)
    m = Idefics3VisionTransformer(cfg)
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for p in m.parameters():
            p.add_(torch.randn(p.shape, generator=g) * 0.1)
    return m.eval()


def _idefics3_batch():
    """Two aspect ratios padded into one 7x9-patch batch (Idefics3's processor pads bottom/right)."""
    pm = torch.zeros(2, 7, 9, dtype=torch.bool)
    pm[0, :7, :3] = True
    pm[1, :2, :9] = True
    x = torch.randn(2, 3, 28, 36, generator=torch.Generator().manual_seed(1))
    return x * pm.repeat_interleave(4, 1).repeat_interleave(4, 2)[:, None], pm


def test_idefics3_parity_on_a_padded_batch_and_without_a_mask():
    hf = hf_idefics3()
    m = convert_vit(hf)
    assert type(m).__name__ == "Idefics3VisionTower" and m.pe.interpolation == "bucket"
    x, pm = _idefics3_batch()
    with torch.no_grad():
        for args in ((x, pm), (torch.randn(2, 3, 24, 16),)):  # a padded batch; a 6x4 grid with no mask
            want, got = hf(*args, output_hidden_states=True), m(*args, output_hidden_states=True)
            assert type(got) is type(want) and len(got.hidden_states) == len(want.hidden_states) == 3
            torch.testing.assert_close(got.last_hidden_state, want.last_hidden_state, rtol=1e-4, atol=1e-4)
            for a, b in zip(got.hidden_states, want.hidden_states):
                torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-4)
    bad = pm.clone()
    bad[0, 0, 0] = False  # not a top-left rectangle
    with pytest.raises(ValueError, match=r"patch_attention_mask\[0\]"):
        m(x, bad)


def test_idefics3_with_rope_axial_gives_each_padded_image_what_it_gives_alone():
    m = convert_vit(hf_idefics3(), pe="rope_axial")
    x, pm = _idefics3_batch()
    with torch.no_grad():
        out = m(x, pm).last_hidden_state.view(2, 7, 9, -1)
        for b, (h, w) in enumerate([(7, 3), (2, 9)]):
            alone = m(x[b:b + 1, :, :4 * h, :4 * w]).last_hidden_state.view(h, w, -1)
            torch.testing.assert_close(out[b, :h, :w], alone, rtol=1e-4, atol=1e-4)
