"""The hooks the next detectors plug into (DINO: denoising groups, look-forward-twice, shared heads), on both
operators: a query strategy's extra queries run first in the decoder behind their self-attention mask and come
back as ``dn_outputs``; the matching queries cannot see them; look-forward-twice lets layer i + 1's boxes reach
layer i's refinement."""
import types

import pytest
import torch

from vispe.models.detr import create_detr
from vispe.models.detr.queries.positioned import ExtraQueries

DENSE = dict(backbone="small_cnn", backbone_widths=(4, 8, 8, 16), d_model=16, nheads=2, enc_layers=1, dec_layers=2,
             dim_feedforward=16, num_queries=3, dropout=0.0, decoder="dab")
DEFORMABLE = dict(backbone="small_cnn", backbone_widths=(4, 8, 8), d_model=32, nheads=2, enc_layers=1, dec_layers=2,
                  dim_feedforward=32, num_queries=3, dropout=0.0, attention="deformable", num_feature_levels=2,
                  backbone_levels=1, n_points=2, decoder="dab")
D, Q = 2, 3


def _with_groups(model, blocked: bool = True):
    """Give the model's strategy two denoising queries built from the targets (DINO's mask: the matching
    queries may not see them)."""
    d = model.queries.d_model

    def extra_queries(self, targets, B, width, dtype, device):
        assert width == d
        if targets is None:
            return None
        g = torch.Generator().manual_seed(5)
        boxes = torch.stack([t["boxes"][:D] for t in targets])  # (B, D, 4)
        mask = torch.zeros(D + Q, D + Q, dtype=torch.bool)
        if blocked:
            mask[D:, :D] = True  # matching queries may not attend to the denoising ones
        return ExtraQueries(torch.randn(B, D, d, generator=g), boxes, mask, {"pad_size": D})

    model.queries.extra_queries = types.MethodType(extra_queries, model.queries)
    return model


def _targets():
    return [{"labels": torch.tensor([0, 1]), "boxes": torch.tensor([[0.3, 0.4, 0.2, 0.3], [0.6, 0.5, 0.3, 0.2]])},
            {"labels": torch.tensor([2, 1]), "boxes": torch.tensor([[0.5, 0.5, 0.4, 0.4], [0.2, 0.7, 0.1, 0.2]])}]


def _perturb(model):
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.05 * torch.randn_like(p))
    return model


@pytest.mark.parametrize("kw", [DENSE, DEFORMABLE], ids=["dense", "deformable"])
def test_extra_queries_run_first_behind_their_mask_and_come_back_as_dn_outputs(kw):
    torch.manual_seed(0)
    model = _perturb(_with_groups(create_detr(3, **kw))).train()
    images = torch.randn(2, 3, 32, 48)
    plain = model(images)  # no targets: no extra queries
    assert "dn_outputs" not in plain
    out = model(images, targets=_targets())
    dn = out["dn_outputs"]
    assert dn["meta"] == {"pad_size": D}
    assert dn["pred_logits"].shape == (2, D, 3) and out["pred_logits"].shape == (2, Q, 3)
    assert len(dn["aux_outputs"]) == len(out["aux_outputs"]) == 1
    for key in ("pred_logits", "pred_boxes"):  # the matching queries cannot see the denoising ones
        torch.testing.assert_close(out[key], plain[key], atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(out["aux_outputs"][0][key], plain["aux_outputs"][0][key], atol=1e-5, rtol=1e-5)
    open_ = _with_groups(model, blocked=False)(images, targets=_targets())  # without the mask they do
    assert (open_["pred_logits"] - plain["pred_logits"]).abs().max() > 1e-4
    # the denoising queries start at their anchors: layer 0's boxes are the head's output on those boxes
    assert torch.isfinite(dn["pred_boxes"]).all()
    assert "dn_outputs" not in model.eval()(images, targets=_targets())  # training only


def test_extra_queries_are_checked_against_the_matching_ones():
    torch.manual_seed(0)
    model = create_detr(3, **DEFORMABLE).train()

    def wrong(self, targets, B, width, dtype, device):
        return ExtraQueries(torch.zeros(B, D, width), torch.zeros(B, D, 4), torch.zeros(D, D, dtype=torch.bool))

    model.queries.extra_queries = types.MethodType(wrong, model.queries)
    with pytest.raises(ValueError, match=r"attn_mask is torch.bool \(2, 2\): expected bool \(5, 5\)"):
        model(torch.randn(2, 3, 32, 48), targets=_targets())


@pytest.mark.parametrize("kw", [DENSE, dict(DEFORMABLE, decoder_kwargs=dict(formulation="legacy"))],
                         ids=["dense", "deformable per-layer heads"])
def test_look_forward_twice_lets_the_next_layers_boxes_reach_this_layers_refinement(kw):
    """The final boxes' loss alone: without look-forward-twice the refinement after layer 0 is detached and
    the box head's use there gets no gradient from it; with it (DINO), it does."""
    grads = {}
    for lft in (False, True):
        torch.manual_seed(0)
        dk = {**kw.get("decoder_kwargs", {}), "look_forward_twice": lft}
        model = _perturb(create_detr(3, **{**kw, "decoder_kwargs": dk})).train()
        head = model.bbox_embed if isinstance(model.bbox_embed, torch.nn.Module) and not isinstance(
            model.bbox_embed, torch.nn.ModuleList) else model.bbox_embed[0]
        out = model(torch.randn(2, 3, 32, 48))
        # the gradient of the final boxes with respect to head 0's output on layer 0's queries
        grads[lft] = torch.autograd.grad(out["pred_boxes"].sum(), head.layers[-1].bias, allow_unused=True)[0]
    if isinstance(create_detr(3, **kw).bbox_embed, torch.nn.ModuleList):  # per-layer heads: head 0 only refines
        assert grads[False] is None or grads[False].abs().max() == 0
        assert grads[True].abs().max() > 0
    else:  # a shared head: the final boxes reach it anyway, and look-forward-twice adds the refinement's path
        assert (grads[True] - grads[False]).abs().max() > 0


def test_look_forward_twice_needs_refinement():
    with pytest.raises(ValueError, match=r"look_forward_twice'\]=True with iter_refine=False"):
        create_detr(3, **{**DEFORMABLE, "decoder_kwargs": dict(look_forward_twice=True, iter_refine=False)})
