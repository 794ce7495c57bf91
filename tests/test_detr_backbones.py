"""Detector backbones: a vispe ViT inside DETR, and the mask-aware ResNet (issue 26)."""
import pytest
import torch

from vispe.models.detr import create_detr
from vispe.models.detr.backbone.vit import ViTBackbone
from vispe.models.vit import create_vit

SMALL = dict(d_model=32, nheads=4, enc_layers=1, dec_layers=1, dim_feedforward=64, num_queries=5, dropout=0.0)


def _invariance_error(model, stride: int) -> float:
    """Max |difference| of logits and boxes: image alone vs padded (bottom/right) into a larger batch."""
    torch.manual_seed(1)
    h, w = 3 * stride, 5 * stride  # valid size a multiple of the stride, non-square
    img = torch.randn(1, 3, h, w)
    H, W = h + 2 * stride, w + stride
    batch = torch.randn(2, 3, H, W)
    batch[0] = 7.0  # padding content that must not matter
    batch[0, :, :h, :w] = img[0]
    mask = torch.zeros(2, H, W, dtype=torch.bool)
    mask[0, h:, :] = True
    mask[0, :, w:] = True
    model.eval()
    with torch.no_grad():
        alone = model(img, torch.zeros(1, h, w, dtype=torch.bool))
        padded = model(batch, mask)
    return max((alone["pred_logits"][0] - padded["pred_logits"][0]).abs().max().item(),
               (alone["pred_boxes"][0] - padded["pred_boxes"][0]).abs().max().item())


@pytest.mark.parametrize("pe", ["rope_mixed", "sine", "peg"])
def test_vit_backbone_batch_invariance(pe):
    torch.manual_seed(0)
    vit = create_vit("vit_pico", pe=pe, patch_size=8, num_classes=0)
    model = create_detr(3, backbone=vit, pe="sine", **SMALL)
    assert _invariance_error(model, 8) < 1e-4


def test_resnet_mask_aware_invariance_and_leak_without():
    torch.manual_seed(0)
    aware = create_detr(3, backbone="resnet18", backbone_mask_aware=True, **SMALL)
    torch.manual_seed(0)
    plain = create_detr(3, backbone="resnet18", **SMALL)
    plain.load_state_dict(aware.state_dict())
    for m in (aware, plain):  # random frozen-BN statistics and biases, so padding leaks visibly
        for bn in m.backbone.modules():
            if type(bn).__name__ == "FrozenBatchNorm2d":
                bn.bias.normal_(0, 0.5)
                bn.running_mean.normal_(0, 0.5)
    plain.load_state_dict(aware.state_dict())
    assert _invariance_error(aware, 32) < 1e-4
    assert _invariance_error(plain, 32) > 1e-2


def test_vit_backbone_equals_forward_features_non_square():
    torch.manual_seed(0)
    vit = create_vit("vit_pico", pe="rope_mixed", patch_size=4, num_classes=0).eval()
    bb = ViTBackbone(vit).eval()
    x = torch.randn(2, 3, 12, 20)
    mask = torch.zeros(2, 12, 20, dtype=torch.bool)
    with torch.no_grad():
        feats, fmask = bb(x, mask)
        ref = vit.forward_features(x)[:, vit.num_prefix_tokens:]  # (B, N, C)
    h, w = 3, 5
    for y in range(h):
        for xx in range(w):
            assert torch.equal(feats[:, :, y, xx], ref[:, y * w + xx])
    assert fmask.shape == (2, 3, 5) and not fmask.any()
    assert bb.stride == 4 and bb.num_channels == vit.embed_dim


def test_vit_backbone_last_k_sum():
    torch.manual_seed(0)
    vit = create_vit("vit_pico", pe="sine", patch_size=4, num_classes=0).eval()
    x, mask = torch.randn(1, 3, 8, 12), torch.zeros(1, 8, 12, dtype=torch.bool)
    with torch.no_grad():
        feats, _ = ViTBackbone(vit, layers=2)(x, mask)
        outs = vit.forward_intermediates(x, indices=[2, 3], norm=True, intermediates_only=True)
    torch.testing.assert_close(feats, outs[0] + outs[1], rtol=0, atol=1e-6)


