"""SAM 3's ViT converted (vispe.models.towers.sam3): parity with transformers' Sam3ViTModel (tiny configs,
random weights, every parameter perturbed) at a square and a non-square config size, the converted model
at other sizes against the original with its position buffer recomputed for that grid, the table's two
rules, a fine-tuning step, named encodings, the padding mask, refusals."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from vispe.models.towers.sam3 import convert_sam3_vit, tile_table
from vispe.models.vit import convert_vit

ms = pytest.importorskip("transformers.models.sam3.modeling_sam3")


def _perturb(model, scale=0.1, seed=0):
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn(p.shape, generator=g) * scale)
    return model.eval()


def sam3_vit(image_size=56):
    """14x14 patches at 56 px (windows of 3 padded to 15), a 6x6 pre-training table tiled."""
    from transformers import Sam3ViTConfig

    torch.manual_seed(0)
    cfg = Sam3ViTConfig(hidden_size=32, intermediate_size=48, num_hidden_layers=4, num_attention_heads=2,
                        image_size=image_size, patch_size=4, window_size=3, global_attn_indexes=[1, 3],
                        pretrain_image_size=24)
    return _perturb(ms.Sam3ViTModel(cfg))


def _close(got, want, tol=1e-4):
    torch.testing.assert_close(got.last_hidden_state, want.last_hidden_state, rtol=tol, atol=tol)


@pytest.mark.parametrize("mode", ["interpolate", "extend", "transformers"])
def test_parity_at_the_native_size_in_every_rope_positions_mode(mode):
    hf = sam3_vit()
    m = convert_vit(hf) if mode == "interpolate" else convert_sam3_vit(hf, rope_positions=mode)
    assert type(m).__name__ == "Sam3ViTTower" and m.table == "tile"
    assert [b.attn.pe.grid for b in m.blocks] == [(3, 3), (14, 14), (3, 3), (14, 14)]
    x = torch.randn(2, 3, 56, 56)
    with torch.no_grad():
        want, got = hf(x, output_hidden_states=True), m(x, output_hidden_states=True)
        assert type(got) is type(want)
        _close(got, want)
        assert len(got.hidden_states) == len(want.hidden_states) == 5
        for a, b in zip(got.hidden_states, want.hidden_states):
            torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-4)
        assert len(m(x, return_dict=False)) == len(hf(x, return_dict=False))


def test_a_non_square_config_is_reproduced_with_transformers_layout_only():
    """transformers runs a 48x72 config (12x18 patches), with its [w, h] buffer laid over the grid as
    (w, h): rope_positions="transformers" reproduces it; vispe's (y, x) positions differ there."""
    hf = sam3_vit([48, 72])
    x = torch.randn(2, 3, 48, 72)
    with torch.no_grad():
        want = hf(x)
        _close(convert_sam3_vit(hf, rope_positions="transformers")(x), want)
        assert (convert_vit(hf)(x).last_hidden_state - want.last_hidden_state).abs().max() > 1e-2


def _hf_with_positions(hf, grid, spacing):
    """The original with its global layers' position buffer recomputed for ``grid`` (h, w), in raster
    order, [x, y] as transformers stores it: index * ws / (h, w) ("interpolate") or * ws / h0 ("extend")."""
    h, w = grid
    ws = hf.config.window_size
    y, x = torch.meshgrid(torch.arange(h), torch.arange(w), indexing="ij")
    sy, sx = (ws / h, ws / w) if spacing == "interpolate" else (ws / 14, ws / 14)
    for layer in hf.layers:
        if not layer.window_size:
            layer.position_ids = torch.stack([x.flatten() * sx, y.flatten() * sy], dim=-1)
    return hf


