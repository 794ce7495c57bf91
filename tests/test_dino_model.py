"""DINO on the one detector (create_detr(attention="deformable", decoder="dino")): the model takes the
targets in training and returns the denoising outputs beside the matching ones, needs none in eval,
the matching queries' outputs do not depend on the denoising groups, train.py passes the targets and the
criterion adds the denoising terms. The parts' equality with IDEA-Research/DINO: test_dino_parts.py and
test_dino_decoder.py; every accepted configuration's gradients and an image alone = padded:
test_deformable_designs.py."""
import math
from pathlib import Path

import pytest
import torch
from test_deformable_encoder import perturb

from vispe.models.detr import HungarianMatcher, SetCriterion, create_detr
from vispe.train import config as C
from vispe.train.tasks import get_task

ROOT = Path(__file__).resolve().parents[1]
TINY = dict(backbone="small_cnn", backbone_widths=(8, 8, 16), d_model=32, nheads=2, enc_layers=1, dec_layers=2,
            dim_feedforward=32, num_queries=4, dropout=0.0, attention="deformable", num_feature_levels=2,
            backbone_levels=1, n_points=2, decoder="dino")
TARGETS = [{"boxes": torch.tensor([[0.3, 0.4, 0.2, 0.3], [0.7, 0.6, 0.2, 0.2]]), "labels": torch.tensor([0, 2])},
           {"boxes": torch.tensor([[0.5, 0.5, 0.4, 0.3]]), "labels": torch.tensor([1])}]


def model_and_images(**kw):
    torch.manual_seed(0)
    model = perturb(create_detr(3, **{**TINY, **kw}))
    return model, torch.randn(2, 3, 48, 64)


def test_the_denoising_groups_leave_the_matching_queries_alone():
    model, images = model_and_images(decoder_kwargs=dict(dn_number=2))
    model.train()  # dropout 0: training with targets differs from without only by the groups
    with torch.no_grad():
        with_dn, without = model(images, targets=TARGETS), model(images)
    assert "dn_outputs" in with_dn and "dn_outputs" not in without
    meta = with_dn["dn_outputs"]["meta"]
    assert meta == {"num_groups": 4, "single_pad": 2}  # 2 * dn_number groups (the reference's rule below 50)
    assert with_dn["dn_outputs"]["pred_boxes"].shape == (2, 2 * 4 * 2, 4)
    for k in ("pred_logits", "pred_boxes"):
        torch.testing.assert_close(with_dn[k], without[k], rtol=0, atol=1e-5)
        for a, b in zip(with_dn["aux_outputs"], without["aux_outputs"]):
            torch.testing.assert_close(a[k], b[k], rtol=0, atol=1e-5)
        torch.testing.assert_close(with_dn["enc_outputs"][k], without["enc_outputs"][k], rtol=0, atol=1e-5)


def test_eval_needs_no_targets_and_ignores_them():
    model, images = model_and_images()
    model.eval()
    with torch.no_grad():
        a, b = model(images, targets=TARGETS), model(images)
    assert "dn_outputs" not in a
    for k in ("pred_logits", "pred_boxes"):
        assert torch.equal(a[k], b[k])


def test_the_criterion_adds_the_denoising_terms_per_layer():
    model, images = model_and_images(decoder_kwargs=dict(dn_number=2))
    crit = SetCriterion(3, HungarianMatcher(2.0, 5.0, 2.0, focal_alpha=0.25), focal_alpha=0.25, weight_ce=1.0)
    out = model.train()(images, targets=TARGETS)
    losses = crit(out, TARGETS)
    dn = {k for k in losses if "_dn" in k}
    assert dn == {f"{n}_dn{s}" for n in ("loss_ce", "loss_bbox", "loss_giou") for s in ("", "_0")}
    rest = crit({k: v for k, v in out.items() if k != "dn_outputs"}, TARGETS)
    extra = sum(crit.weights[k.split("_dn")[0]] * losses[k] for k in dn)
    torch.testing.assert_close(losses["loss"], rest["loss"] + extra)
    assert "loss_ce_enc" in losses  # the selected proposals, with the true classes (DINO's interm loss)
    with pytest.raises(ValueError, match="focal_alpha"):
        SetCriterion(4, HungarianMatcher())({**out, "class_head": "softmax"}, TARGETS)


def test_train_py_passes_the_targets_in_training_only():
    cfg = C.load_config(ROOT / "configs/shapes_dino.yaml", ["detr.d_model=32", "detr.nheads=2", "detr.num_queries=4",
                                                            "detr.dim_feedforward=32", "detr.enc_layers=1",
                                                            "detr.dec_layers=2", "detr.num_feature_levels=2",
                                                            "detr.n_points=2"])
    task = get_task(cfg.task)
    model = task.model(cfg, task.info(cfg), 64)
    mask = torch.zeros(2, 48, 64, dtype=torch.bool)
    batch = (torch.randn(2, 3, 48, 64), mask, TARGETS)
    _, losses, _ = task._forward(model.train(), batch, "cpu")
    assert "loss_ce_dn" in losses and torch.isfinite(losses["loss"])
    with torch.no_grad():
        _, losses, _ = task._forward(model.eval(), batch, "cpu")
    assert "loss_ce_dn" not in losses


def test_dinos_heads_and_initialisation():
    torch.manual_seed(0)
    model = create_detr(3, **TINY)
    q = model.queries
    assert model.class_embed[0] is model.class_embed[1] and model.bbox_embed[0] is model.bbox_embed[1]  # shared
    assert q.enc_class is not model.class_embed[0] and q.enc_box is not model.bbox_embed[0]  # the proposals' own
    for head in (q.enc_class, model.class_embed[0]):
        torch.testing.assert_close(head.bias, torch.full((3,), -math.log(99.0)))  # the focal prior 0.01
    assert not q.enc_box.layers[-1].weight.any() and not q.enc_box.layers[-1].bias.any()
    assert model.decoder.norm is not None and q.look_forward_twice and q.tgt_embed is None
    assert q.selection.tgt_embed.weight.shape == (4, 32) and q.label_enc.weight.shape == (4, 32)
