"""ViT-level contracts of every registered encoding (issue 19, item 13; see test_contract.py).

Batch invariance through the whole ViT: an image alone and the same image in a larger padded
canvas (padding mask given) give the same logits, with whole-patch padding at the bottom/right and
at the top/left, for every encoding not on the documented list below, which says why (and the
test checks that those really differ, so the list cannot hide a regression). Valid sizes that do
not fall on patch boundaries: a patch is padding only when ALL its pixels are
(``vispe.models._vit_inputs.patch_mask``), so a partly padded patch is a token and the image padded
to whole patches on its own gives the same logits as in the batch.

Non-square parity with timm, with register tokens and ``no_embed_class``.
"""
from __future__ import annotations

import pytest
import timm
import torch

import vispe
from vispe.models._vit_inputs import patch_mask
from vispe.models.vit import create_vit

#: ViT batch invariance of each encoding in its default build: (bottom/right padding, top/left padding, why not)
VIT_INVARIANCE = {
    "none": (True, True, ""),
    "sine": (True, True, ""),  # mask-aware
    "rope_axial": (True, True, ""),  # mask-aware
    "rope_mixed": (True, True, ""),  # mask-aware
    "peg": (True, True, ""),  # zeros padding is mask-aware: padded features are zeroed
    "relbias_axis": (True, True, ""),  # relative offsets of valid tokens do not depend on the canvas
    "irpe": (True, True, ""),  # idem
    "sincos2d": (True, False, "integer index from the top-left corner, not mask-aware by default"),
    "axis2d": (True, False, "integer index from the top-left corner, not mask-aware by default"),
    "learned_rowcol": (True, False, "DETR's row/column tables are read by index from the top-left corner"),
    "fourier": (False, False, "centred coordinates span the whole canvas unless mask_aware=True"),
    "normidx2d": (False, False, "normalised index spans the whole canvas unless mask_aware=True"),
    "learned_abs": (False, False, "the table is resampled to the canvas grid"),
    "relbias": (False, False, "its table is resized to the canvas window (use the window it was built for)"),
    "relpos_decomposed": (False, False, "its tables are resized linearly to the canvas grid (SAM's rule)"),
    "log_cpb": (False, False, "coordinates are normalised by the canvas window unless pretrained_window is set"),
}
#: option variants that make the encodings above invariant both ways (their documented remedy)
INVARIANT_VARIANTS = [("sincos2d", dict(mask_aware=True)), ("axis2d", dict(mask_aware=True)),
                      ("fourier", dict(mask_aware=True)), ("normidx2d", dict(mask_aware=True)),
                      ("log_cpb", dict(pretrained_window=(3, 4))), ("learned_abs", dict(mask_aware=True)),
                      # issue 27: scaling (one factor per image's valid extent) and centring keep it
                      ("rope_axial", dict(scaling="ntk", ref_grid=(2, 2))), ("rope_mixed", dict(scaling="yarn", ref_grid=(2, 2))),
                      ("sine", dict(center=True)), ("sincos2d", dict(mask_aware=True, center=True)),
                      ("normidx2d", dict(mask_aware=True, center=True))]


def _vit(pe, pe_kwargs=None, **kw):
    torch.manual_seed(0)
    m = create_vit("vit_pico", pe=pe, pe_kwargs=pe_kwargs, embed_dim=32, depth=2, num_heads=2, img_size=(12, 16),
                   patch_size=4, num_classes=5, global_pool="avg", class_token=True, reg_tokens=1, **kw).eval()
    with torch.no_grad():
        for p in m.parameters():  # zero-initialised tables would hide differences
            p.add_(torch.randn_like(p) * 0.05)
    return m


def _in_canvas(img: torch.Tensor, canvas=(20, 28), at=(0, 0)):
    """``img`` (1, 3, h, w) pasted at pixel ``at`` of a zero canvas, with its padding mask."""
    _, _, h, w = img.shape
    y, x = at
    big = torch.zeros(1, 3, *canvas)
    big[..., y:y + h, x:x + w] = img
    mask = torch.ones(1, *canvas, dtype=torch.bool)
    mask[:, y:y + h, x:x + w] = False
    return big, mask


CASES = [(n, None) for n in VIT_INVARIANCE] + INVARIANT_VARIANTS


