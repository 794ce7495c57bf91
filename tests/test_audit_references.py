"""vispe.audit on timm and transformers models built from configs with random weights (small): the
defects known in them found, and no false defect where there is none; the command line."""
from __future__ import annotations

import pytest
import timm
import torch
import transformers as T

from vispe.__main__ import main
from vispe.audit import audit


def kinds(report) -> list[str]:
    return [d.kind for d in report.defects]


def small(cls, config, **kw):
    torch.manual_seed(0)
    return cls(config(**kw)).eval()


def test_timm_vit_dynamic_img_size_no_defect_and_strict_refuses():
    m = timm.create_model("vit_tiny_patch16_224", img_size=64, patch_size=8, depth=2, dynamic_img_size=True,
                          num_classes=0)
    rep = audit(m)
    assert rep.defects == [] and rep.family == "additive", rep.text()
    assert any("resampled (the new code" in d for d in rep.entries[0].details), rep.text()
    strict = timm.create_model("vit_tiny_patch16_224", img_size=64, patch_size=8, depth=1, num_classes=0)
    rep = audit(strict)
    assert kinds(rep) == ["sizes"] and "convert_vit" in rep.defects[0].fix, rep.text()


def test_timm_eva_rope_no_defect_named():
    m = timm.create_model("vit_medium_patch16_rope_reg1_gap_256", img_size=64, patch_size=8, depth=2,
                          dynamic_img_size=True, num_classes=0)
    rep = audit(m)
    assert rep.defects == [] and rep.family == "rotary", rep.text()
    details = "\n".join(rep.entries[0].details)
    assert "pair layout: interleaved" in details and "equals vispe rope_axial with layout=interleaved" in details


def test_dinov3_no_defect_named_with_normalised_coordinates():
    m = small(T.DINOv3ViTModel, T.DINOv3ViTConfig, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
              num_attention_heads=2, image_size=56, patch_size=7, num_register_tokens=2)
    rep = audit(m)
    assert rep.defects == [] and rep.family == "rotary", rep.text()
    details = "\n".join(rep.entries[0].details)
    assert "normalised to the grid" in details
    assert ("equals vispe rope_axial with layout=half, axis_order=yx, base=100, coords=centered, scale=6.283, "
            "normalize_coords=separate") in details


@pytest.mark.slow
def test_rf_detr_windows_mix_rows_on_a_non_square_grid():
    m = small(T.RfDetrDinov2Backbone, T.RfDetrDinov2Config, hidden_size=32, num_hidden_layers=2,
              num_attention_heads=2, image_size=56, patch_size=7, num_windows=2, out_indices=[2])
    rep = audit(m, sizes=[(56, 56), (56, 112)])
    assert kinds(rep) == ["windows"], rep.text()
    # transformers 5.23 views the (8, 16) grid as (2, 8, 2, 4): window 0 takes rows 0-1, columns 0-3 and 8-11
    assert "[(0, 0), (0, 1), (0, 2), (0, 3), (0, 8), (0, 9), (0, 10), (0, 11)]" in rep.defects[0].evidence
    assert "4 windows at 8x8" not in rep.text()


def test_sam3_vit_and_eomt_refuse_other_sizes():
    sam = small(T.Sam3ViTModel, T.Sam3ViTConfig, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                num_attention_heads=2, image_size=56, patch_size=7, window_size=4, global_attn_indexes=[1],
                pretrain_image_size=28)
    rep = audit(sam)
    assert kinds(rep) == ["sizes"] and "refuses 4 of 4 other sizes" in rep.defects[0].text, rep.text()
    assert "windowed" in rep.families and "rotary" in rep.families
    eomt = small(T.EomtForUniversalSegmentation, T.EomtConfig, hidden_size=32, intermediate_size=64,
                 num_hidden_layers=2, num_attention_heads=2, image_size=56, patch_size=7, num_blocks=1, num_queries=5,
                 num_labels=3, num_register_tokens=1)
    rep = audit(eomt)
    assert kinds(rep) == ["sizes"] and "refuses 4 of 4 other sizes" in rep.defects[0].text, rep.text()
    assert rep.family == "additive"


@pytest.mark.slow
def test_mask2former_sine_in_bf16_under_autocast():
    sw = T.SwinConfig(image_size=64, patch_size=4, embed_dim=16, depths=[1, 1, 1, 1], num_heads=[1, 1, 2, 2],
                      window_size=4, out_features=["stage1", "stage2", "stage3", "stage4"])
    m = small(T.Mask2FormerModel, T.Mask2FormerConfig, backbone_config=sw, feature_size=32, mask_feature_size=32,
              hidden_dim=32, encoder_feedforward_dim=64, dim_feedforward=64, encoder_layers=1, decoder_layers=1,
              num_queries=5, num_labels=3, num_attention_heads=2, use_pretrained_backbone=False)
    rep = audit(m, sizes=[(64, 64)], native=(64, 64), patch=(4, 4))
    bad = [d for d in rep.defects if d.kind == "dtype"]
    assert {d.text.split(" ")[0] for d in bad} == {"pixel_level_module.decoder.position_embedding",
                                                   "transformer_module.position_embedder"}, rep.text()
    assert all("Mask2FormerSinePositionEmbedding" in d.text for d in bad)
    # Swin's relative bias table is read from a float32 parameter: no finding
    assert not any("relative_position_bias" in d.text for d in rep.defects)


DINO = ["DINOv3ViTModel", "hidden_size=32", "intermediate_size=64", "num_hidden_layers=2", "num_attention_heads=2",
        "image_size=56", "patch_size=7"]


def test_cli_exit_codes(capsys):
    assert main(["audit", *DINO]) == 0
    assert "DINOv3ViTModel: position rotary" in capsys.readouterr().out
    assert main(["audit", "EomtForUniversalSegmentation", *DINO[1:], "num_blocks=1", "num_queries=5",
                 "num_labels=3", "--size", "56x56", "--size", "56x112", "--markdown"]) == 1
    out = capsys.readouterr().out
    assert out.startswith("**EomtForUniversalSegmentation: position additive") and "- [sizes] runs at 56x56 px" in out
    assert main(["audit", "no_such_model"]) == 2
    assert "SPEC='no_such_model'" in capsys.readouterr().out
    assert main(["audit", "_audit_models:Tiny", "mode='rope_wrong_layout'", "--size", "32x32"]) == 1
    assert main(["audit", *DINO, "image_size"]) == 2
