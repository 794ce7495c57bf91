"""SAM's image encoder converted (vispe.models.towers.sam): parity with transformers' SamVisionEncoder
and timm's VisionTransformerSAM (tiny configs, random weights, every parameter perturbed, windowed
blocks whose grid needs padding and global blocks), another encoding swapped in, refusals."""
from __future__ import annotations

import pytest
import torch

from vispe.models.vit import convert_vit

sam_hf = pytest.importorskip("transformers.models.sam.modeling_sam")


def _perturb(model, scale=0.1, seed=0):
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():  # SAM zero-initialises its tables: move every parameter off its init
        for p in model.parameters():
            p.add_(torch.randn(p.shape, generator=g) * scale)
    return model.eval()


def hf_sam(image_size=32, **kw):
    from transformers import SamVisionConfig

    torch.manual_seed(0)
    cfg = SamVisionConfig(hidden_size=32, num_hidden_layers=4, num_attention_heads=2, mlp_dim=48, image_size=image_size,
                          patch_size=4, window_size=3, global_attn_indexes=[1, 3], output_channels=16, **kw)
    return _perturb(sam_hf.SamVisionEncoder(cfg))


def timm_sam(**kw):
    from timm.models.vision_transformer_sam import VisionTransformerSAM

    torch.manual_seed(0)
    args = dict(img_size=(24, 40), patch_size=4, embed_dim=32, depth=4, num_heads=2, mlp_ratio=1.5, use_rel_pos=True,
                window_size=3, global_attn_indexes=(1, 3), neck_chans=16, num_classes=5, qk_norm=True, init_values=0.5)
    return _perturb(VisionTransformerSAM(**{**args, **kw}))


@pytest.mark.parametrize("image_size", [32, 24])  # 8x8 patches (windows of 3 padded to 9) and 6x6 (exact)
def test_transformers_sam_encoder_parity_with_hidden_states_and_tuples(image_size):
    """transformers' SAM takes its configured square size only (its pos_embed is never resized)."""
    hf = hf_sam(image_size)
    m = convert_vit(hf)
    assert type(m).__name__ == "SamVisionEncoderTower"
    assert [b.attn.pe.grid for b in m.blocks] == [(3, 3), (image_size // 4,) * 2, (3, 3), (image_size // 4,) * 2]
    x = torch.randn(2, 3, image_size, image_size)
    with torch.no_grad():
        want, got = hf(x, output_hidden_states=True), m(x, output_hidden_states=True)
        assert type(got) is type(want) and got.image_embeds is None and got.attentions is None
        torch.testing.assert_close(got.last_hidden_state, want.last_hidden_state, rtol=1e-4, atol=1e-4)
        assert len(got.hidden_states) == len(want.hidden_states) == 5
        for a, b in zip(got.hidden_states, want.hidden_states):
            torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-4)
        tup = m(x, return_dict=False)
        assert isinstance(tup, tuple) and len(tup) == len(hf(x, return_dict=False)) == 1
    with pytest.raises(ValueError, match="output_attentions=True"):
        m(x, output_attentions=True)


@pytest.mark.parametrize("size", [(24, 40), (40, 24), (32, 32)])
def test_timm_sam_parity_at_its_size_and_others(size):
    """At its non-square size, the transposed one and a square one (abs table resampled, global relative
    tables resized), with windows of 3 on grids that need padding, qk-norm and layer scale."""
    t = timm_sam()
    m = convert_vit(t)
    x = torch.randn(2, 3, *size)
    with torch.no_grad():
        torch.testing.assert_close(m(x), t(x), rtol=1e-4, atol=1e-4)
        torch.testing.assert_close(m.forward_features(x), t.forward_features(x), rtol=1e-4, atol=1e-4)
        final, inter = m.forward_intermediates(x, indices=[0, 2])
        final_t, inter_t = t.forward_intermediates(x, indices=[0, 2])
        torch.testing.assert_close(final, final_t, rtol=1e-4, atol=1e-4)
        for a, b in zip(inter, inter_t):
            torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-4)


def test_every_converted_table_matters():
    """The relative tables of windowed and global blocks and the absolute table reach the output."""
    t = timm_sam()
    m = convert_vit(t)
    x = torch.randn(1, 3, 24, 40)
    with torch.no_grad():
        ref = m.forward_features(x)
        for p in [m.blocks[0].attn.pe.rel_pos_w, m.blocks[1].attn.pe.rel_pos_h, m.abs_pe.pos_embed]:
            p.add_(torch.randn_like(p))
            assert (m.forward_features(x) - ref).abs().max() > 1e-3
            ref = m.forward_features(x)