@pytest.mark.parametrize("name, kw", CASES, ids=[n + ("-" + "-".join(kw) if kw else "") for n, kw in CASES])
def test_whole_vit_batch_invariance_with_padding_at_either_side(name, kw):
    m = _vit(name, kw)
    img = torch.randn(1, 3, 12, 16)  # 3x4 patches
    expect = VIT_INVARIANCE[name][:2] if kw is None else (True, True)
    with torch.no_grad():
        alone = m(img, torch.zeros(1, 12, 16, dtype=torch.bool))
        for side, at, invariant in (("bottom/right", (0, 0), expect[0]), ("top/left", (8, 12), expect[1])):
            big, mask = _in_canvas(img, at=at)  # 5x7 patches, whole-patch padding
            padded = m(big, mask)
            if invariant:
                torch.testing.assert_close(padded, alone, rtol=1e-4, atol=1e-5, msg=f"{name}: padding at the {side}")
            else:  # on the documented list: check it really is not invariant (the list stays honest)
                assert (padded - alone).abs().max() > 1e-4, f"{name} is invariant with padding at the {side}: update VIT_INVARIANCE"


def test_partly_padded_patches_are_tokens():
    """The rule for valid sizes off the patch grid, at either side: padding only where a whole patch is."""
    mask = torch.ones(2, 12, 16, dtype=torch.bool)
    mask[0, :10, :14] = False  # valid 10x14 at the top left
    mask[1, 2:, 2:] = False  # valid 10x14 at the bottom right
    assert not patch_mask(mask, (4, 4)).any()
    mask[0, :, 12:] = True  # a whole column of patches padded
    assert patch_mask(mask, (4, 4))[0].tolist() == [[False, False, False, True]] * 3


@pytest.mark.parametrize("name", [n for n, (br, tl, _) in VIT_INVARIANCE.items() if br and tl])
def test_a_valid_size_off_the_patch_grid_gives_the_same_logits_alone_and_in_a_batch(name):
    """A 10x14 image, padded by itself to 12x16 (the smallest whole-patch size), and the same image
    in a 20x28 canvas, at the top left and at the bottom right: same logits."""
    m = _vit(name)
    img = torch.randn(1, 3, 10, 14)
    with torch.no_grad():
        for own_at, big_at in (((0, 0), (0, 0)), ((2, 2), (10, 14))):
            own, own_mask = _in_canvas(img, canvas=(12, 16), at=own_at)
            big, big_mask = _in_canvas(img, canvas=(20, 28), at=big_at)
            torch.testing.assert_close(m(big, big_mask), m(own, own_mask), rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("no_embed_class", [False, True])
def test_non_square_parity_with_timm_with_register_tokens(no_embed_class):
    kw = dict(img_size=(32, 48), patch_size=4, embed_dim=32, depth=2, num_heads=2, num_classes=5, reg_tokens=2,
              class_token=True, no_embed_class=no_embed_class)
    torch.manual_seed(0)
    ref = timm.create_model("vit_tiny_patch16_224", pretrained=False, **kw).eval()
    ours = create_vit("vit_tiny_patch16_224", pe="learned_abs", **kw).eval()
    assert ours.pe.grid == (8, 12) and ours.pe.num_prefix_tokens == (0 if no_embed_class else 3)
    assert set(ours.state_dict()) == set(ref.state_dict())
    with torch.no_grad():
        ref.pos_embed.normal_()  # a table that is not symmetric in y and x
    ours.load_state_dict(ref.state_dict())
    x = torch.randn(2, 3, 32, 48)
    with torch.no_grad():
        torch.testing.assert_close(ours.forward_features(x), ref.forward_features(x), rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(ours(x), ref(x), rtol=1e-5, atol=1e-5)
        swapped = ref.pos_embed.clone()  # the grid read with its axes swapped must not match
        P = 0 if no_embed_class else 3
        swapped[:, P:] = swapped[:, P:].view(1, 8, 12, -1).transpose(1, 2).reshape(1, 96, -1)
        ours.pe.pos_embed.copy_(swapped[:, P:])
        assert (ours.forward_features(x) - ref.forward_features(x)).abs().max() > 1e-2
    ref.load_state_dict(create_vit("vit_tiny_patch16_224", pe="learned_abs", **kw).state_dict())  # and back