@pytest.mark.parametrize("size", [(84, 84), (48, 72), (72, 40)])
@pytest.mark.parametrize("mode", ["interpolate", "extend"])
def test_other_sizes_equal_the_original_with_its_buffer_recomputed(size, mode):
    hf = sam3_vit()
    m = convert_sam3_vit(hf, rope_positions=mode)
    x = torch.randn(2, 3, *size)
    with pytest.raises(RuntimeError):
        hf(x)  # transformers' SAM 3 ViT runs at its config size only
    grid = (size[0] // 4, size[1] // 4)
    with torch.no_grad():
        got, want = m(x), _hf_with_positions(hf, grid, mode)(x)
    assert got.last_hidden_state.shape == (2, grid[0] * grid[1], 32)
    assert torch.isfinite(got.last_hidden_state).all()
    _close(got, want)


def test_the_table_tiled_or_resampled():
    hf = sam3_vit()
    table = hf.embeddings.position_embeddings.detach()  # (1, 36, 32) over 6x6
    m = convert_vit(hf)
    zeros = torch.zeros(1, 9 * 20, 32)
    got = m.input_code(zeros, (9, 20), None)[0]
    want = table.reshape(6, 6, 32).repeat(2, 4, 1)[:9, :20].reshape(1, -1, 32)
    torch.testing.assert_close(got, want)
    torch.testing.assert_close(tile_table(table, (6, 6), (9, 20)), want)
    m.table = "interpolate"
    grown = F.interpolate(table.reshape(1, 6, 6, 32).permute(0, 3, 1, 2), size=(9, 20), mode="bicubic",
                          align_corners=False)  # growing: no antialias (learned_abs's rule)
    torch.testing.assert_close(m.input_code(zeros, (9, 20), None)[0], grown.flatten(2).transpose(1, 2))
    m.table = "stretch"
    with pytest.raises(ValueError, match="table='stretch'"):
        m(torch.randn(1, 3, 56, 56))


@pytest.mark.parametrize("pe", [None, "rope_mixed"])
def test_a_fine_tuning_step_at_another_size_reaches_the_encoding(pe):
    m = convert_vit(sam3_vit(), pe=pe, keep_abs_pos=True if pe else None).train()
    x = torch.randn(2, 3, 40, 60)
    m(x).last_hidden_state.square().mean().backward()
    names = m.no_weight_decay()
    assert "abs_pe.pos_embed" in names and (pe is None or any(".attn.pe." in n for n in names))
    params = [p for n, p in m.named_parameters() if n in names]
    assert all(p.grad is not None and p.grad.abs().max() > 0 for p in params)


def test_named_encodings_and_the_table():
    hf = sam3_vit()
    m = convert_vit(hf, pe="rope_mixed")
    assert m.abs_pe is None and [b.attn.pe.grid for b in m.blocks] == [(3, 3), (14, 14), (3, 3), (14, 14)]
    m = convert_vit(hf, pe="learned_abs")  # takes the table over, tiled to the native grid as the original reads it
    x = torch.randn(1, 3, 56, 56)
    assert m.abs_pe is None and all(b.attn.pe is None for b in m.blocks)
    torch.testing.assert_close(m.pe.pos_embed.detach(), tile_table(hf.embeddings.position_embeddings.detach(),
                                                                   (6, 6), (14, 14)))
    yx = convert_vit(hf, pe_kwargs={"axis_order": "yx"})  # SAM 3's RoPE with y first: another model
    with torch.no_grad():
        assert (yx(x).last_hidden_state - hf(x).last_hidden_state).abs().max() > 1e-3


def test_an_image_alone_equals_it_padded_in_a_batch_with_masked_window_padding():
    m = convert_vit(sam3_vit())
    m.window_padding = "mask"
    img = torch.randn(3, 44, 36)  # 11x9 patches
    big = torch.randn(2, 3, 56, 60)
    big[0, :, :44, :36] = img
    mask = torch.zeros(2, 56, 60, dtype=torch.bool)
    mask[0, 44:] = True
    mask[0, :, 36:] = True
    with torch.no_grad():
        alone = m(img[None]).last_hidden_state.view(1, 11, 9, 32)
        padded = m(big, mask).last_hidden_state.view(2, 14, 15, 32)[:1, :11, :9]
    torch.testing.assert_close(padded, alone, rtol=1e-4, atol=1e-4)


def test_what_does_not_apply_is_refused_by_name():
    hf = sam3_vit()
    with pytest.raises(ValueError, match="rope_positions='pi'"):
        convert_sam3_vit(hf, rope_positions="pi")
    with pytest.raises(ValueError, match="rope_positions='extend' with pe='rope_mixed'"):
        convert_sam3_vit(hf, pe="rope_mixed", rope_positions="extend")
    with pytest.raises(ValueError, match="added twice"):
        convert_vit(hf, pe="learned_abs", keep_abs_pos=True)
    m = convert_sam3_vit(hf, rope_positions="transformers")
    with pytest.raises(ValueError, match="swap_global_axes=True"):
        m(torch.randn(1, 3, 56, 56), torch.zeros(1, 56, 56, dtype=torch.bool))
    hf.layers[0].rotary_emb.inv_freq.mul_(2)
    with pytest.raises(ValueError, match="rotary_emb.inv_freq"):
        convert_vit(hf)


def sam3_model():
    from transformers import Sam3Config, Sam3Model

    torch.manual_seed(0)
    vit = dict(model_type="sam3_vit_model", hidden_size=32, intermediate_size=48, num_hidden_layers=2,
               num_attention_heads=2, image_size=56, patch_size=4, window_size=7, global_attn_indexes=[1],
               pretrain_image_size=28)
    small = dict(hidden_size=32, num_layers=1, num_attention_heads=2, intermediate_size=64)
    cfg = Sam3Config(vision_config=dict(backbone_config=vit, fpn_hidden_size=32,
                                        backbone_feature_sizes=[[56, 56], [28, 28], [14, 14]]),
                     text_config=dict(vocab_size=100, hidden_size=32, intermediate_size=64, projection_dim=32,
                                      num_hidden_layers=1, num_attention_heads=2, max_position_embeddings=8,
                                      bos_token_id=98, eos_token_id=99),
                     geometry_encoder_config=small, detr_encoder_config=small,
                     detr_decoder_config={**small, "num_queries": 5}, mask_decoder_config=dict(hidden_size=32,
                                                                                               num_attention_heads=2))
    return _perturb(Sam3Model(cfg))


def test_the_whole_sam3_model_with_its_vit_converted():
    """Sam3Model's outputs where the ViT is the only change: equal at the native size, and the converted
    model runs at sizes the original refuses (square and not)."""
    hf = sam3_model()
    m = convert_vit(hf)
    assert type(m) is type(hf) and type(m.vision_encoder.backbone).__name__ == "Sam3ViTTower"
    assert type(convert_vit(hf.vision_encoder).backbone).__name__ == "Sam3ViTTower"
    ids = torch.randint(0, 98, (2, 8), generator=torch.Generator().manual_seed(0))
    x = torch.randn(2, 3, 56, 56)
    with torch.no_grad():
        want, got = hf(pixel_values=x, input_ids=ids), m(pixel_values=x, input_ids=ids)
        for key in ("pred_masks", "pred_boxes", "pred_logits", "presence_logits", "semantic_seg"):
            torch.testing.assert_close(got[key], want[key], rtol=1e-4, atol=1e-4)
        for size in [(84, 84), (56, 84)]:
            with pytest.raises(RuntimeError):
                hf(pixel_values=torch.randn(2, 3, *size), input_ids=ids)
            out = m(pixel_values=torch.randn(2, 3, *size), input_ids=ids)
            assert out.pred_masks.shape == (2, 5, *size) and out.semantic_seg.shape == (2, 1, *size)
            assert all(torch.isfinite(out[k]).all() for k in ("pred_masks", "pred_boxes", "pred_logits"))
