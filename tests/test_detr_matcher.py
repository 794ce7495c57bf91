"""HungarianMatcher: optimal by brute force, batched equals per image, images without objects."""
import itertools

import torch

from vispe.models.detr import HungarianMatcher


def random_case(gen, Q, n, K=4):
    logits = torch.randn(Q, K + 1, generator=gen)
    cxcy = torch.rand(Q, 2, generator=gen) * 0.6 + 0.2
    boxes = torch.cat([cxcy, torch.rand(Q, 2, generator=gen) * 0.3 + 0.05], -1)  # (Q, 4)
    t_cxcy = torch.rand(n, 2, generator=gen) * 0.6 + 0.2
    target = {"labels": torch.randint(0, K, (n,), generator=gen),
              "boxes": torch.cat([t_cxcy, torch.rand(n, 2, generator=gen) * 0.3 + 0.05], -1)}
    return logits, boxes, target


def brute_force(cost: torch.Tensor) -> float:
    """Minimal total cost over every injective map from targets (columns) to queries (rows)."""
    Q, n = cost.shape
    return min(sum(float(cost[q, j]) for j, q in enumerate(perm)) for perm in itertools.permutations(range(Q), n))


def test_matching_is_optimal_against_brute_force():
    gen = torch.Generator().manual_seed(0)
    matcher = HungarianMatcher()
    for Q, n in [(3, 3), (5, 2), (6, 4), (4, 1)]:
        logits, boxes, target = random_case(gen, Q, n)
        (rows, cols), = matcher({"pred_logits": logits[None], "pred_boxes": boxes[None]}, [target])
        assert len(rows) == n and sorted(cols.tolist()) == list(range(n)) and len(set(rows.tolist())) == n
        cost = matcher.cost_matrix(logits, boxes, target["labels"], target["boxes"])  # (Q, n)
        got = float(cost[rows, cols].sum())
        assert abs(got - brute_force(cost)) < 1e-5


def test_cost_matrix_terms_follow_detr():
    gen = torch.Generator().manual_seed(1)
    logits, boxes, target = random_case(gen, 4, 3)
    only_l1 = HungarianMatcher(cost_class=0, cost_bbox=1, cost_giou=0)
    l1 = (boxes[:, None] - target["boxes"][None]).abs().sum(-1)  # (Q, n)
    torch.testing.assert_close(only_l1.cost_matrix(logits, boxes, target["labels"], target["boxes"]), l1)
    only_class = HungarianMatcher(cost_class=1, cost_bbox=0, cost_giou=0)
    prob = logits.softmax(-1)
    torch.testing.assert_close(only_class.cost_matrix(logits, boxes, target["labels"], target["boxes"]),
                               -prob[:, target["labels"]])


def test_batched_equals_per_image_and_empty_images():
    gen = torch.Generator().manual_seed(2)
    matcher = HungarianMatcher()
    cases = [random_case(gen, 6, n) for n in (3, 0, 5, 1)]
    logits = torch.stack([c[0] for c in cases])
    boxes = torch.stack([c[1] for c in cases])
    targets = [c[2] for c in cases]
    batched = matcher({"pred_logits": logits, "pred_boxes": boxes}, targets)
    for b, (lg, bx, t) in enumerate(cases):
        (rows, cols), = matcher({"pred_logits": lg[None], "pred_boxes": bx[None]}, [t])
        assert torch.equal(batched[b][0], rows) and torch.equal(batched[b][1], cols)
    assert batched[1][0].numel() == 0 and batched[1][0].dtype == torch.int64
    none = matcher({"pred_logits": logits[:1], "pred_boxes": boxes[:1]}, [targets[1]])
    assert none[0][0].numel() == 0 and none[0][1].numel() == 0
