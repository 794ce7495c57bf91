"""vispe's RT-DETR (``vispe.models.detr.realtime``) against transformers' RTDetrForObjectDetection, built from a
small config with random weights, every parameter and batch-norm statistic perturbed, num_queries=30, on a
non-square batch: eval logits / boxes / auxiliary / encoder outputs, training with denoising (both sides
seeded alike: transformers' noise draws are reproduced), other sizes, eval_size, and the loader's refusals.
The max abs differences are printed (``pytest -s``)."""
import pytest
import torch
from test_deformable_encoder import perturb
from transformers import RTDetrConfig, RTDetrForObjectDetection

from vispe.models.detr import load_detr
from vispe.models.detr.realtime import RTDETR, load_rtdetr
from vispe.models.detr.realtime.criterion import RealtimeCriterion

ATOL = 1e-4


def config(**kw):
    backbone = dict(model_type="rt_detr_resnet", embedding_size=16, hidden_sizes=[32, 64, 128, 256],
                    depths=[1, 1, 2, 1], out_indices=[2, 3, 4])
    return RTDetrConfig(**{**dict(backbone_config=backbone, encoder_in_channels=[64, 128, 256], encoder_hidden_dim=32,
                                  d_model=32, encoder_attention_heads=4, decoder_attention_heads=4, encoder_ffn_dim=64,
                                  decoder_ffn_dim=64, decoder_layers=3, num_queries=30, num_labels=5,
                                  decoder_in_channels=[32, 32, 32], num_denoising=20), **kw})


def reference(seed=0, **kw):
    return perturb(RTDetrForObjectDetection(config(**kw)), seed=seed).eval()


def images(H=96, W=128, seed=1):
    return torch.randn(2, 3, H, W, generator=torch.Generator().manual_seed(seed))


def diff(a, b):
    return (a - b).abs().max().item()


def train_both(hf, ours, x, boxes, labels, seed):
    """transformers' and vispe's model in training mode on the same images and targets, each called after
    ``torch.manual_seed(seed)`` so that the denoising noise is drawn alike: (transformers' output, vispe's)."""
    hf.train()
    ours.train()
    torch.manual_seed(seed)
    want = hf(pixel_values=x, labels=[{"class_labels": c, "boxes": b} for c, b in zip(labels, boxes)])
    torch.manual_seed(seed)
    got = ours(x, targets=[{"labels": c, "boxes": b} for c, b in zip(labels, boxes)])
    return want, got


def check_eval(ours, hf, x, name, num_aux=2):
    with torch.no_grad():
        want, got = hf(pixel_values=x), ours.eval()(x)
    assert want.logits.abs().max() > 0.5 and want.pred_boxes.std(1).min() > 1e-3  # queries differ
    errs = {"logits": diff(got["pred_logits"], want.logits), "boxes": diff(got["pred_boxes"], want.pred_boxes)}
    for i, aux in enumerate(got["aux_outputs"]):
        errs[f"aux{i}_logits"] = diff(aux["pred_logits"], want.intermediate_logits[:, i])
        errs[f"aux{i}_boxes"] = diff(aux["pred_boxes"], want.intermediate_reference_points[:, i])
    errs["enc_logits"] = diff(got["enc_outputs"]["pred_logits"], want.enc_topk_logits)
    errs["enc_boxes"] = diff(got["enc_outputs"]["pred_boxes"], want.enc_topk_bboxes)
    print(f"\nRT-DETR parity ({name}, {tuple(x.shape)}): max abs diff " + ", ".join(f"{k} {v:.1e}" for k, v in errs.items()))
    assert len(got["aux_outputs"]) == want.intermediate_logits.shape[1] - 1 == num_aux
    assert max(errs.values()) < ATOL, errs


def test_eval_outputs_equal_transformers_loaded_from_the_model():
    hf = reference()
    ours = load_detr(hf)
    assert isinstance(ours, RTDETR)
    check_eval(ours, hf, images(), "model")


