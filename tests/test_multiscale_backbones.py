"""Multi-scale backbone levels (vispe.models.detr.neck.multiscale, vit_pyramid): strides, masks per level, the
mask-aware GroupNorm, and batch invariance level by level (an image alone vs padded in a batch)."""
import pytest
import torch
from torch import nn

from vispe.coords import resize_mask
from vispe.models.detr.backbone.cnn import SmallCNN
from vispe.models.detr.backbone.vit import ViTBackbone
from vispe.models.detr.backbone.vit_pyramid import SimpleFeaturePyramid
from vispe.models.detr.neck.multiscale import InputProjection, MultiScaleCNN, MultiScaleResNet, masked_group_norm
from vispe.models.vit import create_vit


def alone_and_padded(stride, seed=0):
    """A non-square image (3 x 5 coarsest cells) alone, and padded at the bottom / right into a batch."""
    g = torch.Generator().manual_seed(seed)
    h, w = 3 * stride, 5 * stride
    img = torch.randn(1, 3, h, w, generator=g)
    H, W = h + 2 * stride, w + stride
    batch = torch.randn(2, 3, H, W, generator=g)
    batch[0] = 7.0  # padding content that must not matter
    batch[0, :, :h, :w] = img[0]
    mask = torch.zeros(2, H, W, dtype=torch.bool)
    mask[0, h:], mask[0, :, w:] = True, True
    return (img, torch.zeros(1, h, w, dtype=torch.bool)), (batch, mask)


def level_errors(net, stride):
    (img, m1), (batch, m2) = alone_and_padded(stride)
    with torch.no_grad():
        alone, padded = net.eval()(img, m1), net(batch, m2)
    errs = []
    for (a, ma), (p, mp) in zip(alone, padded):
        h, w = a.shape[-2:]
        assert not ma.any() and mp[0, :h, :w].logical_not().all() and mp[0].sum() == mp[0].numel() - h * w
        errs.append((a[0] - p[0, :, :h, :w]).abs().max().item())
    return errs


def test_masked_group_norm_is_group_norm_of_the_valid_area():
    gn = nn.GroupNorm(4, 16)
    nn.init.normal_(gn.weight)
    nn.init.normal_(gn.bias)
    x = torch.randn(2, 16, 6, 10)
    none = torch.zeros(2, 6, 10, dtype=torch.bool)
    torch.testing.assert_close(masked_group_norm(x, none, gn), gn(x), rtol=0, atol=1e-5)
    mask = none.clone()
    mask[1, 4:], mask[1, :, 7:] = True, True
    out = masked_group_norm(x, mask, gn)
    torch.testing.assert_close(out[1, :, :4, :7], gn(x[1:, :, :4, :7])[0], rtol=0, atol=1e-5)
    assert out[1][:, mask[1]].abs().max() == 0


def test_resnet_levels_strides_channels_and_masks():
    net = MultiScaleResNet("resnet18")
    assert net.strides == [8, 16, 32] and net.num_channels == [128, 256, 512]
    assert MultiScaleResNet("resnet50", layers=(4,), dilation=True).strides == [16]
    x, mask = torch.randn(1, 3, 64, 96), torch.zeros(1, 64, 96, dtype=torch.bool)
    mask[:, 32:] = True
    outs = net(x, mask)
    assert [tuple(f.shape[-2:]) for f, _ in outs] == [(8, 12), (4, 6), (2, 3)]
    for f, m in outs:
        assert torch.equal(m, resize_mask(mask, f.shape[-2:]))
    with pytest.raises(ValueError, match="layers"):
        MultiScaleResNet("resnet18", layers=(3, 2))


def test_mask_aware_resnet_is_batch_invariant_at_every_level():
    torch.manual_seed(0)
    net = MultiScaleResNet("resnet18", mask_aware=True)
    for bn in net.modules():  # random frozen-BN statistics, so that padding would leak
        if type(bn).__name__ == "FrozenBatchNorm2d":
            bn.bias.normal_(0, 0.5)
            bn.running_mean.normal_(0, 0.5)
    assert max(level_errors(net, 32)) < 1e-4


def test_small_cnn_levels_are_batch_invariant():
    torch.manual_seed(0)
    net = MultiScaleCNN(SmallCNN((8, 16, 16, 32)), num_levels=3)
    assert net.strides == [4, 8, 16] and net.num_channels == [16, 16, 32]
    assert max(level_errors(net, 16)) < 1e-5
    with pytest.raises(ValueError, match="num_levels=5"):
        MultiScaleCNN(num_levels=5)


def test_vit_simple_feature_pyramid_levels_are_batch_invariant():
    torch.manual_seed(0)
    vit = create_vit("vit_pico", pe="sine", patch_size=8, num_classes=0)
    sfp = SimpleFeaturePyramid(ViTBackbone(vit), scales=(4.0, 2.0, 1.0, 0.5), out_channels=16)
    assert sfp.strides == [2, 4, 8, 16] and sfp.num_channels == [16] * 4
    assert max(level_errors(sfp, 16)) < 1e-4
    with pytest.raises(ValueError, match="scales"):
        SimpleFeaturePyramid(ViTBackbone(vit), scales=(1.0, 2.0))


def test_input_projection_levels_names_and_masks():
    proj = InputProjection([16, 32], 64, 4)
    assert [k for k in proj.state_dict() if k.endswith("weight")] == [f"{l}.{i}.weight" for l in range(4) for i in (0, 1)]
    assert proj[2][0].stride == (2, 2) and proj[3][0].in_channels == 64 and proj[2][0].in_channels == 32
    mask = torch.zeros(2, 64, 96, dtype=torch.bool)
    mask[1, 40:] = True
    feats = [(torch.randn(2, 16, 16, 24), resize_mask(mask, (16, 24))), (torch.randn(2, 32, 8, 12), resize_mask(mask, (8, 12)))]
    maps, masks = proj(feats, mask)
    assert [tuple(m.shape[-2:]) for m in maps] == [(16, 24), (8, 12), (4, 6), (2, 3)]
    assert torch.equal(masks[3], resize_mask(mask, (2, 3)))
    with pytest.raises(ValueError, match="d_model=48"):
        InputProjection([16], 48, 1)
    with pytest.raises(ValueError, match="num_levels=1"):
        InputProjection([16, 32], 64, 1)


def test_build_multiscale_backbone_levels_and_refusals():
    from vispe.models.detr.neck.multiscale import backbone_levels, build_multiscale_backbone as build
    assert [backbone_levels(n) for n in (1, 2, 3, 4, 5)] == [1, 2, 3, 3, 3]
    assert build("resnet18", 4).strides == [8, 16, 32] and build("resnet18", 1).strides == [32]
    assert build("small_cnn", 4, widths=(8, 8, 8, 8)).strides == [4, 8, 16]
    assert build("vit_pico", 4, kwargs=dict(patch_size=8)).strides == [4, 8, 16]
    ready = MultiScaleCNN(num_levels=2)
    assert build(ready, 2) is ready
    with pytest.raises(ValueError, match="takes 3"):
        build(ready, 4)
    with pytest.raises(ValueError, match="backbone_weights"):
        build("small_cnn", 4, weights="w.pth")
    with pytest.raises(ValueError, match="backbone_widths"):
        build("resnet18", 4, widths=(8, 8))
