"""COCO box AP of detection results with pycocotools (``COCO.loadRes`` + ``COCOeval``, iouType "bbox").

    stats = coco_evaluate(dataset.coco, results)   # {"AP": ..., "AP50": ..., "AP75": ..., "APs", "APm", "APl"}

``results``: COCO-format dicts ``{"image_id", "category_id", "bbox": [x, y, w, h] in the original
image's pixels, "score"}``. A result whose ``category_id`` is not a category of ``coco_gt`` (a
detector's label 0 or an unused id) is left out, as COCOeval, which scores the ground truth's
categories only, would ignore it; one for an image not in ``coco_gt`` is an error. Every image
of ``coco_gt`` is evaluated (``img_ids`` restricts it, e.g. to the images a run saw). The values are COCOeval's ``stats[0:6]``: AP over IoU 0.50:0.95,
AP at IoU 0.50 and 0.75, AP of small (< 32^2 px area), medium and large objects, each over at
most 100 detections per image. As in COCOeval, a value is -1.0 when the ground truth has no
object of that kind (e.g. APl on a set without large objects). An empty ``results`` list is
evaluated as "no detection": 0.0 wherever the ground truth has objects (-1.0 elsewhere).
pycocotools prints its progress; it is silenced unless ``verbose=True``.
"""
from __future__ import annotations

import contextlib
import copy
import io
import math

import numpy as np
from pycocotools.coco import COCO
from pycocotools.cocoeval import COCOeval

KEYS = ("AP", "AP50", "AP75", "APs", "APm", "APl")


def _check_results(coco_gt: COCO, results) -> None:
    if not isinstance(results, list):
        raise ValueError(f"results is a {type(results).__name__}: expected a list of dicts with image_id, "
                         "category_id, bbox [x, y, w, h] and score")
    images = set(coco_gt.getImgIds())
    for i, r in enumerate(results):
        missing = [k for k in ("image_id", "category_id", "bbox", "score") if not isinstance(r, dict) or k not in r]
        if missing:
            raise ValueError(f"results[{i}] = {str(r)[:100]} lacks {', '.join(missing)}")
        if r["image_id"] not in images:
            raise ValueError(f"results[{i}] has image_id={r['image_id']!r}, which is not an image of the ground truth")
        box = r["bbox"]
        if len(box) != 4 or not all(math.isfinite(float(v)) for v in box) or not math.isfinite(float(r["score"])):
            raise ValueError(f"results[{i}] has bbox={box!r}, score={r['score']!r}: expected [x, y, w, h] and a "
                             "score, finite numbers")


def _load_results(coco_gt: COCO, results: list) -> COCO:
    """``coco_gt.loadRes(results)``; for an empty list (which loadRes cannot take) a COCO with no detection."""
    if results:
        return coco_gt.loadRes([{**r, "bbox": [float(v) for v in r["bbox"]], "score": float(r["score"])}
                                for r in results])
    dt = COCO()
    dt.dataset = {"images": copy.deepcopy(coco_gt.dataset["images"]), "annotations": [],
                  "categories": copy.deepcopy(coco_gt.dataset["categories"])}
    dt.createIndex()
    return dt


def coco_evaluate(coco_gt: COCO, results: list[dict], *, img_ids=None, verbose: bool = False) -> dict[str, float]:
    """AP, AP50, AP75, APs, APm, APl (floats) of ``results`` against ``coco_gt`` (module doc)."""
    if not isinstance(coco_gt, COCO):
        raise ValueError(f"coco_gt is a {type(coco_gt).__name__}: expected a pycocotools COCO (dataset.coco)")
    _check_results(coco_gt, results)
    cats = set(coco_gt.getCatIds())
    results = [r for r in results if r["category_id"] in cats]  # COCOeval would ignore them anyway
    quiet = contextlib.nullcontext() if verbose else contextlib.redirect_stdout(io.StringIO())
    with quiet:
        coco_dt = _load_results(coco_gt, results)
        ev = COCOeval(coco_gt, coco_dt, iouType="bbox")
        if img_ids is not None:
            ids = sorted({int(i) for i in img_ids})
            unknown = sorted(set(ids) - set(coco_gt.getImgIds()))
            if unknown:
                raise ValueError(f"img_ids has {unknown[:5]}, not images of the ground truth")
            ev.params.imgIds = ids
        ev.evaluate()
        ev.accumulate()
        ev.summarize()
    stats = np.asarray(ev.stats, dtype=np.float64)
    return {k: float(v) for k, v in zip(KEYS, stats[:6])}
