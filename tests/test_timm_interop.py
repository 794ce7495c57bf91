"""More of timm: the Eva family and DeiT's distilled ViT through convert_vit / create_vit, timm's
pretrained weights from a file (a fake one made here: no download), NaFlexVit refused, and vispe's
presets registered as timm models (create_model, features_only, forward_intermediates)."""
import pytest
import timm
import torch

import vispe.models  # noqa: F401  (registers vispe_* with timm)
from vispe.models.eva import VispeEva
from vispe.models.vit import PRESETS, VispeViT, convert_vit, create_vit

TINY = dict(img_size=32, patch_size=8, embed_dim=32, depth=2, num_heads=2, num_classes=3)
# timm's own RoPE ViTs (rope-vit axial / mixed, + absolute table), EVA-02 (reference grid), EVA (table)
EVA_NATIVE = {
    "vit_small_patch16_rope_224": ("rope_axial", dict(axis_order="xy", layout="interleaved", base=100.0)),
    "vit_small_patch16_rope_mixed_224": ("rope_mixed", dict(layout="interleaved")),
    "vit_small_patch16_rope_ape_224": ("rope_axial", dict(axis_order="xy")),
    "eva02_tiny_patch14_224": ("rope_axial", dict(ref_grid=(4, 4), base=10000.0)),
    "eva_giant_patch14_224": ("learned_abs", {}),
}


def timm_eva(name, **kw):
    torch.manual_seed(0)
    extra = dict(ref_feat_shape=(4, 4)) if name.startswith("eva02") else {}
    m = timm.create_model(name, dynamic_img_size=True, **{**TINY, **extra, **kw}).eval()
    with torch.no_grad():  # move every weight off its init (zero biases, identity layer scales...)
        for p in m.parameters():
            p.add_(torch.randn_like(p) * 0.2)
    return m