def test_state_dict_with_config_loads_the_same_model():
    hf = reference(seed=3)
    check_eval(load_rtdetr(hf.state_dict(), hf.config), hf, images(), "state_dict + config")
    check_eval(load_detr(hf.state_dict(), hf.config), hf, images(), "load_detr(state_dict, config)")


@pytest.mark.parametrize("H, W", [(128, 64), (64, 160)])
def test_other_non_square_sizes_equal_transformers(H, W):
    """transformers (eval_size None) computes AIFI's table and the anchors at the input's size: so does vispe."""
    hf = reference(seed=2)
    check_eval(load_detr(hf), hf, images(H, W), f"size {H}x{W}")


def test_eval_size_set_vispe_keeps_the_position_transformers_drops_it():
    hf_eval_size = reference(seed=4, eval_size=640)
    ours = load_detr(hf_eval_size)
    same = RTDetrForObjectDetection(config()).eval()  # the same weights, eval_size None: position at the input's size
    same.load_state_dict(hf_eval_size.state_dict())
    check_eval(ours, same, images(), "eval_size set, against eval_size None")
    with torch.no_grad():
        dropped = hf_eval_size(pixel_values=images()).logits
        got = ours(images())["pred_logits"]
    assert diff(got, dropped) > 10 * ATOL  # transformers in eval with eval_size: AIFI without position (6.5e-3)


def test_training_with_denoising_equals_transformers_seeded_alike():
    hf = reference(seed=5)
    ours = load_detr(hf)
    x = images()
    boxes = [torch.tensor([[0.3, 0.4, 0.2, 0.3], [0.6, 0.5, 0.3, 0.2], [0.5, 0.7, 0.4, 0.3]]),
             torch.tensor([[0.5, 0.5, 0.4, 0.4]])]
    labels = [torch.tensor([1, 3, 0]), torch.tensor([4])]
    want, got = train_both(hf, ours, x, boxes, labels, seed=11)
    meta = want.denoising_meta_values
    P = meta["dn_num_split"][0]
    assert got["dn_meta"].pad_size == P == 2 * 6 * 3 and got["dn_meta"].num_groups == meta["dn_num_group"]
    for g, w in zip(got["dn_meta"].positive, meta["dn_positive_idx"]):
        assert torch.equal(g, w)
    errs = {"logits": diff(got["pred_logits"], want.logits[:, P:]), "boxes": diff(got["pred_boxes"], want.pred_boxes[:, P:])}
    for i, dn in enumerate(got["dn_outputs"]):
        errs[f"dn{i}_logits"] = diff(dn["pred_logits"], want.intermediate_logits[:, i, :P])
        errs[f"dn{i}_boxes"] = diff(dn["pred_boxes"], want.intermediate_reference_points[:, i, :P])
    print("\nRT-DETR training with denoising: max abs diff " + ", ".join(f"{k} {v:.1e}" for k, v in errs.items()))
    assert max(errs.values()) < ATOL, errs
    # the loss: VFL + L1 + GIoU on every layer, the encoder's top-k and the denoising groups (transformers' RTDetrLoss)
    losses = RealtimeCriterion(5)(got, [{"labels": c, "boxes": b} for c, b in zip(labels, boxes)])
    L = len(got["aux_outputs"])
    names = {"loss_vfl": "loss_ce", **{f"{t}_aux_{i}": f"{t.replace('vfl', 'ce')}_{i}" for t in ("loss_vfl", "loss_bbox", "loss_giou")
                                       for i in range(L)}}
    names.update({f"{t}_aux_{L}": f"{t.replace('vfl', 'ce')}_enc" for t in ("loss_vfl", "loss_bbox", "loss_giou")})
    weights = {"loss_vfl": 1.0, "loss_bbox": 5.0, "loss_giou": 2.0}
    for k, v in want.loss_dict.items():
        ours = losses[names.get(k, k.replace("loss_vfl", "loss_ce"))]
        w = weights[next(t for t in weights if k.startswith(t))]
        torch.testing.assert_close(ours * w, v, rtol=0, atol=ATOL, msg=k)
    assert len(want.loss_dict) == len(losses) - 1 == 3 * (L + 2 + len(got["dn_outputs"]))
    print(f"RT-DETR loss: vispe {losses['loss'].item():.6f}, transformers {want.loss.item():.6f}")
    torch.testing.assert_close(losses["loss"], want.loss, rtol=0, atol=ATOL)


