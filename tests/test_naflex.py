"""NaFlex: timm's NaFlexVit converted exactly; packed variable-aspect inputs through every encoding
equal each image run alone; the data transform built from timm's."""
from __future__ import annotations

import copy
import math

import pytest
import timm
import torch
from timm.data.naflex_transforms import ResizeKeepRatioToSequence, patchify_image

import vispe
from vispe.data.naflex import naflex_transform, pack
from vispe.models.naflex import forward_features_packed, forward_packed, packed_to_images
from vispe.models.vit import convert_vit, create_vit


def _redraw(model: torch.nn.Module, seed: int = 0) -> None:
    """Every parameter redrawn, nothing near zero (layer scales of 1e-5 would hide the blocks)."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() == 1 and any(k in name for k in ("norm", "gamma")):
                p.copy_(torch.rand(p.shape, generator=g) + 0.5)
            elif name.endswith("pos_embed"):
                p.copy_(torch.randn(p.shape, generator=g))
            elif p.dim() >= 2:
                p.copy_(torch.randn(p.shape, generator=g) / math.sqrt(p[0].numel()))
            else:
                p.copy_(torch.randn(p.shape, generator=g) * 0.2)


def _packed(images, patch=(16, 16), max_seq_len=None):
    keys = ("patches", "patch_coord", "patch_valid")
    return pack([dict(zip(keys, patchify_image(im, patch))) for im in images], max_seq_len=max_seq_len)


@pytest.mark.parametrize("name, prefix", [("naflexvit_base_patch16_gap", 4), ("naflexvit_base_patch16_map", 1),
                                          ("naflexvit_base_patch16_siglip", 0)])
def test_timm_naflexvit_converts_exactly_on_a_packed_batch_of_aspect_ratios(name, prefix):
    """avg pooling with 4 registers, attention pooling with a class token (map), SigLIP-2's layout."""
    ref = timm.create_model(name, embed_dim=64, depth=2, num_heads=2, num_classes=7).eval()
    _redraw(ref)
    model = convert_vit(copy.deepcopy(ref)).eval()
    assert model.pe_name == "learned_abs" and model.pe.mask_aware and model.num_prefix_tokens == prefix
    g = torch.Generator().manual_seed(1)
    # 4x8, 10x3 and 6x6 patches: the learned 16x16 table is resampled to each image's grid
    images = [torch.randn(3, *hw, generator=g) for hw in [(64, 128), (160, 48), (96, 96)]]
    batch = _packed(images, max_seq_len=40)
    with torch.no_grad():
        want = ref(batch)
        got = forward_packed(model, batch)
        want_tok = ref.forward_features(batch["patches"], batch["patch_coord"], batch["patch_valid"])["patches"]
        got_tok = forward_features_packed(model, batch)
    assert want.abs().max() > 0.5
    torch.testing.assert_close(got, want, rtol=0, atol=1e-4)
    valid = torch.cat([torch.ones(3, prefix, dtype=torch.bool), batch["patch_valid"]], 1)  # (B, P + N)
    torch.testing.assert_close(got_tok[valid], want_tok[valid], rtol=0, atol=1e-4)
    assert (got_tok[~valid] == 0).all()
    with torch.no_grad():  # timm's image path too (table resampled to the whole grid)
        x = torch.randn(2, 3, 80, 144, generator=g)
        torch.testing.assert_close(model(x), ref(x), rtol=0, atol=1e-4)


#: encodings whose packed outputs equal the image alone only with their mask-aware option
OPTION = {"fourier": dict(mask_aware=True), "normidx2d": dict(mask_aware=True), "learned_abs": dict(mask_aware=True),
          "log_cpb": dict(pretrained_window=(3, 4))}
#: and the one that cannot: its table is resized to the canvas window, which packing enlarges
NOT_INVARIANT = {"relbias": "its table is resized to the canvas (max h, max w) window",
                 "relpos_decomposed": "its tables are resized to the canvas grid (SAM's rule)"}


def _pico(pe, kw):
    torch.manual_seed(0)
    m = create_vit("vit_pico", pe=pe, pe_kwargs=kw, embed_dim=32, depth=2, num_heads=2, img_size=(12, 16),
                   patch_size=4, num_classes=5, global_pool="avg", reg_tokens=1).eval()
    with torch.no_grad():
        for p in m.parameters():  # zero-initialised tables would hide differences
            p.add_(torch.randn_like(p) * 0.05)
    return m


