"""Relation-DETR's box-to-box relation (``vispe.models.detr.transformer.relation``): against a faithful copy of
xiuqhou/Relation-DETR's ``box_rel_encoding`` + ``PositionRelationEmbedding`` element by element, the
relative property, padded-batch invariance, and its place in the decoder (layers 1.. only, the
previous layers' boxes, the one Attention's bias path)."""
import functools
import math

import pytest
import torch
from torch import nn

from vispe.models.detr import create_detr
from vispe.models.detr.transformer.relation import PositionRelation

SMALL = dict(backbone="small_cnn", backbone_widths=(8, 16, 16, 32), d_model=32, nheads=4, enc_layers=1,
             dec_layers=3, dim_feedforward=64, num_queries=6, dropout=0.0, decoder="dab", init="legacy")


# --- a faithful copy of the reference (models/bricks/relation_transformer.py, position_encoding.py) ------
def ref_box_rel_encoding(src_boxes, tgt_boxes, eps=1e-5):
    xy1, wh1 = src_boxes.split([2, 2], -1)
    xy2, wh2 = tgt_boxes.split([2, 2], -1)
    delta_xy = torch.abs(xy1.unsqueeze(-2) - xy2.unsqueeze(-3))
    delta_xy = torch.log(delta_xy / (wh1.unsqueeze(-2) + eps) + 1.0)
    delta_wh = torch.log((wh1.unsqueeze(-2) + eps) / (wh2.unsqueeze(-3) + eps))
    return torch.cat([delta_xy, delta_wh], -1)  # [batch_size, num_boxes1, num_boxes2, 4]


