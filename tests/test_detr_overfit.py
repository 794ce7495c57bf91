"""The detector learns: on a handful of synthetic images its loss falls and COCOeval's AP50 on those
images passes 0.5 (DETR's matcher, criterion, post-processing and pycocotools end to end)."""
import contextlib
import io

import torch
from pycocotools.coco import COCO

from vispe.data.coco_eval import coco_evaluate
from vispe.models.detr import SetCriterion, create_detr, to_coco_results

H, W, N = 64, 80, 6


def synthetic():
    """N images with one or two bright squares whose colour channel is the class (ids 1..3)."""
    g = torch.Generator().manual_seed(0)
    images = torch.zeros(N, 3, H, W)
    targets, anns = [], []
    for i in range(N):
        boxes, labels = [], []
        for _ in range(1 + i % 2):
            c, s = int(torch.randint(0, 3, (1,), generator=g)), int(torch.randint(12, 28, (1,), generator=g))
            y, x = int(torch.randint(0, H - s, (1,), generator=g)), int(torch.randint(0, W - s, (1,), generator=g))
            images[i, c, y:y + s, x:x + s] = 2.0
            boxes.append([(x + s / 2) / W, (y + s / 2) / H, s / W, s / H])
            labels.append(c + 1)
            anns.append({"id": len(anns) + 1, "image_id": i, "category_id": c + 1, "bbox": [x, y, s, s],
                         "area": s * s, "iscrowd": 0})
        targets.append({"boxes": torch.tensor(boxes), "labels": torch.tensor(labels), "image_id": torch.tensor(i),
                        "orig_size": torch.tensor([H, W])})
    gt = COCO()
    gt.dataset = {"images": [{"id": i, "height": H, "width": W} for i in range(N)], "annotations": anns,
                  "categories": [{"id": c, "name": str(c)} for c in (1, 2, 3)]}
    with contextlib.redirect_stdout(io.StringIO()):
        gt.createIndex()
    return images, targets, gt


def test_detector_overfits_a_handful_of_images():
    torch.manual_seed(0)
    images, targets, gt = synthetic()
    model = create_detr(4, backbone="small_cnn", backbone_widths=(16, 32, 64, 64), d_model=64, nheads=4,
                        enc_layers=1, dec_layers=2, dim_feedforward=128, num_queries=8, dropout=0.0)
    criterion = SetCriterion(4)
    opt = torch.optim.AdamW(model.parameters(), lr=5e-4, weight_decay=1e-4)
    losses = []
    for _ in range(150):
        loss = criterion(model(images), targets)["loss"]
        opt.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 0.1)
        opt.step()
        losses.append(loss.item())
    model.eval()
    with torch.no_grad():
        ap = coco_evaluate(gt, to_coco_results(model(images), targets))
    assert sum(losses[-10:]) / 10 < 0.3 * sum(losses[:10]) / 10
    assert ap["AP50"] > 0.5, ap
