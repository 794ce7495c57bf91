"""A miniature COCO 2017 folder in the real on-disk format, for tests and demos (no download).

``write_miniature_coco(root, n_images=4, seed=0)`` writes, for each split::

    root/annotations/instances_{train,val}2017.json   root/{train,val}2017/<id:012d>.png

Each instances file has COCO's keys (``info``, ``licenses``, ``images`` with ``id``,
``file_name``, ``height``, ``width``; ``annotations`` with ``id``, ``image_id``,
``category_id``, ``bbox`` [x, y, w, h], ``area``, ``iscrowd``, ``segmentation``: a polygon, or
for the crowd annotation an uncompressed RLE as COCO writes crowds; ``categories`` with ``id``,
``name``, ``supercategory``). Category ids have gaps as in COCO (1, 3, 7).

Images have different non-square sizes (from ``SIZES``) on a flat dark background; every object
is a solid axis-aligned rectangle in a colour of its own (``"vispe_colour"`` in its annotation,
an extra key that pycocotools ignores), so a test can find each box again from the pixels after
any transform. The first image of each split also holds a crowd annotation (a region drawn in
its own colour, ``iscrowd=1``); the third image has no annotation; one object touches the
border. Objects are 6..20 pixels wide and never touch each other (COCO's "small" objects).
"""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
from PIL import Image

from vispe import _checks
from vispe.data.coco import SPLITS, split_paths

CATEGORIES = {1: "box", 3: "bar", 7: "block"}
SIZES = ((48, 64), (60, 40), (52, 52), (36, 72), (44, 56), (64, 48))  # (h, w), cycled
BACKGROUND = (40, 40, 40)
PALETTE = ((230, 30, 30), (30, 200, 30), (40, 80, 240), (240, 240, 40), (230, 40, 230), (40, 230, 230),
           (250, 150, 20), (250, 250, 250))  # far from each other and from BACKGROUND


def _place(rng, h: int, w: int, n: int, edge: bool) -> list[tuple[int, int, int, int]]:
    """``n`` rectangles (y0, x0, bh, bw) with a 3-pixel gap between them; the first at the left edge if ``edge``."""
    out: list[tuple[int, int, int, int]] = []
    while len(out) < n:
        bh, bw = (int(v) for v in rng.integers(6, 21, size=2))
        y0 = int(rng.integers(0, h - bh + 1))
        x0 = 0 if edge and not out else int(rng.integers(0, w - bw + 1))
        if all(y0 >= b[0] + b[2] + 3 or b[0] >= y0 + bh + 3 or x0 >= b[1] + b[3] + 3 or b[1] >= x0 + bw + 3
               for b in out):
            out.append((y0, x0, bh, bw))
    return out


def _rle(mask: np.ndarray) -> dict:
    """COCO's uncompressed RLE of ``mask`` (h, w): run lengths over the column-major pixels, zeros first."""
    flat = mask.flatten(order="F").astype(np.int8)
    change = np.flatnonzero(np.diff(flat)) + 1
    runs = np.diff(np.concatenate([[0], change, [flat.size]]))
    counts = ([0] if flat[0] else []) + runs.tolist()
    return {"counts": counts, "size": list(mask.shape)}


def write_miniature_coco(root, n_images: int = 4, seed: int = 0) -> Path:
    """Write the miniature set under ``root`` (created); returns ``root``. Deterministic given ``seed``."""
    n = _checks.positive_int("n_images", n_images)
    if n < 3:
        raise ValueError(f"n_images={n_images}: expected at least 3 (a crowd image, an image, an empty image)")
    rng = np.random.default_rng(_checks.positive_int("seed", seed, allow_zero=True))
    root = Path(root).expanduser()
    image_id, ann_id = 1, 1
    for split in SPLITS:
        folder, ann_file = split_paths(root, split)
        folder.mkdir(parents=True, exist_ok=True)
        ann_file.parent.mkdir(parents=True, exist_ok=True)
        images, anns = [], []
        for i in range(n):
            h, w = SIZES[(i + SPLITS.index(split)) % len(SIZES)]
            pixels = np.empty((h, w, 3), dtype=np.uint8)
            pixels[:] = BACKGROUND
            count = 0 if i == 2 else int(rng.integers(2, 4)) + (i == 0)
            for k, (y0, x0, bh, bw) in enumerate(_place(rng, h, w, count, edge=i == 1)):
                colour = PALETTE[k]
                pixels[y0:y0 + bh, x0:x0 + bw] = colour
                crowd = i == 0 and k == count - 1
                x1, y1 = x0 + bw, y0 + bh
                if crowd:
                    mask = np.zeros((h, w), dtype=bool)
                    mask[y0:y1, x0:x1] = True
                    seg = _rle(mask)
                else:
                    seg = [[x0, y0, x1, y0, x1, y1, x0, y1]]
                anns.append({"id": ann_id, "image_id": image_id, "category_id": list(CATEGORIES)[k % 3],
                             "bbox": [x0, y0, bw, bh], "area": bw * bh, "iscrowd": int(crowd),
                             "segmentation": seg, "vispe_colour": list(colour)})
                ann_id += 1
            name = f"{image_id:012d}.png"
            Image.fromarray(pixels).save(folder / name)
            images.append({"id": image_id, "file_name": name, "height": h, "width": w, "license": 1})
            image_id += 1
        data = {"info": {"description": "vispe miniature COCO", "version": "1.0", "year": 2017},
                "licenses": [{"id": 1, "name": "test data", "url": ""}], "images": images, "annotations": anns,
                "categories": [{"id": k, "name": v, "supercategory": "shape"} for k, v in CATEGORIES.items()]}
        ann_file.write_text(json.dumps(data))
    return root
