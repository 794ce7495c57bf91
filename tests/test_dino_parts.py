"""DINO's denoising parts (vispe.models.detr.queries.dn) against a faithful copy of IDEA-Research/DINO
(tests/_reference_dino.py), on the same seeded draws, and their properties."""
import _reference_dino as ref
import pytest
import torch
from torch import nn
from torchvision.ops import box_convert

from vispe.models.detr.queries.dn import (
    DinoQueryPos,
    denoising_losses,
    dn_attention_mask,
    dn_post_process,
    noise_boxes,
    num_groups,
    prepare_cdn,
)
from vispe.models.detr.queries.positioned import build_anchor_pe

K, D, Q = 7, 32, 5


def make_targets(counts, seed=0, lo=0.05, hi=0.95):
    g = torch.Generator().manual_seed(seed)
    out = []
    for n in counts:
        c = torch.rand(n, 2, generator=g) * 0.6 + 0.2  # (n, 2) centres
        wh = torch.rand(n, 2, generator=g) * 0.3 + 0.02
        xyxy = torch.cat([c - wh / 2, c + wh / 2], -1).clamp(lo, hi)
        out.append({"boxes": box_convert(xyxy, "xyxy", "cxcywh"), "labels": torch.randint(0, K, (n,), generator=g)})
    return out


CASES = [([3, 1], 100, 1.0, 0.5), ([2, 0, 4], 100, 0.4, 0.5), ([1, 2], 3, 1.0, 0.0), ([5], 2, 0.0, 1.0),
         ([60, 1], 100, 1.0, 0.5)]


@pytest.mark.parametrize("counts, dn_number, box_scale, label_ratio", CASES)
def test_prepare_cdn_equals_the_reference(counts, dn_number, box_scale, label_ratio):
    targets = make_targets(counts)
    label_enc = nn.Embedding(K + 1, D)
    torch.manual_seed(11)
    want_label, want_box, want_mask, meta = ref.prepare_for_cdn((targets, dn_number, label_ratio, box_scale), True,
                                                                Q, K, D, label_enc)
    got = prepare_cdn(targets, label_enc, num_queries=Q, num_classes=K, dn_number=dn_number,
                      label_noise_ratio=label_ratio, box_noise_scale=box_scale,
                      generator=torch.Generator().manual_seed(11))
    assert (got.pad_size, got.num_groups) == (meta["pad_size"], meta["num_dn_group"])
    assert got.single_pad == max(counts) and got.pad_size == 2 * got.num_groups * max(counts)
    torch.testing.assert_close(got.content, want_label, rtol=0, atol=1e-5)
    torch.testing.assert_close(got.box_logits, want_box, rtol=0, atol=1e-5)
    assert torch.equal(got.attn_mask, want_mask)
    if box_scale > 0:  # the noise took effect (the boxes are not the targets')
        assert (got.boxes[0, :counts[0]] - targets[0]["boxes"]).abs().max() > 1e-3


def test_a_batch_without_boxes_has_no_denoising_queries():
    targets = make_targets([0, 0])
    label_enc = nn.Embedding(K + 1, D)
    want = ref.prepare_for_cdn((targets, 100, 0.5, 1.0), True, Q, K, D, label_enc)
    got = prepare_cdn(targets, label_enc, num_queries=Q, num_classes=K)
    assert got.pad_size == want[3]["pad_size"] == 0 and got.content.shape == (2, 0, D)
    assert torch.equal(got.attn_mask, want[2]) and not got.attn_mask.any()


def test_the_groups_follow_the_reference_budget():
    # 2 * dn_number >= 100: G = 2 dn_number // (2 S); else 2 dn_number (the reference doubles it first)
    assert [num_groups(100, s) for s in (1, 3, 60, 101)] == [100, 33, 1, 1]
    assert [num_groups(n, 4) for n in (1, 5, 49, 50)] == [2, 10, 98, 12]
    assert num_groups(100, 0) == 1