def test_gradients_reach_backbone_encoding():
    torch.manual_seed(0)
    model = create_detr(3, backbone="vit_pico", backbone_kwargs=dict(pe="learned_abs", patch_size=8, img_size=32),
                        pe="sine", **SMALL)
    out = model(torch.randn(1, 3, 32, 32), torch.zeros(1, 32, 32, dtype=torch.bool))
    (out["pred_logits"].sum() + out["pred_boxes"].sum()).backward()
    grads = [p.grad for n, p in model.backbone.vit.named_parameters() if "pe" in n.split(".")[0] or "pos" in n]
    assert grads and all(g is not None and g.abs().sum() > 0 for g in grads)
    assert model.config["backbone_kwargs"]["patch_size"] == 8


def test_bad_inputs():
    with pytest.raises(ValueError, match="backbone=Linear"):
        create_detr(3, backbone=torch.nn.Linear(2, 2), **SMALL)
    model = create_detr(3, backbone="vit_pico", backbone_kwargs=dict(patch_size=8), **SMALL)
    with pytest.raises(ValueError, match=r"images: size \(30, 32\).*patch_size"):
        model.backbone(torch.randn(1, 3, 30, 32), torch.zeros(1, 30, 32, dtype=torch.bool))
    vit = create_vit("vit_pico", patch_size=8, num_classes=0)
    vit.patch_embed.proj = None
    with pytest.raises(ValueError, match="patch tokens"):
        ViTBackbone(vit)
    with pytest.raises(ValueError, match="backbone_mask_aware=True"):
        create_detr(3, backbone="small_cnn", backbone_mask_aware=True, **SMALL)
    with pytest.raises(ValueError, match="layers=9"):
        create_detr(3, backbone="vit_pico", backbone_kwargs=dict(layers=9), **SMALL)


def test_train_config_builds_vit_backbone():
    from pathlib import Path
    from types import SimpleNamespace

    from vispe.train.config import load_config
    from vispe.train.detection import DetectionTask

    root = Path(__file__).resolve().parents[1]
    cfg = load_config(root / "configs/shapes_detr_vit.yaml", ["detr.backbone_kwargs.pe=peg", "detr.backbone_kwargs.layers=2"])
    model = DetectionTask(cfg.task).model(cfg, SimpleNamespace(num_classes=5), 64)
    assert isinstance(model.backbone, ViTBackbone) and model.backbone.layers == 2 and model.backbone.stride == 8
    assert type(model.backbone.vit.pe).__name__ == "PEG" or "peg" in repr(model.backbone.vit.pe).lower()
    cfg = load_config(root / "configs/shapes_detr.yaml", ["detr.backbone=resnet18", "detr.backbone_mask_aware=true",
                                                          "detr.backbone_widths=null", "detr.backbone_weights=random"])
    assert DetectionTask(cfg.task).model(cfg, SimpleNamespace(num_classes=5), 64).backbone.mask_aware


def test_small_cnn_refusals_give_each_option_its_reason():
    """issue 41, item 10: backbone_mask_aware=True was refused because small_cnn "is trained from
    scratch"; the reason is that it is mask-aware already."""
    from vispe.models.detr.backbone.cnn import build_backbone

    for opt, value, why in (("mask_aware", True, "it is mask-aware already"),
                            ("weights", "w.pth", "no weights to load"),
                            ("dilation", True, "DC5 is a ResNet option"),
                            ("train_backbone", False, "frozen, it would stay random")):
        with pytest.raises(ValueError, match=why) as e:
            build_backbone("small_cnn", **{opt: value})
        assert ("trained from scratch" in str(e.value)) == (opt in ("weights", "train_backbone"))


def test_the_docs_say_boxrpb_needs_dab_as_the_code_does():
    """issue 41, item 10: the README (now docs/detection.md) offered BoxRPB 'for either positioned design'; Conditional refuses it."""
    from pathlib import Path

    readme = " ".join((Path(__file__).resolve().parents[1] / "docs" / "detection.md").read_text().split())
    assert "for either positioned design, the papers' concatenated spatial part" in readme
    assert "with DAB's anchor boxes only, and/or **BoxRPB**" in readme and "so it refuses one" in readme
    with pytest.raises(ValueError, match="box_bias='boxrpb' with decoder='conditional'"):
        create_detr(3, decoder="conditional", box_bias="boxrpb", **SMALL)
    create_detr(3, decoder="dab", box_bias="boxrpb", **SMALL)  # DAB's anchor boxes take it
