"""D-FINE's losses (``vispe.models.detr.realtime.dfine_loss`` through ``RealtimeCriterion``) against transformers'
``DFineLoss`` on the same outputs and targets: transformers' D-FINE from a small config with random weights,
every parameter perturbed (``up`` and ``reg_scale`` included), run in training with labels (denoising on);
its layers' logits, boxes, edge distributions and initial boxes, its encoder's top-k and its denoising
layers go to both criteria, matched by transformers' matcher in both. Every term of every layer (VFL, L1,
GIoU, FGL, DDF) agrees within 1e-5. Then vispe's own D-FINE (loaded from the same model) gives the same
distributions and initial boxes in its output dicts, and its loss trains."""
from types import SimpleNamespace

import pytest
import torch
from test_dfine import reference
from test_rtdetr import images
from transformers.loss.loss_d_fine import DFineLoss

from vispe.models.detr import load_detr
from vispe.models.detr.realtime.criterion import RealtimeCriterion
from vispe.models.detr.realtime.dfine_loss import edge_bins

BOXES = [torch.tensor([[0.3, 0.4, 0.2, 0.3], [0.6, 0.5, 0.3, 0.2], [0.2, 0.7, 0.1, 0.15]]),
         torch.tensor([[0.5, 0.5, 0.4, 0.4]])]
LABELS = [torch.tensor([1, 3, 0]), torch.tensor([4])]
HF_TARGETS = [{"class_labels": c, "boxes": b} for c, b in zip(LABELS, BOXES)]
TARGETS = [{"labels": c, "boxes": b} for c, b in zip(LABELS, BOXES)]
#: vispe's names of transformers' terms
NAMES = {"loss_vfl": "loss_ce", "loss_bbox": "loss_bbox", "loss_giou": "loss_giou", "loss_fgl": "loss_fgl",
         "loss_ddf": "loss_ddf"}


class Replay(torch.nn.Module):
    """vispe's matcher interface around transformers' matcher: both criteria match alike."""

    def __init__(self, hf_matcher):
        super().__init__()
        self.hf = hf_matcher

    def forward(self, out, targets):
        return self.hf({"logits": out["pred_logits"], "pred_boxes": out["pred_boxes"]}, HF_TARGETS)


@pytest.fixture(scope="module")
def trained_outputs():
    hf = reference(seed=3).train()
    frozen_batchnorm(hf)
    torch.manual_seed(7)
    o = hf(pixel_values=images(), labels=HF_TARGETS)
    P = o.denoising_meta_values["dn_num_split"][0]
    return hf, o, P


def frozen_batchnorm(model):
    """Training mode with BatchNorm on its running statistics (a batch of 2 makes batch statistics' rounding
    the larger part of the difference: tests/test_dfine.py)."""
    for m in model.modules():
        if isinstance(m, torch.nn.modules.batchnorm._BatchNorm):
            m.eval()
    return model


def layers(o, q):
    """Per layer of transformers' outputs (queries ``q``), aligned: its logits, boxes, distributions, b0."""
    L = o.intermediate_predicted_corners.shape[1]
    pre = {"pred_logits": o.intermediate_logits[:, 0, q], "pred_boxes": o.intermediate_reference_points[:, 0, q]}
    return [pre] + [{"pred_logits": o.intermediate_logits[:, i + 1, q],
                     "pred_boxes": o.intermediate_reference_points[:, i + 1, q],
                     "pred_corners": o.intermediate_predicted_corners[:, i, q],
                     "ref_points": o.initial_reference_points[:, i, q]} for i in range(L)]