@pytest.mark.parametrize("name", sorted(EVA_NATIVE))
def test_eva_with_its_own_encoding_gives_timm_logits_at_any_size(name):
    ref = timm_eva(name)
    x, x2 = torch.randn(2, 3, 32, 32), torch.randn(2, 3, 24, 40)  # the built grid, and 3 x 5 patches
    with torch.no_grad():
        want, want2 = ref(x), ref(x2)
        sd = {k: v.clone() for k, v in ref.state_dict().items()}
        m = convert_vit(ref)
        assert isinstance(m, VispeEva) and m.rope is None
        pe, kw = EVA_NATIVE[name]
        assert m.pe_name == pe and kw.items() <= m.pe_kwargs.items()
        torch.testing.assert_close(m(x), want, atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(m(x2), want2, atol=1e-5, rtol=1e-5)
        fresh = convert_vit(timm_eva(name))  # timm's checkpoint loads as is (rope.freqs read per layer)
        with torch.no_grad():
            for p in fresh.parameters():
                p.zero_()
        fresh.load_state_dict(sd)
        torch.testing.assert_close(fresh(x2), want2, atol=1e-5, rtol=1e-5)
    moved = {"rope.freqs"} if "mixed" in name else set()
    assert set(sd) - set(m.state_dict()) == moved  # every other timm key kept


@pytest.mark.parametrize("pe", ["sine", "relbias", "peg", "rope_axial", "learned_abs", "none"])
def test_eva_takes_any_encoding_and_a_padding_mask(pe):
    m = convert_vit(timm_eva("vit_small_patch16_rope_ape_224", global_pool="avg", class_token=True), pe=pe)
    assert m.rope is None
    # a named encoding replaces all of the model's own; naming its own (rope_axial) keeps the checkpoint's
    assert (m.pos_embed is not None) == (pe == "rope_axial")
    x = torch.randn(1, 3, 24, 40)
    padded = torch.cat([x, torch.randn(1, 3, 24, 8)], dim=-1)  # one more column of patches
    mask = torch.zeros(1, 24, 48, dtype=torch.bool)
    mask[..., 40:] = True
    with torch.no_grad():
        alone = m(x)
        assert torch.isfinite(alone).all()
        if pe in ("sine", "peg", "none"):  # mask-aware at the input, or no position: batch-invariant
            torch.testing.assert_close(m(padded, mask), alone, atol=1e-5, rtol=1e-5)


def test_eva_keep_abs_pos_and_refusals():
    m = convert_vit(timm_eva("eva02_tiny_patch14_224"), pe="rope_axial", pe_kwargs=dict(base=50.0), keep_abs_pos=True)
    assert m.pos_embed is not None and m.blocks[0].attn.pe.base == 50.0
    with pytest.raises(ValueError, match="layout"):
        convert_vit(timm_eva("vit_small_patch16_rope_224"), pe="rope_axial", pe_kwargs=dict(layout="half"))
    with pytest.raises(ValueError, match="contextual"):
        convert_vit(timm_eva("vit_small_patch16_rope_224"), pe="irpe", pe_kwargs=dict(contextual=True))
    with pytest.raises(ValueError, match="pe_at"):
        convert_vit(timm_eva("vit_small_patch16_rope_224"), pe="sine", pe_at="every_block")
    with pytest.raises(ValueError, match="added twice"):
        convert_vit(timm_eva("eva_giant_patch14_224"), pe="learned_abs", keep_abs_pos=True)
    dino = timm.create_model("vit_base_patch16_dinov3", embed_dim=32, depth=1, num_heads=2, img_size=32,
                             rope_grid_offset=0.25)  # DINOv3's RoPE converts (tests/test_dinov3.py), an offset not
    with pytest.raises(ValueError, match="grid_offset=0.25"):
        convert_vit(dino)
    with pytest.raises(ValueError, match="keep_abs_pos"):
        convert_vit(timm.create_model("vit_tiny_patch16_224", **TINY), keep_abs_pos=True)


def test_naflexvit_converts_and_other_models_are_refused_with_the_reason():
    # NaFlexVit converts (parity and packed inputs: tests/test_naflex.py), by name too
    m = create_vit("naflexvit_base_patch16_gap", embed_dim=32, depth=1, num_heads=2, num_classes=3)
    assert isinstance(m, VispeViT) and m.pe_name == "learned_abs" and m.pe.mask_aware and m.pe.grid == (16, 16)
    with pytest.raises(ValueError, match="timm resnet model"):
        create_vit("resnet18")
    with pytest.raises(ValueError, match="model is a ResNet: expected a timm VisionTransformer"):
        convert_vit(timm.create_model("resnet18"))


# ---------------------------------------------------------------- DeiT distilled
def test_deit_distilled_keeps_timm_weights_keys_and_heads():
    torch.manual_seed(0)
    ref = timm.create_model("deit_tiny_distilled_patch16_224", **TINY).eval()
    x = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        want = ref(x)
        keys = set(ref.state_dict())
        m = convert_vit(ref)
        assert m.num_prefix_tokens == 2 and m.pe_name == "learned_abs" and m.pe.num_prefix_tokens == 2
        assert set(m.state_dict()) == keys  # dist_token, head_dist, pos_embed with its two prefix rows
        torch.testing.assert_close(m(x), want, atol=1e-5, rtol=1e-5)
        assert m(torch.randn(1, 3, 24, 40)).shape == (1, 3)
    m.train().set_distilled_training(True)
    cls_logits, dist_logits = m(x)
    assert cls_logits.shape == dist_logits.shape == (2, 3)
    rope = create_vit("deit_tiny_distilled_patch16_224", pe="relbias", **TINY)
    assert rope.blocks[0].attn.pe.num_prefix_tokens == 2 and rope.dist_token is not None
    assert rope(torch.randn(1, 3, 24, 40)).shape == (1, 3)


# ---------------------------------------------------------------- pretrained weights from a file
def _fake_checkpoint(tmp_path, name, **kw):
    torch.manual_seed(1)
    src = timm.create_model(name, **kw)
    path = tmp_path / f"{name}.pth"
    torch.save(src.state_dict(), path)
    return path, src.state_dict()


def test_create_vit_pretrained_from_a_file_keeps_everything_but_the_encoding(tmp_path):
    kw = dict(img_size=32, patch_size=8, embed_dim=32, depth=1, num_heads=2)  # 1000 classes, as timm's cfg
    path, sd = _fake_checkpoint(tmp_path, "vit_tiny_patch16_224", **kw)
    own = create_vit("vit_tiny_patch16_224", checkpoint=path, **kw)
    assert own.pe_name == "learned_abs"
    for k, v in own.state_dict().items():
        torch.testing.assert_close(v, sd[k])  # everything, the absolute table included
    other = create_vit("vit_tiny_patch16_224", pretrained=True, checkpoint=path, pe="rope_axial", num_classes=5, **kw)
    osd = other.state_dict()
    assert "pos_embed" in sd and not any(k.endswith("pos_embed") for k in osd)
    for k, v in osd.items():
        if not k.startswith("head") and ".attn.pe." not in k:
            torch.testing.assert_close(v, sd[k])  # all but the encoding and the 5-class head
    assert osd["head.weight"].shape == (5, 32)
    with pytest.raises(ValueError, match="no such file"):
        create_vit("vit_tiny_patch16_224", checkpoint=tmp_path / "missing.pth", **kw)
    with pytest.raises(ValueError, match="vispe preset"):
        create_vit("vit_pico", pretrained=True)


def test_create_vit_pretrained_eva_from_a_file(tmp_path):
    kw = dict(img_size=32, patch_size=8, embed_dim=32, depth=2, num_heads=2)
    path, sd = _fake_checkpoint(tmp_path, "vit_small_patch16_rope_mixed_224", **kw)
    m = create_vit("vit_small_patch16_rope_mixed_224", checkpoint=path, **kw)
    ref = timm.create_model("vit_small_patch16_rope_mixed_224", dynamic_img_size=True, **kw).eval()
    ref.load_state_dict(sd)
    x = torch.randn(1, 3, 24, 40)
    with torch.no_grad():
        torch.testing.assert_close(m.eval()(x), ref(x), atol=1e-5, rtol=1e-5)
    sine = create_vit("vit_small_patch16_rope_mixed_224", checkpoint=path, pe="sine", **kw)
    assert sine.pe_name == "sine" and all(blk.attn.pe is None for blk in sine.blocks)
    torch.testing.assert_close(sine.state_dict()["blocks.1.attn.qkv.weight"], sd["blocks.1.attn.qkv.weight"])


# ---------------------------------------------------------------- vispe presets as timm models
def test_presets_are_timm_models_with_features_and_intermediates(tmp_path):
    assert set(timm.list_models("vispe_*")) == {"vispe_" + k[4:] for k in PRESETS}
    m = timm.create_model("vispe_pico", pe="rope_mixed", num_classes=7)
    assert isinstance(m, VispeViT) and m.pe_name == "rope_mixed" and m.num_classes == 7
    x = torch.randn(2, 3, 24, 40)
    assert m(x).shape == (2, 7)
    feats = timm.create_model("vispe_pico", pe="sine", features_only=True, out_indices=(1, 3))
    out = feats(x)
    assert [tuple(f.shape) for f in out] == [(2, 64, 6, 10)] * 2
    assert feats.feature_info.channels() == [64, 64]
    final, inter = m.forward_intermediates(x, indices=2, output_fmt="NLC")
    assert final.shape == (2, 1 + 60, 64) and [tuple(t.shape) for t in inter] == [(2, 60, 64)] * 2
    ten = timm.create_model("vispe_pico", pe="rope_mixed")  # the preset's 10 classes (timm drops another head)
    path = tmp_path / "pico.pth"
    torch.save(ten.state_dict(), path)
    again = timm.create_model("vispe_pico", pe="rope_mixed", pretrained=True, pretrained_cfg_overlay=dict(file=str(path)))
    with torch.no_grad():
        torch.testing.assert_close(again.eval()(x), ten.eval()(x))
    with pytest.raises(ValueError, match="no pretrained weights"):
        timm.create_model("vispe_pico", pretrained=True)


@pytest.mark.parametrize("name, kw", [
    ("vit_tiny_patch16_224", dict(img_size=32, patch_size=8, depth=1, num_classes=3)),
    ("eva02_tiny_patch14_224", dict(img_size=28, patch_size=14, depth=1, num_classes=3)),
])
def test_convert_vit_converts_in_place_and_returns_the_same_model(name, kw):
    """As documented (README, convert_vit; issue 28, item 11): the object passed in is the converted
    model, with the same parameter tensors; a deepcopy taken before keeps the original."""
    import copy

    import timm

    from vispe.models.vit import convert_vit

    torch.manual_seed(0)
    m = timm.create_model(name, pretrained=False, **kw).eval()
    original = copy.deepcopy(m)
    ptrs = {n: p.data_ptr() for n, p in m.named_parameters()}
    out = convert_vit(m, pe="rope_axial")
    assert out is m and type(m).__name__.startswith("Vispe")
    assert [n for n, p in out.named_parameters() if n in ptrs and p.data_ptr() != ptrs[n]] == []  # not copied
    assert type(original).__module__.startswith("timm") and not type(original).__name__.startswith("Vispe")


def test_convert_vit_of_a_naflexvit_builds_a_new_model_that_takes_over_its_blocks():
    import timm

    from vispe.models.vit import convert_vit

    m = timm.create_model("naflexvit_base_patch16_gap", embed_dim=32, depth=1, num_heads=2, num_classes=3)
    out = convert_vit(m)
    assert out is not m and out.blocks is m.blocks and out.head is m.head  # shared: documented, do not reuse m


def test_convert_vit_keeps_a_timm_vits_own_table_with_timms_resampling_at_any_size():
    """pe=None keeps timm's table and its rule: timm resamples ``pos_embed`` bicubically with antialias
    also when the grid grows (``resample_abs_pos_embed``); vispe's learned_abs default antialiases only
    when an axis shrinks, 0.0043 apart at 8 x 16 patches (found by vispe.audit, issue 51)."""
    torch.manual_seed(0)
    ref = timm.create_model("vit_tiny_patch16_224", dynamic_img_size=True, **TINY).eval()
    with torch.no_grad():
        for p in ref.parameters():
            p.add_(torch.randn_like(p) * 0.2)
    sizes = [(32, 32), (64, 128), (24, 40), (16, 48)]  # built, grown non-square, mixed, shrunk in y
    with torch.no_grad():
        xs = [torch.randn(2, 3, h, w) for h, w in sizes]
        want = [ref(x) for x in xs]
        m = convert_vit(ref)
        assert m.pe_name == "learned_abs" and m.pe_kwargs["antialias"] == "always"
        for x, y in zip(xs, want):
            torch.testing.assert_close(m(x), y, atol=1e-5, rtol=1e-5)
