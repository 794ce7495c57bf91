"""The detection picture (predictions/epoch_*.png) is readable at a glance (issue 28, item 13).

Before, it was the images at their own size (269x158 px for two shapes images) with torchvision's
boxes: no legend, no class names on true boxes, labels inside the boxes over the objects, and an
empty picture when no prediction passed the threshold.
"""
from __future__ import annotations

import numpy as np
import pytest
import torch
from PIL import Image

from vispe.train import detection_vis as V


def _tiles():
    rng = np.random.default_rng(0)
    px = lambda h, w: rng.integers(0, 255, (h, w, 3), dtype=np.uint8)  # noqa: E731
    return [
        {"pixels": px(64, 80), "image_id": 1, "truth": [([10, 0, 30, 20], "disc"), ([40, 30, 70, 64], "ring")],
         "detections": [([11, 1, 31, 21], "disc", 0.9), ([40, 31, 69, 63], "ring", 0.6), ([0, 0, 5, 5], "cross", 0.1)]},
        {"pixels": px(72, 64), "image_id": 2, "truth": [([5, 5, 20, 20], "square")],  # nothing passes: top 3
         "detections": [([6, 6, 20, 21], "square", 0.3), ([6, 6, 20, 21], "disc", 0.2),  # one box twice: once
                        ([30, 30, 40, 40], "disc", 0.25), ([1, 1, 9, 9], "ring", 0.05), ([2, 2, 8, 8], "ring", 0.01)]},
        {"pixels": px(64, 64), "image_id": 3, "truth": [],
         "detections": [([i, i, i + 10, i + 10], "cross", 0.99 - i / 100) for i in range(20)]},  # capped
    ]


def test_the_picture_is_magnified_labelled_outside_the_boxes_and_says_its_threshold(tmp_path):
    drawn = V.plot_detections(_tiles(), tmp_path / "p.png", score=0.5, title="epoch_003")
    w, h = Image.open(tmp_path / "p.png").size
    assert w >= 3 * 3 * 80 and h >= 3 * 72  # three tiles across, each image at least 3x
    truth = [d for d in drawn if d["kind"] == "truth"]
    assert [d["text"] for d in truth] == ["disc", "ring", "square"]  # class names on the true boxes
    for d in drawn:
        if d["kind"] == "truth":
            assert d["at"][1] < d["box"][1] or d["box"][1] <= 0  # above the box (or in the margin above the image)
        elif d["kind"] in ("prediction", "top-k"):
            assert d["at"][1] > d["box"][3]  # below the box: the label covers no part of it
    preds = [d["text"] for d in drawn if d["kind"] == "prediction" and d["tile"] == 0]
    assert preds == ["disc 0.90", "ring 0.60"]  # scores, and nothing under the threshold
    topk = [d["text"] for d in drawn if d["kind"] == "top-k"]
    assert topk == ["square 0.30", "disc 0.25", "ring 0.05"]  # the best 3 distinct boxes when none passes
    notes = [d["text"] for d in drawn if d["kind"] == "note"]
    assert notes[0] == "image 1: 2 true\n2 predicted \u2265 0.5"
    assert notes[1] == "image 2: 1 true\nnone \u2265 0.5: top 3 shown (best 0.30)"
    assert notes[2] == f"image 3: 0 true\n20 predicted \u2265 0.5, {V.MAX_SHOWN} best shown"
    assert len([d for d in drawn if d["kind"] == "prediction" and d["tile"] == 2]) == V.MAX_SHOWN
    (legend,) = [d["text"] for d in drawn if d["kind"] == "legend"]
    assert legend == "truth: class | prediction \u2265 0.5: class score | top 3 when none reaches 0.5"


@pytest.mark.filterwarnings("ignore::DeprecationWarning")
def test_draw_predictions_of_a_detector_on_a_coco_set(tmp_path):
    from vispe.data.miniature_coco import write_miniature_coco
    from vispe.train import config as C
    from vispe.train.tasks import get_task

    coco = write_miniature_coco(tmp_path / "coco", n_images=3, seed=0)
    cfg = C.load_config(None, ["task.name=detection", "model.name=detr", "data.name=coco", f"data.root={coco}",
                               "data.img_size=48", "data.max_size=80", "detr.backbone_widths=[8,8,16]",
                               "detr.d_model=16", "detr.nheads=2", "detr.enc_layers=1", "detr.dec_layers=1",
                               "detr.dim_feedforward=32", "detr.num_queries=4", "model.pe=sine"])
    task = get_task(cfg.task)
    info = task.info(cfg)
    ds = task.dataset(cfg, "test", 48)
    torch.manual_seed(0)
    model = task.model(cfg, info, 48)
    drawn = V.draw_predictions(model, ds, tmp_path / "predictions" / "epoch_001.png", device="cpu",
                               collate_fn=task.collate_fn, info=info, n=2, score=0.99)
    w, h = Image.open(tmp_path / "predictions" / "epoch_001.png").size
    assert w >= 2 * 3 * 48 and h >= 3 * 48
    names = set(info.category_names.values())
    assert {d["text"] for d in drawn if d["kind"] == "truth"} <= names and any(d["kind"] == "truth" for d in drawn)
    assert all("top" in d["text"] for d in drawn if d["kind"] == "note")  # untrained: nothing reaches 0.99
    assert model.training  # the model's mode is restored