def test_loader_refuses_what_it_does_not_build():
    hf = reference()
    with pytest.raises(ValueError, match="without its configuration"):
        load_rtdetr(hf.state_dict())
    with pytest.raises(ValueError, match="normalize_before"):
        load_rtdetr(hf.state_dict(), config(normalize_before=True))
    basic = config(backbone_config=dict(model_type="rt_detr_resnet", layer_type="basic", embedding_size=16,
                                        hidden_sizes=[16, 32, 64, 128], depths=[1, 1, 1, 1], out_indices=[2, 3, 4]))
    with pytest.raises(ValueError, match="layer_type='basic'"):
        load_rtdetr(RTDetrForObjectDetection(basic))
    state = dict(hf.state_dict())
    state.pop("model.decoder.query_pos_head.layers.0.bias")
    with pytest.raises(ValueError, match="missing.*query_pos_head"):
        load_rtdetr(state, hf.config)


def test_backbone_equals_transformers_rtdetr_resnet_stage_by_stage():
    hf = reference(seed=6)
    ours = load_detr(hf)
    x = images()
    with torch.no_grad():
        want = hf.model.backbone.model(x).feature_maps
        got = ours.backbone(x)
    assert len(got) == len(want) == 3
    for g, w in zip(got, want):
        assert g.shape == w.shape and w.abs().max() > 0.1
        torch.testing.assert_close(g, w, rtol=0, atol=1e-5)


@pytest.mark.parametrize("method", ["default", "discrete"])
def test_rtdetr_v2_equals_transformers(method):
    """RT-DETRv2 (offset scale, discrete sampling): eval parity, and training with denoising seeded alike."""
    from transformers import RTDetrV2Config, RTDetrV2ForObjectDetection
    cfg = RTDetrV2Config(**{**config().to_dict(), "model_type": "rt_detr_v2", "decoder_method": method,
                            "decoder_offset_scale": 0.7})
    hf = perturb(RTDetrV2ForObjectDetection(cfg), seed=9).eval()
    with torch.no_grad():  # a constant buffer (1 / points), not a weight: perturb changed it
        for layer in hf.model.decoder.layers:
            layer.encoder_attn.n_points_scale.fill_(1.0 / cfg.decoder_n_points)
    ours = load_detr(hf)
    check_eval(ours, hf, images(), f"RT-DETRv2 {method}")
    check_eval(load_detr(hf.state_dict(), hf.config), hf, images(64, 160), f"RT-DETRv2 {method}, state_dict")


def test_padded_images_get_boxes_in_their_own_units():
    """RT-DETR's boxes are in units of the padded canvas; with a padding mask vispe divides them by each image's
    valid fraction (the targets' and COCO's units). Padding of 8 of 128 columns leaves AIFI's stride-32 grid
    unpadded, so the network's numbers are the same and only the units change."""
    ours = load_detr(reference(seed=13)).eval()
    x = images()
    mask = torch.zeros(2, 96, 128, dtype=torch.bool)
    mask[1, :, 120:] = True
    with torch.no_grad():
        plain, padded = ours(x), ours(x, mask)
    torch.testing.assert_close(padded["pred_boxes"][0], plain["pred_boxes"][0], rtol=0, atol=0)
    scale = torch.tensor([120 / 128, 1.0, 120 / 128, 1.0])
    torch.testing.assert_close(padded["pred_boxes"][1], plain["pred_boxes"][1] / scale, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(padded["enc_outputs"]["pred_boxes"][1], plain["enc_outputs"]["pred_boxes"][1] / scale,
                               rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(padded["pred_logits"], plain["pred_logits"], rtol=0, atol=0)