def test_mask_blocks():
    P, G = 12, 3  # groups of 4
    m = dn_attention_mask(P, G, Q)
    for i in range(P + Q):
        for j in range(P + Q):
            if i >= P:
                want = j < P  # matching queries see no denoising query
            elif j >= P:
                want = False  # denoising queries see every matching query
            else:
                want = i // 4 != j // 4  # and their own group only
            assert bool(m[i, j]) == want, (i, j)
    assert m.dtype == torch.bool and m.shape == (P + Q, P + Q)
    with pytest.raises(ValueError, match="num_groups"):
        dn_attention_mask(10, 3, Q)


@pytest.mark.parametrize("scale", [1.0, 0.4])
def test_positives_lie_within_the_noise_bound_and_negatives_beyond(scale):
    # boxes away from the border: no corner is clamped, so the bounds hold exactly
    g = torch.Generator().manual_seed(3)
    M = 400
    c = torch.rand(M, 2, generator=g) * 0.2 + 0.4
    wh = torch.rand(M, 2, generator=g) * 0.15 + 0.05
    boxes = torch.cat([c, wh], -1)  # (M, 4) cx, cy, w, h
    negative = torch.arange(M) % 2 == 1
    noised = noise_boxes(boxes, negative, scale, generator=g)
    move = (box_convert(noised, "cxcywh", "xyxy") - box_convert(boxes, "cxcywh", "xyxy")).abs()  # (M, 4)
    bound = scale * boxes[:, 2:].repeat(1, 2) / 2  # lambda * (w/2, h/2, w/2, h/2)
    assert (move[~negative] <= bound[~negative] + 1e-6).all()
    assert (move[negative] >= bound[negative] - 1e-6).all()
    assert (move[negative] <= 2 * bound[negative] + 1e-6).all()
    assert move[~negative].mean() > 0.3 * bound[~negative].mean()  # spread over the bound, not at 0


def test_groups_layout_and_labels():
    targets = make_targets([3, 1], seed=4)
    label_enc = nn.Embedding(K + 1, D)
    got = prepare_cdn(targets, label_enc, num_queries=Q, num_classes=K, dn_number=2, label_noise_ratio=0.0)
    S, G = 3, 4
    assert (got.single_pad, got.num_groups) == (S, G)
    for b, t in enumerate(targets):
        n = len(t["labels"])
        for copy in range(2 * G):  # copy 2g: positives, 2g + 1: negatives, image b's boxes in slots 0..n-1
            sl = slice(copy * S, copy * S + n)
            assert torch.equal(got.labels[b, sl], t["labels"])
            assert (got.labels[b, copy * S + n:(copy + 1) * S] == -1).all()
            assert (got.content[b, copy * S + n:(copy + 1) * S] == 0).all()
            torch.testing.assert_close(got.content[b, sl], label_enc(t["labels"]))
    with pytest.raises(ValueError, match="dn_number"):
        prepare_cdn(targets, label_enc, num_queries=Q, num_classes=K, dn_number=0)
    with pytest.raises(ValueError, match="dn_label_noise_ratio"):
        prepare_cdn(targets, label_enc, num_queries=Q, num_classes=K, label_noise_ratio=1.5)
    with pytest.raises(ValueError, match="dn_box_noise_scale"):
        prepare_cdn(targets, label_enc, num_queries=Q, num_classes=K, box_noise_scale=-1.0)


def test_label_noise_rate():
    targets = make_targets([50, 50], seed=5)
    got = prepare_cdn(targets, nn.Embedding(K + 1, D), num_queries=Q, num_classes=K, dn_number=10,
                      label_noise_ratio=0.5, generator=torch.Generator().manual_seed(0))
    valid = got.labels >= 0
    truth = torch.stack([t["labels"] for t in targets]).repeat(1, 2 * got.num_groups)  # (B, P)
    changed = (got.labels != truth)[valid].float().mean()
    assert abs(changed - 0.25 * (1 - 1 / K)) < 0.02  # picked with p = ratio / 2, then a uniform class


