"""RT-DETR's parts on their own: the denoising groups' layout and mask, the anchors, and the refusals."""
import pytest
import torch
from torch import nn

from vispe.kernels.deformable import Levels
from vispe.models.detr.queries.dn.mask import dn_attention_mask
from vispe.models.detr.realtime.denoising import denoising_groups
from vispe.models.detr.realtime.selection import QuerySelection, anchors

TARGETS = [{"labels": torch.tensor([1, 2]), "boxes": torch.tensor([[0.3, 0.3, 0.2, 0.2], [0.7, 0.6, 0.2, 0.4]])},
           {"labels": torch.tensor([0]), "boxes": torch.tensor([[0.5, 0.5, 0.5, 0.5]])}]


def test_groups_layout_positives_and_padding_slots():
    emb = nn.Embedding(6, 8, padding_idx=5)
    g = denoising_groups(TARGETS, emb, num_classes=5, num_queries=4, num_denoising=7, label_noise_ratio=0.0,
                         box_noise_scale=0.0)
    assert g.num_groups == 3 and g.pad_size == 12  # 7 // 2 groups of [2 positives | 2 negatives]
    assert torch.equal(g.positive[0], torch.tensor([0, 1, 4, 5, 8, 9])) and torch.equal(g.positive[1], torch.tensor([0, 4, 8]))
    torch.testing.assert_close(g.content[1, 1], torch.zeros(8))  # image 1's padding slot: the padding class, zero
    torch.testing.assert_close(g.box_logits[0, 2].sigmoid(), TARGETS[0]["boxes"][0])  # negatives copy the box (no noise)
    assert torch.equal(g.attn_mask, dn_attention_mask(12, 3, 4))


def test_box_noise_keeps_positives_inside_and_pushes_negatives_out():
    torch.manual_seed(0)
    big = [{"labels": torch.zeros(50, dtype=torch.int64), "boxes": torch.tensor([[0.5, 0.5, 0.2, 0.2]]).repeat(50, 1)}]
    g = denoising_groups(big, nn.Embedding(3, 4, padding_idx=2), num_classes=2, num_queries=1, num_denoising=100,
                         box_noise_scale=1.0)
    boxes = g.box_logits[0].sigmoid().view(g.num_groups, 2, 50, 4)  # (G, pos|neg, S, 4)
    move = (boxes - 0.5).abs()[..., :2].amax(-1)  # centre shift in unit coordinates
    assert move[:, 0].max() <= 0.1 + 1e-5  # a positive's corners stay within half the side (0.1)
    assert (boxes[:, 1, :, 2:] - 0.2).abs().max() > 0.1  # negatives move by 1..2 half-sides


def test_no_boxes_or_no_budget_gives_no_groups():
    emb = nn.Embedding(6, 8, padding_idx=5)
    empty = [{"labels": torch.zeros(0, dtype=torch.int64), "boxes": torch.zeros(0, 4)}]
    assert denoising_groups(empty, emb, num_classes=5, num_queries=4) is None
    assert denoising_groups(TARGETS, emb, num_classes=5, num_queries=4, num_denoising=0) is None


def test_anchors_are_cell_centres_with_level_sizes_and_border_ones_are_invalid():
    logits, valid = anchors(Levels(((4, 6), (2, 3))))
    a = logits[0].sigmoid()
    torch.testing.assert_close(a[7], torch.tensor([1.5 / 6, 1.5 / 4, 0.05, 0.05]))  # level 0, row 1, column 1
    torch.testing.assert_close(a[24 + 5], torch.tensor([2.5 / 3, 1.5 / 2, 0.1, 0.1]))  # level 1, row 1, column 2
    assert bool(valid.all())
    logits, valid = anchors(Levels(((60, 60),)))
    assert not bool(valid[0, 0]) and bool(valid[0, 61])  # (0.5 / 60 < 0.01) refused, the next cell kept


def test_selection_refuses_fewer_tokens_than_queries():
    with pytest.raises(ValueError, match="num_queries=30"):
        QuerySelection(8, 3, 30)(torch.randn(1, 12, 8), Levels(((3, 4),)))
