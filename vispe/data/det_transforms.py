"""DETR's detection transforms, written with ``torchvision.transforms.v2`` (box-aware throughout).

``DetectionTransform(train, img_size, max_size, mean, std, augment)`` is called on what
``torchvision.datasets.wrap_dataset_for_transforms_v2(CocoDetection(...))`` yields, a PIL image
and ``{"image_id", "boxes": BoundingBoxes (N, 4) XYXY, "labels", "iscrowd"}``, and returns

    image  float32 (3, H, W), normalised with ``mean`` / ``std``
    target {"boxes": float32 (N, 4) normalised (cx, cy, w, h) in [0, 1] of the output image,
            "labels": int64 (N,) category ids, "image_id": int64 (), "orig_size": int64 (2,) (h, w)
            of the file, "size": int64 (2,) (h, w) of the output image}

Steps, as DETR (facebookresearch/detr ``datasets/coco.py`` and ``datasets/transforms.py``):

1. Crowd annotations (``iscrowd=1``) are dropped from the target (COCOeval still sees them
   through the ground-truth JSON). Boxes are clamped to the image (``v2.ClampBoundingBoxes``) and
   boxes left without area are dropped (``v2.SanitizeBoundingBoxes``). One difference: torchvision
   drops boxes under 1 pixel on a side (its smallest ``min_size``) where DETR keeps any positive
   size; the same rule runs again after the random crop and resizes.
2. Train (``augment="default"``): ``RandomHorizontalFlip`` -> one of, with equal chance,
   ``RandomShortestSize(scales, max_size)`` or ``RandomShortestSize(crop_resize) ->
   RandomSizeCrop(*crop) -> RandomShortestSize(scales, max_size)``. ``augment="none"``: the eval
   resize. A callable ``augment(image, target)`` replaces this step (it gets the PIL image and the
   XYXY ``BoundingBoxes`` target and must return both, e.g. any ``v2`` transform).
   Eval: ``Resize(img_size, max_size=max_size)`` (shorter side to ``img_size``, longer side capped).
3. ``ToImage -> ToDtype(float32, scale=True) -> Normalize(mean, std)``; boxes to normalised
   (cx, cy, w, h).

Scales follow ``img_size`` (``detr_scales``): DETR's values at 800 (train shorter sides 480..800
step 32, crop-path resize 400/500/600, crop sides 384..600) are each multiplied by
``img_size / 800`` and rounded (duplicates dropped), so ``img_size=800`` gives exactly DETR's.
``max_size`` caps the longer side everywhere (DETR: 1333 at 800). Randomness comes from torch's
generator (``torch.manual_seed``, or the DataLoader's per-worker seeds).
"""
from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torchvision import tv_tensors
from torchvision.transforms import v2
from torchvision.transforms.v2 import functional as F

from vispe import _checks

DETR_SIZE, DETR_MAX_SIZE = 800, 1333
DETR_SCALES = tuple(range(480, 801, 32))  # 480, 512, ..., 800
DETR_CROP_RESIZE = (400, 500, 600)
DETR_CROP = (384, 600)  # RandomSizeCrop(min_size, max_size)


def scale_list(values, img_size: int) -> tuple[int, ...]:
    """``values`` (pixels at DETR's 800) times ``img_size / 800``, rounded, sorted, without duplicates."""
    _checks.positive_int("img_size", img_size)
    return tuple(sorted({max(1, round(v * img_size / DETR_SIZE)) for v in values}))


def detr_scales(img_size: int) -> dict[str, tuple[int, ...]]:
    """DETR's train-time sizes scaled to ``img_size``: ``scales``, ``crop_resize`` and ``crop`` (min, max)."""
    lo, hi = (max(1, round(v * img_size / DETR_SIZE)) for v in DETR_CROP)
    return dict(scales=scale_list(DETR_SCALES, img_size), crop_resize=scale_list(DETR_CROP_RESIZE, img_size),
                crop=(lo, hi))


class RandomSizeCrop(v2.Transform):
    """DETR's ``RandomSizeCrop``: a crop ``ch x cw`` at a uniformly random place, with
    ``ch`` uniform in ``[min_size, min(H, max_size)]`` and ``cw`` likewise in W (``min_size`` is
    lowered to the image side when the image is smaller). Boxes, masks and images go through
    ``v2.functional.crop`` (boxes are clamped to the crop; follow with ``SanitizeBoundingBoxes``).
    """

    def __init__(self, min_size: int, max_size: int) -> None:
        super().__init__()
        self.min_size = _checks.positive_int("min_size", min_size)
        self.max_size = _checks.positive_int("max_size", max_size)
        if max_size < min_size:
            raise ValueError(f"max_size={max_size}: expected at least min_size={min_size}")

    def make_params(self, flat_inputs: list[Any]) -> dict[str, Any]:
        h, w = v2.query_size(flat_inputs)
        ch = int(torch.randint(min(self.min_size, h), min(h, self.max_size) + 1, ()))
        cw = int(torch.randint(min(self.min_size, w), min(w, self.max_size) + 1, ()))
        top = int(torch.randint(0, h - ch + 1, ()))
        left = int(torch.randint(0, w - cw + 1, ()))
        return dict(top=top, left=left, height=ch, width=cw)

    def transform(self, inpt: Any, params: dict[str, Any]) -> Any:
        return self._call_kernel(F.crop, inpt, **params)


