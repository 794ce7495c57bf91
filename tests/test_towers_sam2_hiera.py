"""SAM 2's Hiera converted (vispe.models.towers.sam2_hiera): parity with transformers' Sam2HieraDetModel
(tiny config, random weights, every parameter perturbed: its tables start at zero) where it runs, square
and not; at grids that are not multiples of the window (where it fails) against its own blocks with the
code written out here; a fine-tuning step; named encodings; the whole Sam2Model."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from vispe.models.towers.sam2_hiera import tile_window
from vispe.models.vit import convert_vit

ms = pytest.importorskip("transformers.models.sam2.modeling_sam2")

HIERA = dict(hidden_size=16, num_attention_heads=1, image_size=[64, 64], patch_kernel_size=[7, 7],
             patch_stride=[4, 4], patch_padding=[3, 3], query_stride=[2, 2],
             window_positional_embedding_background_size=[3, 3], num_query_pool_stages=2,
             blocks_per_stage=[1, 2, 2, 1], embed_dim_per_stage=[16, 32, 64, 128],
             num_attention_heads_per_stage=[1, 2, 4, 8], window_size_per_stage=[8, 4, 2, 2],
             global_attention_blocks=[4, 5], mlp_ratio=2.0)


def _perturb(model, scale=0.1, seed=0):
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn(p.shape, generator=g) * scale)
    return model.eval()


def hiera(**kw):
    from transformers import Sam2HieraDetConfig

    torch.manual_seed(0)
    return _perturb(ms.Sam2HieraDetModel(Sam2HieraDetConfig(**{**HIERA, **kw})))


def _close(got, want, tol=1e-4):
    torch.testing.assert_close(got.last_hidden_state, want.last_hidden_state, rtol=tol, atol=tol)
    assert len(got.intermediate_hidden_states) == len(want.intermediate_hidden_states) == 4
    for a, b in zip(got.intermediate_hidden_states, want.intermediate_hidden_states):
        torch.testing.assert_close(a, b, rtol=tol, atol=tol)


@pytest.mark.parametrize("size", [(64, 64), (96, 64)])  # its size (windows tiled 2x2) and a non-square one it runs
def test_parity_where_transformers_runs(size):
    hf = hiera()
    m = convert_vit(hf)
    assert type(m).__name__ == "HieraTower" and m.pe_name is None
    x = torch.randn(2, 3, *size)
    with torch.no_grad():
        want, got = hf(x, output_hidden_states=True), m(x, output_hidden_states=True)
        assert type(got) is type(want)
        _close(got, want)
        assert len(got.hidden_states) == len(want.hidden_states) == 7
        for a, b in zip(got.hidden_states, want.hidden_states):
            torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-4)
        assert len(m(x, return_dict=False)) == len(hf(x, return_dict=False))


def _reference_code(hf):
    """Hiera's code at any (h, w), written out: background resized (bicubic, by size), the window table
    repeated from the top-left corner and cropped."""
    def code(hw):
        bg = F.interpolate(hf.pos_embed, size=tuple(hw), mode="bicubic", align_corners=False)
        a, b = hf.pos_embed_window.shape[-2:]
        win = hf.pos_embed_window.repeat(1, 1, -(-hw[0] // a), -(-hw[1] // b))[..., :hw[0], :hw[1]]
        return (bg + win).permute(0, 2, 3, 1)
    return code


@pytest.mark.parametrize("size", [(48, 80), (80, 80)])  # 12x20 and 20x20 patches: not multiples of the window 8
def test_grids_off_the_window_multiples_run_with_the_window_table_repeated_and_cropped(size):
    hf = hiera()
    m = convert_vit(hf)
    x = torch.randn(2, 3, *size)
    with pytest.raises(RuntimeError):
        hf(x)  # transformers repeats the window table h // 8 times
    hf._get_pos_embed = _reference_code(hf)
    with torch.no_grad():
        got, want = m(x), hf(x)
    h, w = size[0] // 16, size[1] // 16
    assert got.last_hidden_state.shape == (2, h, w, 128) and torch.isfinite(got.last_hidden_state).all()
    _close(got, want)


def test_tile_window_repeats_from_the_corner():
    win = torch.arange(6.0).reshape(1, 1, 2, 3)
    got = tile_window(win, (3, 7))[0, 0]
    want = torch.tensor([[0, 1, 2, 0, 1, 2, 0], [3, 4, 5, 3, 4, 5, 3], [0, 1, 2, 0, 1, 2, 0.0]])
    torch.testing.assert_close(got, want)


def test_a_fine_tuning_step_at_another_size_reaches_both_tables():
    m = convert_vit(hiera()).train()
    m(torch.randn(2, 3, 48, 80)).last_hidden_state.square().mean().backward()
    assert m.no_weight_decay() == {"abs_pe.pos_embed", "pos_embed_window"}
    for p in (m.abs_pe.pos_embed, m.pos_embed_window):
        assert p.grad is not None and p.grad.abs().max() > 0


def test_named_encodings():
    hf = hiera()
    x = torch.randn(1, 3, 64, 64)
    with torch.no_grad():
        la = convert_vit(hf, pe="learned_abs")  # Hiera's whole code at the native grid as one table
        assert la.abs_pe is None and la.pos_embed_window is None
        _close(la(x), hf(x))
        sc = convert_vit(hf, pe="sincos2d")
        assert sc.abs_pe is None and (sc(x).last_hidden_state - hf(x).last_hidden_state).abs().max() > 1e-3
        both = convert_vit(hf, pe="sincos2d", keep_abs_pos=True)  # Hiera's code and the sine, each added once
        own = hf._get_pos_embed
        hf._get_pos_embed = lambda hw: own(hw) + both.pe(tuple(hw)).reshape(1, *hw, -1)
        _close(both(x), hf(x))
        hf._get_pos_embed = own
        assert sc(torch.randn(1, 3, 48, 80)).last_hidden_state.shape == (1, 3, 5, 128)
    with pytest.raises(ValueError, match="pe='rope_mixed' is rotary"):
        convert_vit(hf, pe="rope_mixed")
    with pytest.raises(ValueError, match="added twice"):
        convert_vit(hf, pe="learned_abs", keep_abs_pos=True)
    with pytest.raises(ValueError, match="pe_at='every_block'"):
        convert_vit(hf, pe="sincos2d", pe_at="every_block")
    with pytest.raises(ValueError, match="output_attentions=True"):
        convert_vit(hf)(x, output_attentions=True)


def test_the_whole_sam2_model_with_its_hiera_converted():
    from transformers import Sam2Config, Sam2Model

    backbone = dict(HIERA, model_type="sam2_hiera_det_model", num_query_pool_stages=3,
                    window_size_per_stage=[8, 4, 2, 1], global_attention_blocks=[4])
    cfg = Sam2Config(vision_config=dict(backbone_config=backbone, backbone_channel_list=[128, 64, 32, 16],
                                        backbone_feature_sizes=[[16, 16], [8, 8], [4, 4]], fpn_hidden_size=32),
                     prompt_encoder_config=dict(hidden_size=32, image_size=64, patch_size=16, mask_input_channels=4),
                     mask_decoder_config=dict(hidden_size=32, mlp_dim=64, num_attention_heads=2, iou_head_hidden_dim=32))
    torch.manual_seed(0)
    hf = _perturb(Sam2Model(cfg))
    m = convert_vit(hf)
    assert type(m) is Sam2Model and type(m.vision_encoder.backbone).__name__ == "HieraTower"
    assert type(convert_vit(hf.vision_encoder).backbone).__name__ == "HieraTower"
    x = torch.randn(2, 3, 64, 64)
    pts, labels = torch.rand(2, 1, 1, 2) * 64, torch.ones(2, 1, 1, dtype=torch.long)
    with torch.no_grad():
        want, got = hf(pixel_values=x, input_points=pts, input_labels=labels), m(pixel_values=x, input_points=pts,
                                                                                  input_labels=labels)
    for key in ("iou_scores", "pred_masks", "object_score_logits"):
        torch.testing.assert_close(got[key], want[key], rtol=1e-4, atol=1e-4)