def _alone_and_in_batch(m, img, canvas=(32, 36)):
    big = torch.zeros(2, 3, *canvas)
    big[0, :, :img.shape[1], :img.shape[2]] = img
    big[1] = torch.randn(3, *canvas)
    mask = torch.zeros(2, *canvas, dtype=torch.bool)
    mask[0, img.shape[1]:] = True
    mask[0, :, img.shape[2]:] = True
    out = m(big, mask).last_hidden_state[:1]
    h, w = img.shape[1] // 4, img.shape[2] // 4
    return m(img[None]).last_hidden_state, out[..., :h, :w]


def test_sam_with_rope_axial_trains_one_step_and_is_batch_invariant_with_masked_window_padding():
    m = convert_vit(hf_sam(), pe="rope_axial")
    assert m.abs_pe is None and m.pe_name == "rope_axial"
    assert all(b.attn.pe.registry_name == "rope_axial" for b in m.blocks)
    m.train()
    opt = torch.optim.SGD(m.parameters(), lr=0.1)
    x = torch.randn(2, 3, 24, 28)  # not the configured size: the converted encoder takes any multiple of 4
    before = [p.detach().clone() for p in m.parameters()]
    loss = m(x).last_hidden_state.square().mean()
    loss.backward()
    assert all(p.grad is not None and torch.isfinite(p.grad).all() for p in m.parameters())
    opt.step()
    assert all((p - b).abs().max() > 0 for p, b in zip(m.parameters(), before))
    with torch.no_grad():
        assert m(x).last_hidden_state.square().mean() < loss
    m.eval()
    img = torch.randn(3, 24, 20)  # 6x5 patches: windows of 3 fill a 6th column
    with torch.no_grad():
        alone, batched = _alone_and_in_batch(m, img)  # SAM's rule: the zero tokens filling a window are keys
        assert (alone - batched).abs().max() > 1e-3
        m.window_padding = "mask"
        alone, batched = _alone_and_in_batch(m, img)
        torch.testing.assert_close(batched, alone, rtol=1e-4, atol=1e-4)


def test_timm_sam_with_rope_axial_pools_over_the_valid_cells():
    m = convert_vit(timm_sam(), pe="rope_axial")
    m.window_padding = "mask"
    img = torch.randn(1, 3, 24, 20)
    big = torch.zeros(1, 3, 32, 36)
    big[..., :24, :20] = img
    mask = torch.ones(1, 32, 36, dtype=torch.bool)
    mask[:, :24, :20] = False
    with torch.no_grad():
        torch.testing.assert_close(m(big, mask), m(img), rtol=1e-4, atol=1e-4)


def test_named_encodings_and_the_absolute_table():
    t = timm_sam()
    m = convert_vit(t, pe="learned_abs")  # takes the table over; no relative position
    assert m.abs_pe is None and all(b.attn.pe is None for b in m.blocks)
    torch.testing.assert_close(m.pe.pos_embed.detach(), t.pos_embed.detach().reshape(1, -1, 32))
    m = convert_vit(t, pe="rope_axial", keep_abs_pos=True)
    torch.testing.assert_close(m.abs_pe.pos_embed.detach(), t.pos_embed.detach().reshape(1, -1, 32))
    x = torch.randn(1, 3, 24, 40)
    with torch.no_grad():  # an additive pe next to the kept table: each added once
        both = convert_vit(t, pe="sincos2d", keep_abs_pos=True)._embed(x, None, "x")[0]
        table = convert_vit(t, pe="none", keep_abs_pos=True)._embed(x, None, "x")[0]
        code = convert_vit(t, pe="sincos2d").pe((6, 10))  # (1, 60, 32)
        torch.testing.assert_close(both - table, code.view(1, 6, 10, 32), rtol=1e-5, atol=1e-5)
    no_rel = convert_vit(timm_sam(use_rel_pos=False))
    assert no_rel.pe_name == "none"
    with torch.no_grad():
        torch.testing.assert_close(no_rel.forward_features(x), timm_sam(use_rel_pos=False).forward_features(x))


def test_what_does_not_convert_is_refused_by_name():
    with pytest.raises(ValueError, match="use_rope=True"):
        convert_vit(timm_sam(use_rel_pos=False, use_rope=True))
    with pytest.raises(ValueError, match="pe_at='every_block'"):
        convert_vit(hf_sam(), pe="sine", pe_at="every_block")
    with pytest.raises(ValueError, match="keep_abs_pos=True"):
        convert_vit(hf_sam(use_abs_pos=False), keep_abs_pos=True)
    with pytest.raises(ValueError, match="added twice"):
        convert_vit(hf_sam(), pe="learned_abs", keep_abs_pos=True)
    m = convert_vit(hf_sam())
    with pytest.raises(ValueError, match="multiples of the patch size"):
        m(torch.randn(1, 3, 30, 32))
    m.window_padding = "zeros"
    with pytest.raises(ValueError, match="window_padding='zeros'"):
        m(torch.randn(1, 3, 32, 32))
