"""vispe encodings inside timm's VisionTransformer."""
import pytest
import timm
import torch

import vispe
from vispe.models.vit import convert_vit, create_vit

TINY = dict(embed_dim=32, depth=2, num_heads=2, img_size=16, patch_size=4, num_classes=5)


def tiny(pe, **kw):
    torch.manual_seed(0)
    return create_vit("vit_pico", pe=pe, **{**TINY, **kw})


def test_learned_abs_gives_timm_logits_with_the_same_weights():
    ref = timm.create_model("vit_tiny_patch16_224", pretrained=False, img_size=32, patch_size=4, num_classes=10).eval()
    ours = create_vit("vit_tiny_patch16_224", pe="learned_abs", img_size=32, patch_size=4, num_classes=10).eval()
    assert set(ours.state_dict()) == set(ref.state_dict())
    ours.load_state_dict(ref.state_dict())
    x = torch.randn(2, 3, 32, 32)
    torch.testing.assert_close(ours(x), ref(x), rtol=1e-5, atol=1e-5)
    ref.load_state_dict(ours.state_dict())  # and back: timm loads vispe's checkpoint as is


def test_timm_checkpoint_at_another_size_is_resampled_on_load():
    """A 8x8-grid timm checkpoint loads into a 12x12-grid model: bicubic by target size (no
    antialias when growing), the class token's vector kept; logits equal a stock timm model at 48
    px holding the same resampled table."""
    from timm.layers import resample_abs_pos_embed

    ref = timm.create_model("vit_tiny_patch16_224", pretrained=False, img_size=32, patch_size=4).eval()
    big = create_vit("vit_tiny_patch16_224", pe="learned_abs", img_size=48, patch_size=4, num_classes=1000).eval()
    big.load_state_dict(ref.state_dict())
    want = resample_abs_pos_embed(ref.pos_embed.detach(), [12, 12], [8, 8], num_prefix_tokens=1, antialias=False)
    torch.testing.assert_close(big.state_dict()["pos_embed"], want)
    stock48 = timm.create_model("vit_tiny_patch16_224", pretrained=False, img_size=48, patch_size=4).eval()
    sd = dict(ref.state_dict(), pos_embed=want)
    stock48.load_state_dict(sd)
    x = torch.randn(1, 3, 48, 48)
    torch.testing.assert_close(big(x), stock48(x), rtol=1e-5, atol=1e-5)


def test_convert_existing_timm_model_keeps_weights_and_swaps_encoding():
    m = timm.create_model("vit_tiny_patch16_224", pretrained=False, img_size=32, patch_size=8, num_classes=3).eval()
    x = torch.randn(1, 3, 32, 32)
    before = m(x)
    convert_vit(m, pe="learned_abs")
    torch.testing.assert_close(m(x), before, rtol=1e-5, atol=1e-5)
    m2 = convert_vit(timm.create_model("vit_tiny_patch16_224", pretrained=False, img_size=32, patch_size=8), pe="rope_axial")
    assert m2.pe_family == "rotary" and m2.blocks[0].attn.pe is not None
    assert torch.isfinite(m2(torch.randn(1, 3, 40, 24))).all()


def _shuffle_patches(x, perm, p):
    B, C, H, W = x.shape
    h, w = H // p, W // p
    t = x.reshape(B, C, h, p, w, p).permute(0, 2, 4, 1, 3, 5).reshape(B, h * w, C, p, p)[:, perm]
    return t.reshape(B, h, w, C, p, p).permute(0, 3, 1, 4, 2, 5).reshape(B, C, H, W)


@pytest.mark.parametrize("pe", vispe.available())
def test_only_none_is_permutation_equivariant_over_patches(pe):
    m = tiny(pe, img_size=(12, 16)).eval()
    with torch.no_grad():
        for p in m.parameters():  # break zero-initialised prefix/bias tables, so each encoding acts
            p.add_(torch.randn_like(p) * 0.05)
    x = torch.randn(2, 3, 12, 16)
    perm = torch.randperm(12)
    with torch.no_grad():
        a, b = m(x), m(_shuffle_patches(x, perm, 4))
    if pe == "none":
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)
    else:
        assert (a - b).abs().max() > 1e-4, f"{pe} output did not change when the patches moved"


@pytest.mark.parametrize("pe", vispe.available())
def test_every_encoding_trains_a_step_and_evaluates_at_another_size(pe):
    m = tiny(pe, class_token=True, reg_tokens=1)
    opt = torch.optim.AdamW(m.parameters(), lr=1e-3)
    x, y = torch.randn(4, 3, 16, 16), torch.randint(0, 5, (4,))
    loss = torch.nn.functional.cross_entropy(m(x), y)
    loss.backward()
    opt.step()
    m.eval()
    with torch.no_grad():
        for size in [(16, 16), (24, 16), (8, 12)]:
            out = m(torch.randn(2, 3, *size))
            assert out.shape == (2, 5) and torch.isfinite(out).all()
        with torch.autocast("cpu", dtype=torch.bfloat16):
            assert torch.isfinite(m(torch.randn(2, 3, 20, 20)).float()).all()


@pytest.mark.parametrize("pe", ["sine", "learned_abs"])
def test_additive_every_block_differs_from_input_only(pe):
    a = tiny(pe, pe_at="every_block").eval()
    b = tiny(pe, pe_at="input").eval()
    b.load_state_dict(a.state_dict())
    x = torch.randn(1, 3, 16, 16)
    assert (a(x) - b(x)).abs().max() > 1e-5