@pytest.mark.parametrize("name", vispe.available())
def test_every_encodings_packed_outputs_equal_each_image_alone(name):
    model = _pico(name, OPTION.get(name))
    g = torch.Generator().manual_seed(2)
    images = [torch.randn(3, *hw, generator=g) for hw in [(8, 20), (16, 8), (12, 12)]]  # 2x5, 4x2, 3x3 patches
    batch = _packed(images, patch=(4, 4), max_seq_len=12)
    with torch.no_grad():
        logits = forward_packed(model, batch)  # canvas 4x5 patches
        tokens = forward_features_packed(model, batch)
        alone = [model(im[None])[0] for im in images]
        alone_tok = [model.forward_features(im[None])[0] for im in images]
    for i, (im, a, at) in enumerate(zip(images, alone, alone_tok)):
        n = (im.shape[1] // 4) * (im.shape[2] // 4)
        if name in NOT_INVARIANT:
            assert (logits[i] - a).abs().max() > 1e-4, f"{name} is invariant: update NOT_INVARIANT"
            continue
        torch.testing.assert_close(logits[i], a, rtol=1e-4, atol=1e-5, msg=f"{name}: image {i}")
        torch.testing.assert_close(tokens[i, :2 + n], at, rtol=1e-4, atol=1e-4, msg=f"{name}: tokens of image {i}")


def test_learned_abs_needs_its_mask_aware_option_to_pack():
    """Without it the table is resampled to the canvas: the NaFlex rule is the option, not the default."""
    model = _pico("learned_abs", None)
    images = [torch.randn(3, 8, 20), torch.randn(3, 16, 8)]
    with torch.no_grad():
        packed = forward_packed(model, _packed(images, patch=(4, 4)))
        assert (packed[1] - model(images[1][None])[0]).abs().max() > 1e-4


def test_transform_keeps_the_aspect_within_the_budget_and_packs_back_to_the_resized_image():
    transform = naflex_transform(patch_size=16, max_seq_len=24)
    g = torch.Generator().manual_seed(3)
    images = [torch.rand(3, 300, 100, generator=g), torch.rand(3, 90, 250, generator=g), torch.rand(3, 64, 64, generator=g)]
    samples = [transform(im) for im in images]
    batch = pack(samples, max_seq_len=24)
    assert batch["patches"].shape == (3, 24, 16 * 16 * 3) and batch["patch_valid"].shape == (3, 24)
    canvas, mask = packed_to_images(batch["patches"], batch["patch_coord"], batch["patch_valid"], patch_size=16)
    resize = ResizeKeepRatioToSequence(patch_size=16, max_sequence_len=24)
    for b, im in enumerate(images):
        resized = resize(im)  # what the transform resized to
        H, W = resized.shape[1:]
        n = int(batch["patch_valid"][b].sum())
        assert n == (H // 16) * (W // 16) <= 24
        assert abs(math.log((H / W) / (im.shape[1] / im.shape[2]))) < 0.6  # aspect kept (to whole patches)
        torch.testing.assert_close(canvas[b, :, :H, :W], resized)  # the packed patches are the resized image
        assert not mask[b, :H, :W].any() and mask[b, H:].all() and mask[b, :, W:].all()
        coord = batch["patch_coord"][b, :n]
        assert coord[:, 0].max() + 1 == H // 16 and coord[:, 1].max() + 1 == W // 16  # (y, x) order


def test_bad_packed_inputs_are_refused_by_name():
    batch = _packed([torch.randn(3, 8, 12), torch.randn(3, 12, 4)], patch=(4, 4), max_seq_len=8)
    p, c, v = batch["patches"], batch["patch_coord"], batch["patch_valid"]
    with pytest.raises(ValueError, match="patches has shape"):
        packed_to_images(p[..., :-1], c, v, patch_size=4)
    with pytest.raises(ValueError, match="patch_coord"):
        packed_to_images(p, c.float(), v, patch_size=4)
    with pytest.raises(ValueError, match="patch_valid"):
        packed_to_images(p, c, v[:, :-1], patch_size=4)
    dup = c.clone()
    dup[0, 1] = dup[0, 0]
    with pytest.raises(ValueError, match="repeats"):
        packed_to_images(p, dup, v, patch_size=4)
    empty = v.clone()
    empty[1] = False
    with pytest.raises(ValueError, match=r"patch_valid\[1\]"):
        packed_to_images(p, c, empty, patch_size=4)
    with pytest.raises(ValueError, match="max_seq_len=4"):
        pack([dict(zip(("patches", "patch_coord", "patch_valid"), patchify_image(torch.randn(3, 8, 12), (4, 4))))],
             max_seq_len=4)


def test_naflexvit_settings_without_an_equivalent_are_refused():
    m = timm.create_model("naflexvit_base_patch16_gap", embed_dim=32, depth=1, num_heads=2,
                          pos_embed_use_grid_sample=True)
    with pytest.raises(ValueError, match="grid_sample"):
        convert_vit(m)
    with pytest.raises(ValueError, match="pos_embed_type='factorized'"):
        convert_vit(timm.create_model("naflexvit_base_patch16_parfac_gap", embed_dim=32, depth=1, num_heads=2))
    named = convert_vit(timm.create_model("naflexvit_base_patch16_gap", embed_dim=32, depth=1, num_heads=2),
                        pe="rope_mixed")  # another encoding replaces the table
    assert named.pe is None and named.blocks[0].attn.pe.registry_name == "rope_mixed"
    with pytest.raises(ValueError, match="keep_abs_pos"):
        convert_vit(timm.create_model("naflexvit_base_patch16_gap", embed_dim=32, depth=1, num_heads=2),
                    keep_abs_pos=True)
