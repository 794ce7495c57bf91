"""``DinoDecoding`` (vispe.models.detr.queries.dn.queries), DINO's query source and decoder loop as one module:
every parameter gets a gradient in training (DDP), eval reads no targets, the matching queries'
outputs do not depend on the denoising groups, and the denoising losses weigh as their namesakes."""
import pytest
import torch
from torch import nn

from vispe.coords import points_at_levels
from vispe.kernels.deformable import Levels, swap_xy
from vispe.models.detr.mlp import MLP
from vispe.models.detr.queries.dn import DinoDecoding, denoising_losses, weighted_total
from vispe.models.detr.queries.positioned import build_anchor_pe
from vispe.models.detr.transformer.deformable_decoder import DeformableDecoderLayer, encoder_proposals

D, K, Q, L = 32, 4, 6, 2
SHAPES = ((4, 6), (2, 3))


class Tiny(nn.Module):
    def __init__(self, **kw):
        super().__init__()
        self.layers = nn.ModuleList([DeformableDecoderLayer(D, 4, 64, 0.0, num_levels=2, num_points=2)
                                     for _ in range(L)])
        self.queries = DinoDecoding(D, Q, K, build_anchor_pe("sine", {}, D), **kw)
        cls, box = nn.Linear(D, K), MLP(D, D, 4, 3)
        self.class_embed, self.bbox_embed = nn.ModuleList([cls] * L), nn.ModuleList([box] * L)
        self.enc_class, self.enc_box = nn.Linear(D, K), MLP(D, D, 4, 3)

    def forward(self, memory, targets=None, generator=None):
        levels = Levels(SHAPES)
        ratios = torch.ones(memory.shape[0], 2, 2)
        zeroed, proposals = encoder_proposals(memory, None, levels)

        def layer(i, t, boxes, allowed):
            return self.layers[i](t, self.queries.query_pos(boxes), points_at_levels(swap_xy(boxes), ratios), memory,
                                  levels, None, self_attn_mask=allowed)

        return self.queries(memory, proposals, zeroed, layer, L, self.class_embed, self.bbox_embed,
                            (self.enc_class, self.enc_box), targets, generator=generator)


def targets():
    return [{"boxes": torch.tensor([[0.3, 0.4, 0.2, 0.3], [0.7, 0.6, 0.1, 0.2]]), "labels": torch.tensor([1, 3])},
            {"boxes": torch.tensor([[0.5, 0.5, 0.4, 0.4]]), "labels": torch.tensor([0])}]


def total(out, tg):
    s = out["pred_logits"].sum() + out["pred_boxes"].sum() + out["interm_outputs"]["pred_logits"].sum() \
        + out["interm_outputs"]["pred_boxes"].sum() + sum(a["pred_boxes"].sum() for a in out["aux_outputs"])
    if "dn_outputs" in out:
        losses = denoising_losses(out["dn_outputs"], tg, num_boxes=3, **out["dn_meta"])
        s = s + weighted_total(losses, {"loss_ce": 1.0, "loss_bbox": 5.0, "loss_giou": 2.0})
    return s


@pytest.mark.parametrize("kw", [{}, {"dn_number": 0}, {"look_forward_twice": False}])
def test_every_parameter_gets_a_gradient_in_training(kw):
    torch.manual_seed(0)
    m = Tiny(**kw).train()
    memory = torch.randn(2, 30, D)
    tg = targets()
    out = m(memory, tg)
    assert ("dn_outputs" in out) == (kw.get("dn_number", 100) > 0)
    total(out, tg).backward()
    missing = [n for n, p in m.named_parameters() if p.grad is None]
    assert not missing
    # an image batch without any box: no groups, label_enc still in the graph
    m.zero_grad(set_to_none=True)
    empty = [{"boxes": torch.zeros(0, 4), "labels": torch.zeros(0, dtype=torch.int64)}] * 2
    out = m(memory, empty)
    assert "dn_outputs" not in out
    total(out, empty).backward()
    assert not [n for n, p in m.named_parameters() if p.grad is None]


def test_eval_reads_no_targets_and_groups_leave_the_matching_queries_alone():
    torch.manual_seed(0)
    m = Tiny()
    memory = torch.randn(2, 30, D)
    with torch.no_grad():
        m.eval()
        a, b = m(memory, targets()), m(memory)
        assert "dn_outputs" not in a and torch.equal(a["pred_boxes"], b["pred_boxes"])
        m.train()  # dropout is 0: training differs from eval only by the groups
        c = m(memory, targets(), generator=torch.Generator().manual_seed(1))
        assert c["dn_outputs"]["pred_logits"].shape[1] == 2 * c["dn_meta"]["num_groups"] * 2
    for k in ("pred_logits", "pred_boxes"):
        torch.testing.assert_close(c[k], b[k], rtol=0, atol=1e-5)
        for x, y in zip(c["aux_outputs"], b["aux_outputs"]):
            torch.testing.assert_close(x[k], y[k], rtol=0, atol=1e-5)


def test_options_are_checked():
    pe = build_anchor_pe("sine", {}, D)
    for kw, word in [({"dn_number": -1}, "dn_number"), ({"dn_box_noise_scale": -0.1}, "dn_box_noise_scale"),
                     ({"dn_label_noise_ratio": 2.0}, "dn_label_noise_ratio"),
                     ({"look_forward_twice": 1}, "look_forward_twice"), ({"select": "top"}, "select")]:
        with pytest.raises(ValueError, match=word):
            DinoDecoding(D, Q, K, pe, **kw)


def test_weighted_total_weighs_each_term_as_its_namesake():
    losses = {"loss_ce_dn": torch.tensor(1.0), "loss_bbox_dn": torch.tensor(2.0), "loss_giou_dn_0": torch.tensor(3.0)}
    assert float(weighted_total(losses, {"loss_ce": 1.0, "loss_bbox": 5.0, "loss_giou": 2.0})) == 1 + 10 + 6
    with pytest.raises(ValueError, match="loss_giou"):
        weighted_total(losses, {"loss_ce": 1.0, "loss_bbox": 5.0})