def test_padding_mask_makes_the_prediction_batch_invariant():
    """An image alone and the same image padded to a larger canvas give the same logits."""
    m = tiny("sine", global_pool="avg", class_token=False).eval()
    img = torch.randn(1, 3, 12, 16)
    canvas = torch.zeros(1, 3, 16, 24)
    canvas[..., :12, :16] = img
    mask = torch.ones(1, 16, 24, dtype=torch.bool)
    mask[:, :12, :16] = False
    with torch.no_grad():
        alone = m(img, torch.zeros(1, 12, 16, dtype=torch.bool))
        padded = m(canvas, mask)
    torch.testing.assert_close(alone, padded, rtol=1e-4, atol=1e-5)


def test_forward_intermediates_applies_the_encoding():
    m = tiny("rope_axial").eval()
    x = torch.randn(1, 3, 16, 16)
    feats = m.forward_intermediates(x, indices=2, intermediates_only=True)
    assert [f.shape for f in feats] == [(1, 32, 4, 4)] * 2
    final, _ = m.forward_intermediates(x, indices=1)
    torch.testing.assert_close(final, m.forward_features(x))


def test_bad_input_is_refused_clearly():
    with pytest.raises(ValueError, match="img_size=30.*patch_size=4"):
        create_vit("vit_pico", pe="none", img_size=30, patch_size=4)
    with pytest.raises(ValueError, match="head_dim"):
        create_vit("vit_pico", pe="rope_axial", embed_dim=36, num_heads=6, img_size=16, patch_size=4)  # head_dim 6
    with pytest.raises(ValueError, match=r"x has size \(H, W\)=\(18, 16\): expected multiples of the patch size"):
        tiny("none")(torch.randn(1, 3, 18, 16))
    with pytest.raises(ValueError, match="unknown encoding"):
        tiny("rope2d")
    with pytest.raises(ValueError, match="pe_at='every_block'"):
        tiny("rope_axial", pe_at="every_block")
    with pytest.raises(ValueError, match="patch_drop_rate"):
        tiny("relbias", patch_drop_rate=0.5)
    with pytest.raises(ValueError, match="name='resnet50'"):
        create_vit("resnet50", pe="none")


def test_encoding_parameters_skip_weight_decay():
    m = tiny("rope_mixed")
    nwd = m.no_weight_decay()
    assert any(".attn.pe." in n for n in nwd) and "cls_token" in nwd


@pytest.fixture
def uninitialised_memory_is_nan():
    """torch.empty fills NaN while this runs, so that a parameter nobody initialised shows."""
    import torch.utils.deterministic as det

    before = torch.are_deterministic_algorithms_enabled(), det.fill_uninitialized_memory
    torch.use_deterministic_algorithms(True)
    det.fill_uninitialized_memory = True
    yield
    torch.use_deterministic_algorithms(before[0])
    det.fill_uninitialized_memory = before[1]


def test_weight_init_torch_keeps_pytorchs_modules_and_initialises_the_tokens(uninitialised_memory_is_nan):
    """timm's weight_init='skip' leaves cls_token / reg_token as torch.empty memory (a relbias run
    that NaN'd one try in two): vispe refuses it from scratch and offers 'torch' instead."""
    with pytest.raises(ValueError, match="weight_init='skip'.*uninitialised memory.*'torch'"):
        tiny("relbias", weight_init="skip")
    with pytest.raises(ValueError, match="weight_init='skip'"):
        create_vit("vit_tiny_patch16_224", pe="rope_axial", img_size=16, patch_size=4, weight_init="skip")
    torch.manual_seed(0)
    m = tiny("relbias", weight_init="torch", reg_tokens=2)
    for name, p in m.named_parameters():
        assert torch.isfinite(p).all(), name
    assert 0 < m.cls_token.abs().max() < 1e-4 and 0 < m.reg_token.abs().max() < 1e-4  # timm's normal(1e-6)
    qkv = m.blocks[0].attn.qkv
    fan_in = qkv.weight.shape[1]
    # PyTorch's nn.Linear default: uniform(+-1/sqrt(fan_in)) for weight and bias; timm's default: trunc-normal 0.02, zero bias
    assert qkv.weight.abs().max() <= fan_in ** -0.5 and qkv.weight.std() > 0.05
    assert qkv.bias.abs().max() > 0
    timm_default = tiny("relbias")
    assert timm_default.blocks[0].attn.qkv.bias.abs().max() == 0
    for name in ("vit_tiny_patch16_224", "deit_tiny_distilled_patch16_224"):  # timm names: tokens of each kind
        timm_model = create_vit(name, pe="rope_axial", img_size=16, patch_size=4, weight_init="torch")
        for n, p in timm_model.named_parameters():
            assert torch.isfinite(p).all(), (name, n)
        assert timm_model.blocks[0].attn.qkv.bias.abs().max() > 0


def test_a_preset_without_pe_is_learned_abs_and_says_so(caplog):
    """issue 53: create_vit("vit_pico") without pe means learned_abs; the log says it, a named pe does not."""
    import logging

    from vispe.image.learned_abs import LearnedAbsEncoding

    with caplog.at_level(logging.INFO, logger="vispe.models.vit"):
        m = create_vit("vit_pico")
    assert isinstance(m.pe, LearnedAbsEncoding)
    assert [r.getMessage() for r in caplog.records] == [
        "create_vit('vit_pico'): no pe given, the preset's default pe='learned_abs' (a learned absolute table)"]
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="vispe.models.vit"):
        create_vit("vit_pico", pe="learned_abs")
    assert not caplog.records