def ref_get_dim_t(num_pos_feats, temperature, device):
    dim_t = torch.arange(num_pos_feats // 2, dtype=torch.float32, device=device)
    return temperature ** (dim_t * 2 / num_pos_feats)


def ref_get_sine_pos_embed(pos_tensor, num_pos_feats=128, temperature=10000, scale=2 * math.pi, exchange_xy=True):
    dim_t = ref_get_dim_t(num_pos_feats, temperature, pos_tensor.device)
    pos_res = pos_tensor.unsqueeze(-1) * scale / dim_t
    pos_res = torch.stack((pos_res.sin(), pos_res.cos()), dim=-1).flatten(-2)
    assert not exchange_xy
    return pos_res.flatten(-2)


class RefPositionRelationEmbedding(nn.Module):
    def __init__(self, embed_dim=256, num_heads=8, temperature=10000.0, scale=100.0):
        super().__init__()
        self.pos_proj = nn.Sequential(nn.Conv2d(embed_dim * 4, num_heads, kernel_size=1), nn.ReLU())  # Conv2dNormActivation, norm None
        self.pos_func = functools.partial(ref_get_sine_pos_embed, num_pos_feats=embed_dim, temperature=temperature,
                                          scale=scale, exchange_xy=False)

    def forward(self, src_boxes, tgt_boxes=None):
        if tgt_boxes is None:
            tgt_boxes = src_boxes
        with torch.no_grad():
            pos_embed = ref_box_rel_encoding(src_boxes, tgt_boxes)
            pos_embed = self.pos_func(pos_embed).permute(0, 3, 1, 2)
        pos_embed = self.pos_proj(pos_embed)
        return pos_embed.clone()


def boxes(B, N, seed):
    """Boxes on a 1/256 grid, so that moving them by 1/8 changes no offset by a rounding."""
    g = torch.Generator().manual_seed(seed)
    cxcy = torch.randint(51, 205, (B, N, 2), generator=g) / 256  # in [0.2, 0.8)
    wh = torch.randint(13, 90, (B, N, 2), generator=g) / 256  # in [0.05, 0.35)
    return torch.cat([cxcy, wh], -1)


def test_relation_equals_relation_detr_element_by_element():
    torch.manual_seed(0)
    ref = RefPositionRelationEmbedding(16, 4)
    ours = PositionRelation(4)
    with torch.no_grad():
        ref.pos_proj[0].weight.normal_()  # every weight perturbed (the default init leaves many ReLUs at 0)
        ref.pos_proj[0].bias.normal_(0, 0.1)
        ours.proj.weight.copy_(ref.pos_proj[0].weight[:, :, 0, 0])
        ours.proj.bias.copy_(ref.pos_proj[0].bias)
    src, tgt = boxes(2, 5, 0), boxes(2, 7, 1)  # non-square pair matrix: a transposed (i, j) would not match
    want = ref(src, tgt)  # (B, heads, 5, 7)
    got = ours(src, tgt)
    assert got.shape == want.shape == (2, 4, 5, 7) and (want > 0).float().mean() > 0.2
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(ours(src, src), ref(src), rtol=1e-5, atol=1e-5)
    swapped = ours(tgt, src).transpose(-1, -2)  # (B, heads, 5, 7): the roles of the two boxes swapped
    assert (swapped - want).abs().max() > 1e-3  # not symmetric: a swap would show


def test_boxes_moved_together_give_the_same_bias():
    torch.manual_seed(0)
    rel = PositionRelation(3)
    nn.init.normal_(rel.proj.weight)
    src, tgt = boxes(1, 6, 2), boxes(1, 6, 3)
    shift = torch.tensor([0.125, -0.0625, 0.0, 0.0])
    torch.testing.assert_close(rel(src + shift, tgt + shift), rel(src, tgt), rtol=0, atol=1e-6)
    moved_one = tgt.clone()
    moved_one[:, 0] += shift
    assert (rel(src, moved_one) - rel(src, tgt)).abs().max() > 1e-3  # one box moved: another bias


def test_relation_biases_layers_after_the_first_from_the_previous_layers_boxes():
    """The decoder's self-attention of layer i >= 1 gets the relation of the boxes predicted after layers
    i - 2 (the anchors for i = 1) and i - 1, on the one Attention's bias path; layer 0 gets none."""
    torch.manual_seed(0)
    model = create_detr(4, **SMALL, query_relation="relation").eval()
    seen = {}
    for i, layer in enumerate(model.transformer.decoder):
        layer.self_attn.register_forward_hook(lambda m, a, kw, o, i=i: seen.__setitem__(i, kw.get("bias")),
                                              with_kwargs=True)
    with torch.no_grad():
        out = model(torch.randn(2, 3, 48, 64))
    assert seen[0] is None and seen[1].shape == seen[2].shape == (2, 4, 6, 6)
    anchors = model.query_embed.weight.sigmoid()[None]  # (1, Q, 4)
    layer_boxes = [out["aux_outputs"][0]["pred_boxes"], out["aux_outputs"][1]["pred_boxes"]]
    # (sin(100 e) amplifies the float32 rounding of boxes computed per layer vs stacked: atol 1e-5)
    torch.testing.assert_close(seen[1], model.transformer.relation(anchors, layer_boxes[0]), rtol=0, atol=1e-5)
    torch.testing.assert_close(seen[2], model.transformer.relation(layer_boxes[0], layer_boxes[1]), rtol=0, atol=1e-5)
    assert (seen[2] - model.transformer.relation(anchors, layer_boxes[1])).abs().max() > 1e-3  # not the anchors


def test_relation_gets_gradients_and_changes_the_output():
    torch.manual_seed(0)
    model = create_detr(4, **SMALL, query_relation="relation").train()
    out = model(torch.randn(2, 3, 48, 64))
    (out["pred_logits"].sum() + out["pred_boxes"].sum()).backward()
    assert model.transformer.relation.proj.weight.grad.abs().sum() > 0
    torch.manual_seed(0)
    plain = create_detr(4, **SMALL).eval()  # the relation is built last: every other weight is the same
    model.eval()
    images = torch.randn(1, 3, 48, 64)
    with torch.no_grad():
        a, b = model(images), plain(images)
    torch.testing.assert_close(a["aux_outputs"][0]["pred_logits"], b["aux_outputs"][0]["pred_logits"])  # layer 0
    assert (a["pred_logits"] - b["pred_logits"]).abs().max() > 1e-4


def test_relation_of_a_padded_image_equals_the_image_alone():
    torch.manual_seed(3)
    model = create_detr(4, **SMALL, query_relation="relation", box_bias="boxrpb",
                        box_bias_kwargs=dict(hidden=16)).eval()
    a = torch.randn(1, 3, 48, 64)
    images = torch.zeros(2, 3, 80, 112)
    images[0, :, :48, :64], images[1] = a[0], torch.randn(3, 80, 112)
    mask = torch.ones(2, 80, 112, dtype=torch.bool)
    mask[0, :48, :64] = False
    mask[1] = False
    with torch.no_grad():
        alone, both = model(a), model(images, mask)
    for key in ("pred_logits", "pred_boxes"):
        torch.testing.assert_close(both[key][0], alone[key][0], rtol=0, atol=1e-4)


@pytest.mark.parametrize("kw, match", [
    (dict(decoder="conditional"), "query_relation='relation' with decoder='conditional': it needs anchor boxes"),
    (dict(decoder_kwargs=dict(query_dim=2)), "query_dim=2: it needs anchor boxes"),
    (dict(decoder="detr"), "decoder='detr': it needs anchor boxes"),
    (dict(dec_layers=1), "dec_layers=1: the relation biases layer i >= 1"),
    (dict(query_relation="relations"), "query_relation='relations': expected None or one of 'relation'"),
    (dict(query_relation_kwargs=dict(temp=1.0)), r"query_relation_kwargs has \['temp'\]"),
    (dict(query_relation=None, query_relation_kwargs=dict(scale=1.0)), "with query_relation=None: there is nothing"),
])
def test_relation_options_are_checked_at_build(kw, match):
    with pytest.raises(ValueError, match=match):
        create_detr(4, **{**SMALL, "query_relation": "relation", **kw})