def test_every_term_of_every_layer_equals_transformers(trained_outputs):
    hf, o, P = trained_outputs
    crit = DFineLoss(hf.config)
    # transformers' loss reads up and reg_scale from the config, its model from its (here perturbed) parameters;
    # the original D-FINE's loss and vispe's read the model's
    crit.up, crit.reg_scale = hf.model.decoder.up, hf.model.decoder.reg_scale
    main, dn = layers(o, slice(P, None)), layers(o, slice(None, P))
    enc = {"pred_logits": o.enc_topk_logits, "pred_boxes": o.enc_topk_bboxes}
    meta = o.denoising_meta_values
    num_boxes = sum(len(b) for b in BOXES)
    want = {}

    def hf_terms(out, suffix, teacher, indices, norm):
        d = {"logits": out["pred_logits"], "pred_boxes": out["pred_boxes"]}
        if "pred_corners" in out:
            d.update(pred_corners=out["pred_corners"], ref_points=out["ref_points"],
                     teacher_corners=teacher["pred_corners"], teacher_logits=teacher["pred_logits"])
        for loss in crit.losses:
            for k, v in crit.get_loss(loss, d, HF_TARGETS, indices, norm).items():
                want[NAMES[k] + suffix] = v.item() * 1.0  # transformers' terms unweighted, as vispe's
    for i, out in enumerate([main[-1], *main[:-1]]):
        hf_terms(out, "" if i == 0 else f"_{i - 1}", main[-1], crit.matcher(
            {"logits": out["pred_logits"], "pred_boxes": out["pred_boxes"]}, HF_TARGETS), num_boxes)
    hf_terms(enc, "_enc", None, crit.matcher({"logits": enc["pred_logits"], "pred_boxes": enc["pred_boxes"]},
                                             HF_TARGETS), num_boxes)
    for i, out in enumerate(dn):
        hf_terms(out, f"_dn_{i}", dn[-1], crit.get_cdn_matched_indices(meta, HF_TARGETS),
                 num_boxes * meta["dn_num_group"])

    ours = RealtimeCriterion(5, Replay(crit.matcher))
    outputs = {**main[-1], "aux_outputs": main[:-1], "enc_outputs": enc, "dn_outputs": dn,
               "dn_meta": SimpleNamespace(positive=meta["dn_positive_idx"], num_groups=meta["dn_num_group"]),
               "up": hf.model.decoder.up, "reg_scale": hf.model.decoder.reg_scale}
    got = {k: v.item() for k, v in ours(outputs, TARGETS).items() if k != "loss"}
    assert sorted(got) == sorted(want)
    assert sum(k.startswith("loss_fgl") for k in got) == 2 * 3 and sum(k.startswith("loss_ddf") for k in got) == 6
    errs = {k: abs(got[k] - want[k]) for k in want}
    print("\nD-FINE loss terms, max abs diff vs transformers' DFineLoss: "
          f"{max(errs.values()):.1e} ({max(errs, key=errs.get)}); FGL {got['loss_fgl']:.5f}, DDF_1 {got['loss_ddf_1']:.5f}")
    assert max(errs.values()) < 1e-5, errs
    assert got["loss_ddf"] == 0 and got["loss_ddf_1"] > 0 and got["loss_ddf_dn_1"] > 0  # the teacher's own is 0
    total = sum(ours.weights[k.split("_")[0] + "_" + k.split("_")[1]] * v for k, v in got.items())
    assert abs(ours(outputs, TARGETS)["loss"].item() - total) < 1e-4 * total


def test_edge_bins_hit_the_distance_they_encode():
    """The two-bin target's expectation under W(n) is the edge's distance (inside W's range), clamped outside."""
    from vispe.models.detr.realtime.dfine_decoder import distance_to_box, weighting_function

    up, s, N = torch.tensor([0.5]), torch.tensor([4.0]), 32
    ref = torch.tensor([[0.5, 0.5, 0.2, 0.3], [0.4, 0.6, 0.1, 0.1]])
    target = torch.tensor([[0.52, 0.47, 0.25, 0.28], [0.4, 0.6, 0.9, 0.9]])  # the second far outside W's range
    left, wl, wr = edge_bins(ref, target, up, s, N)
    W = weighting_function(N, up, s)
    d = (W[left] * wl + W[left + 1] * wr).view(2, 4)
    torch.testing.assert_close(distance_to_box(ref[:1], d[:1], s), target[:1], atol=1e-6, rtol=0)
    assert (left[4:] == N - 1).all() and (wr[4:] == 1).all()  # past W(N): all weight on the last bin


def test_vispe_dfine_outputs_carry_the_distributions_and_its_loss_trains(trained_outputs):
    hf, o, P = trained_outputs
    ours = frozen_batchnorm(load_detr(hf).train())
    torch.manual_seed(7)
    got = ours(images(), targets=TARGETS)
    main = [*got["aux_outputs"], got]
    assert "pred_corners" not in main[0]  # the pre-box head's entry
    tol = 1e-4 * max(1.0, o.intermediate_predicted_corners.abs().max().item())
    for i, out in enumerate(main[1:]):
        torch.testing.assert_close(out["pred_corners"], o.intermediate_predicted_corners[:, i, P:], atol=tol, rtol=0)
        torch.testing.assert_close(out["ref_points"], o.initial_reference_points[:, i, P:], atol=1e-4, rtol=0)
        torch.testing.assert_close(got["dn_outputs"][i + 1]["pred_corners"], o.intermediate_predicted_corners[:, i, :P],
                                   atol=tol, rtol=0)
    losses = RealtimeCriterion(5)(got, TARGETS)
    assert torch.isfinite(losses["loss"]) and losses["loss_fgl_1"] > 0 and losses["loss_ddf_dn_1"] > 0
    losses["loss"].backward()
    assert ours.decoder.bbox_embed[0].layers[-1].weight.grad.abs().sum() > 0