def test_dn_post_process_equals_the_reference():
    L, B, P = 3, 2, 8
    logits, boxes = torch.randn(L, B, P + Q, K), torch.rand(L, B, P + Q, 4)
    meta = {"pad_size": P, "num_dn_group": 2}
    want_c, want_b = ref.dn_post_process(logits, boxes, meta, True, ref._set_aux_loss)
    got_c, got_b, dn = dn_post_process(logits, boxes, P)
    assert torch.equal(got_c, want_c) and torch.equal(got_b, want_b)
    known = meta["output_known_lbs_bboxes"]
    assert torch.equal(dn["pred_logits"], known["pred_logits"]) and torch.equal(dn["pred_boxes"], known["pred_boxes"])
    assert len(dn["aux_outputs"]) == L - 1
    for a, w in zip(dn["aux_outputs"], known["aux_outputs"]):
        assert torch.equal(a["pred_logits"], w["pred_logits"]) and torch.equal(a["pred_boxes"], w["pred_boxes"])
    c, b, none = dn_post_process(logits, boxes, 0)
    assert none is None and c is logits


def test_the_anchor_sine_is_dinos():
    d = 256  # gen_sineembed_for_position has 128 features per coordinate
    qp = DinoQueryPos(d, build_anchor_pe("sine", {}, d))
    boxes = torch.rand(3, 7, 4)  # (B, T, 4) cx, cy, w, h
    want = ref.gen_sineembed_for_position(boxes)  # y, x, w, h
    torch.testing.assert_close(qp.code(boxes), want, rtol=0, atol=1e-5)
    assert not torch.allclose(qp.code(boxes[..., [1, 0, 2, 3]]), want, atol=1e-2)  # the axes are told apart


@pytest.mark.parametrize("counts", [[3, 1], [2, 0, 4]])
def test_denoising_losses_equal_the_reference(counts):
    targets = make_targets(counts, seed=7)
    label_enc = nn.Embedding(K + 1, D)
    groups = prepare_cdn(targets, label_enc, num_queries=Q, num_classes=K, dn_number=3)
    L, B, P = 3, len(counts), groups.pad_size
    g = torch.Generator().manual_seed(2)
    logits = torch.randn(L, B, P + Q, K, generator=g)
    boxes = box_convert(torch.cat([torch.rand(L, B, P + Q, 2, generator=g) * 0.4,
                                   torch.rand(L, B, P + Q, 2, generator=g) * 0.4 + 0.5], -1), "xyxy", "cxcywh")
    meta = {"pad_size": P, "num_dn_group": groups.num_groups}
    want_c, want_b = ref.dn_post_process(logits, boxes, meta, True, ref._set_aux_loss)
    outputs = {"pred_logits": want_c[-1], "pred_boxes": want_b[-1], "aux_outputs": ref._set_aux_loss(want_c, want_b),
               "dn_meta": meta}
    want = ref.dn_criterion(outputs, targets, K)
    _, _, dn = dn_post_process(logits, boxes, P)
    got = denoising_losses(dn, targets, num_groups=groups.num_groups, single_pad=groups.single_pad,
                           num_boxes=max(sum(counts), 1))
    assert set(got) == set(want) and len(got) == 3 * L
    for k in want:
        torch.testing.assert_close(got[k], want[k].reshape(()), rtol=1e-5, atol=1e-5, msg=k)
    with pytest.raises(ValueError, match="single_pad"):
        fewer = [{"boxes": t["boxes"][:1], "labels": t["labels"][:1]} for t in targets]  # not the groups' targets
        denoising_losses(dn, fewer, num_groups=groups.num_groups, single_pad=groups.single_pad, num_boxes=1)