def detr_train_geometry(img_size: int, max_size: int) -> v2.Transform:
    """DETR's random flip and resize / resize-crop-resize choice at ``img_size`` (see module doc)."""
    s = detr_scales(img_size)
    resize = v2.RandomShortestSize(list(s["scales"]), max_size=max_size)
    crop_path = v2.Compose([v2.RandomShortestSize(list(s["crop_resize"])), RandomSizeCrop(*s["crop"]),
                            v2.RandomShortestSize(list(s["scales"]), max_size=max_size)])
    return v2.Compose([v2.RandomHorizontalFlip(), v2.RandomChoice([resize, crop_path])])


def eval_resize(img_size: int, max_size: int) -> v2.Transform:
    """Shorter side to ``img_size``, longer side at most ``max_size`` (torchvision's rounding)."""
    return v2.Resize(img_size, max_size=max_size)


def check_sizes(img_size, max_size) -> tuple[int, int]:
    _checks.positive_int("img_size", img_size)
    _checks.positive_int("max_size", max_size)
    if max_size <= img_size:
        raise ValueError(f"max_size={max_size}: expected more than img_size={img_size} (the longer side's cap)")
    return img_size, max_size


def _prepare(image, target: dict) -> tuple[Any, dict]:
    """Wrapper output -> (image, {boxes XYXY BoundingBoxes, labels int64}) without crowd annotations."""
    h, w = F.get_size(image)
    boxes = target.get("boxes")
    if boxes is None:  # the wrapper returns only image_id for an image with no annotation
        boxes = tv_tensors.BoundingBoxes(torch.zeros(0, 4), format="XYXY", canvas_size=(h, w))
        labels = torch.zeros(0, dtype=torch.int64)
    else:
        labels = torch.as_tensor(target["labels"], dtype=torch.int64)
        keep = torch.as_tensor(target["iscrowd"]) == 0  # (N,) DETR: crowd regions are no training target
        # float32: the wrapper makes int64 boxes from integer JSON values, which resizing would truncate
        boxes, labels = tv_tensors.wrap(boxes[keep].float(), like=boxes), labels[keep]
    return image, {"boxes": boxes, "labels": labels, "image_id": int(target["image_id"]), "orig_size": (h, w)}


class DetectionTransform:
    """The whole per-sample pipeline (module doc); ``train`` selects DETR's augmentation."""

    def __init__(self, train: bool, img_size: int, max_size: int, mean, std,
                 augment: str | Callable = "default") -> None:
        self.train, (self.img_size, self.max_size) = train, check_sizes(img_size, max_size)
        if callable(augment) and train:
            geometry = augment
        elif train and augment == "default":
            geometry = detr_train_geometry(img_size, max_size)
        elif train and augment == "square":  # the square resize real-time DETRs train with (RF-DETR's default)
            geometry = v2.Resize((img_size, img_size))
        else:
            geometry = eval_resize(img_size, max_size)
        self.augment = augment if train else "none"
        self.pipeline = v2.Compose([
            v2.ClampBoundingBoxes(), v2.SanitizeBoundingBoxes(),  # DETR: clamp to the image, drop empty boxes
            geometry,
            v2.SanitizeBoundingBoxes(),  # boxes cropped away or shrunk below a pixel
            v2.ToImage(), v2.ToDtype(torch.float32, scale=True), v2.Normalize(list(mean), list(std)),
        ])

    def __call__(self, image, target: dict) -> tuple[torch.Tensor, dict]:
        image, target = _prepare(image, target)
        image, target = self.pipeline(image, target)
        h, w = image.shape[-2:]
        boxes = F.convert_bounding_box_format(target["boxes"], new_format=tv_tensors.BoundingBoxFormat.CXCYWH)
        scale = torch.tensor([w, h, w, h], dtype=torch.float32)
        out = {
            "boxes": boxes.as_subclass(torch.Tensor).float() / scale,  # (N, 4) normalised cx, cy, w, h
            "labels": target["labels"],  # (N,)
            "image_id": torch.tensor(target["image_id"], dtype=torch.int64),  # ()
            "orig_size": torch.tensor(target["orig_size"], dtype=torch.int64),  # (2,) as (h, w)
            "size": torch.tensor([h, w], dtype=torch.int64),  # (2,)
        }
        return image.as_subclass(torch.Tensor), out

    def __repr__(self) -> str:
        return (f"DetectionTransform(train={self.train}, img_size={self.img_size}, max_size={self.max_size}, "
                f"augment={self.augment!r})")