def test_a_large_image_is_shrunk_to_a_tile_not_magnified(tmp_path):
    tiles = [{"pixels": np.zeros((600, 800, 3), dtype=np.uint8), "image_id": 1, "truth": [([100, 100, 300, 300], "cat")],
              "detections": [([110, 90, 310, 290], "cat", 0.8)]}]
    V.plot_detections(tiles, tmp_path / "big.png", score=0.5)
    w, h = Image.open(tmp_path / "big.png").size
    assert V.TILE_PX <= w <= 1.2 * V.TILE_PX + 50 and h <= 2 * V.TILE_PX  # one tile of about TILE_PX, not 3,200 px


def test_labels_of_close_boxes_do_not_overlap_and_coinciding_top_predictions_are_said(tmp_path):
    """issue 41, item 8: labels of boxes a few pixels apart were drawn on top of each other, and the
    'top 3' fallback drew one box without a word when the predictions coincided."""
    rng = np.random.default_rng(1)
    close = [([10 + 2 * k, 10 + k, 40 + 2 * k, 30 + k], "square", 0.9 - k / 100) for k in range(4)]
    tiles = [{"pixels": rng.integers(0, 255, (64, 96, 3), dtype=np.uint8), "image_id": 1,
              "truth": [([10, 12, 40, 30], "square"), ([12, 13, 42, 31], "disc")], "detections": close},
             {"pixels": rng.integers(0, 255, (64, 64, 3), dtype=np.uint8), "image_id": 2, "truth": [],
              "detections": [([5, 5, 30, 30], c, 0.2 - k / 100) for k, c in enumerate(["ring", "disc", "cross"] * 4)]}]
    drawn = V.plot_detections(tiles, tmp_path / "p.png", score=0.5)
    boxes = [d for d in drawn if d["kind"] in ("truth", "prediction", "top-k")]
    assert len([d for d in boxes if d["tile"] == 0]) == 6
    for a in boxes:  # extents in the PNG's pixels (x0, y0, x1, y1): no two labels of a tile share a pixel
        for b in boxes:
            if a is not b and a["tile"] == b["tile"]:
                (ax0, ay0, ax1, ay1), (bx0, by0, bx1, by1) = a["extent"], b["extent"]
                assert ax1 <= bx0 or bx1 <= ax0 or ay1 <= by0 or by1 <= ay0, (a["text"], b["text"])
        if a["kind"] == "truth":
            assert a["at"][1] < a["box"][1]  # still above its box
        else:
            assert a["at"][1] > a["box"][3]  # still below its box
    w, h = Image.open(tmp_path / "p.png").size
    assert all(0 <= d["extent"][0] and d["extent"][2] <= w and 0 <= d["extent"][1] and d["extent"][3] <= h
               for d in boxes)  # inside the picture
    note = [d["text"] for d in drawn if d["kind"] == "note" and d["tile"] == 1][0]
    assert note == "image 2: 0 true\nnone \u2265 0.5: 1 box shown, all 12 predictions on it (best 0.20)"
    assert [d["text"] for d in drawn if d["kind"] == "top-k"] == ["ring 0.20"]


def test_curves_png_is_a_grid_of_panels(tmp_path):
    """issue 41, item 8: a detector's ten metrics made curves.png a 4,500 x 340 strip."""
    from vispe.train.logging import plot_curves

    names = ["loss", "loss_ce", "loss_bbox", "loss_giou", "AP", "AP50", "AP75", "APs", "APm", "APl"]
    history = [{"epoch": e, **{f"train_{n}": 1 / e for n in names[:4]}, **{f"test_{n}": 0.5 / e for n in names}}
               for e in (1, 2, 3)]
    plot_curves(history, tmp_path / "curves.png", title="sine")
    w, h = Image.open(tmp_path / "curves.png").size
    assert w <= 1800 and h >= 900 and w / h < 2  # 4 columns x 3 rows
    plot_curves([{"epoch": 1, "train_loss": 1.0, "test_acc": 0.5}], tmp_path / "two.png")
    assert Image.open(tmp_path / "two.png").size[0] < 1000  # a classifier's two panels side by side
