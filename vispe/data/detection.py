"""vispe.data.detection: detection data sets by name, and the batch collate.

    from vispe.data.detection import build_detection_dataset, collate_detection, detection_info
    info = detection_info("shapes")                        # DetectionInfo(num_classes=6, ...)
    ds = build_detection_dataset("shapes", "train")        # written on first use, then read as COCO
    image, target = ds[0]                                  # (3, H, W); boxes (N, 4) cx, cy, w, h in [0, 1]
    images, mask, targets = collate_detection([ds[0], ds[1]], size_divisibility=32)

Names: ``coco`` (COCO 2017 under ``root``, ``vispe.data.coco``) and ``shapes`` (embedded,
``vispe.data.shapes``). Both are read by ``CocoDetectionSet``: items ``(image float32 (3, H, W)
normalised with info.mean/std, target)``, target ``boxes`` float32 (N, 4) normalised (cx, cy, w,
h) of the transformed image, ``labels`` int64 (N,) category ids, ``image_id`` int64 (),
``orig_size`` int64 (2,) (h, w) of the file, ``size`` int64 (2,) (h, w) after the transforms;
``ds.coco`` is the split's pycocotools COCO for ``vispe.data.coco_eval.coco_evaluate``.

Labels are the category ids, as DETR: ``num_classes = max id + 1`` (91 for COCO, so DETR's
weights fit; 6 for shapes, id 0 unused), the model adding its "no object" class after them.
"""
from __future__ import annotations

import difflib
import os
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as nnf

from vispe import _checks
from vispe.data import coco as coco_mod, shapes as shapes_mod
from vispe.data.coco import CocoDetectionSet
from vispe.data.det_transforms import DETR_MAX_SIZE, DETR_SIZE

__all__ = ["DetectionInfo", "available_detection_datasets", "build_detection_dataset", "collate_detection",
           "detection_info"]


@dataclass(frozen=True)
class DetectionInfo:
    """What a detector needs to know about a data set: ``num_classes`` = max category id + 1,
    ``category_names`` {id: name}, per-channel ``mean`` / ``std`` the images are normalised with,
    ``in_chans``; ``img_size`` / ``max_size``: the default evaluation shorter side and its cap."""

    num_classes: int
    category_names: dict
    mean: tuple[float, ...]
    std: tuple[float, ...]
    in_chans: int = 3
    img_size: int = DETR_SIZE
    max_size: int = DETR_MAX_SIZE


def _info(categories: dict, img_size: int, max_size: int) -> DetectionInfo:
    return DetectionInfo(num_classes=max(categories) + 1, category_names=dict(categories), mean=coco_mod.MEAN,
                         std=coco_mod.STD, img_size=img_size, max_size=max_size)


def _check_root(root) -> None:
    if root is not None and not isinstance(root, (str, os.PathLike)):
        raise ValueError(f"root={root!r}: expected a folder path (str or os.PathLike) or None")


def _coco_info(root=None, **kwargs) -> DetectionInfo:
    """COCO's 80 categories (ids 1..90); with ``root``, the categories of the files found there."""
    if kwargs:
        raise ValueError(f"unknown option(s) {', '.join(f'{k}={v!r}' for k, v in kwargs.items())} for data set "
                         "'coco'; it takes none")
    _check_root(root)
    cats = coco_mod.CATEGORIES if root is None else coco_mod.categories_of(root)
    return _info(cats, DETR_SIZE, DETR_MAX_SIZE)


def _shapes_info(root=None, **kwargs) -> DetectionInfo:
    _check_root(root)
    shapes_mod.shapes_options(kwargs)
    return _info(shapes_mod.CATEGORIES, shapes_mod.IMG_SIZE, shapes_mod.MAX_SIZE)


def _sizes(img_size, max_size, info: DetectionInfo) -> tuple[int, int]:
    """Defaults: the info's sizes; ``max_size`` alone missing scales with ``img_size`` (DETR: 1333/800)."""
    if img_size is None:
        img_size = info.img_size
    _checks.positive_int("img_size", img_size)
    if max_size is None:
        max_size = round(img_size * info.max_size / info.img_size)
    return img_size, max_size


def _build_coco(split, *, root, img_size, max_size, train_augment, seed, download, **kwargs):
    info = _coco_info(**kwargs)
    _checks.positive_int("seed", seed, allow_zero=True)  # the data are fixed; augmentation uses torch's RNG
    root = coco_mod.data_root() / "coco" if root is None else root
    if download is True:
        raise ValueError("download=True: vispe does not download COCO; " + coco_mod.DOWNLOAD_HELP.format(root=root))
    ds = CocoDetectionSet(root, split, img_size=img_size, max_size=max_size, mean=info.mean, std=info.std,
                          train_augment=train_augment)
    ds.info = _info(ds.categories, info.img_size, info.max_size)
    return ds


def _build_shapes(split, *, root, img_size, max_size, train_augment, seed, download, **kwargs):
    info = _shapes_info(**kwargs)
    folder = shapes_mod.ensure_shapes(root, seed, **kwargs)  # nothing to download: ``download`` is moot
    ds = CocoDetectionSet(folder, split, img_size=img_size, max_size=max_size, mean=info.mean, std=info.std,
                          train_augment=train_augment)
    ds.info = info
    return ds


_DATASETS: dict[str, tuple[Callable, Callable]] = {"coco": (_coco_info, _build_coco),
                                                   "shapes": (_shapes_info, _build_shapes)}


def available_detection_datasets() -> list[str]:
    return sorted(_DATASETS)


def _get(name: str) -> tuple[Callable, Callable]:
    if name not in _DATASETS:
        near = difflib.get_close_matches(str(name), list(_DATASETS), n=2)
        hint = f" (did you mean {', '.join(near)}?)" if near else ""
        raise ValueError(f"name={name!r}: unknown detection data set{hint}; expected one of "
                         f"{', '.join(available_detection_datasets())}")
    return _DATASETS[name]


def detection_info(name: str, root=None, **kwargs) -> DetectionInfo:
    """Classes, category names, normalisation and default sizes of detection data set ``name``."""
    return _get(name)[0](root=root, **kwargs)


def _check_augment(train_augment, split: str):
    if train_augment is None or train_augment is True:
        mode = "default"
    elif train_augment is False:
        mode = "none"
    elif callable(train_augment) or train_augment in ("default", "none", "square"):
        mode = train_augment
    else:
        raise ValueError(f"train_augment={train_augment!r}: expected None, True, False, 'default', 'none', 'square' "
                         "(resize to img_size x img_size), or a callable (image, target) -> (image, target) "
                         "replacing DETR's flip/resize/crop")
    return mode if split == "train" else "none"


def build_detection_dataset(name: str, split: str, *, root=None, img_size=None, max_size=None, train_augment=None,
                            seed: int = 0, download: bool = False, **kwargs):
    """Split ``split`` ("train" or "val") of detection data set ``name`` as a ``CocoDetectionSet``.

    ``img_size``: the evaluation shorter side and the largest training scale (default: the data
    set's, 800 for COCO, 128 for shapes); ``max_size``: cap on the longer side (default scaled
    with ``img_size`` from 1333/800 resp. 192/128). ``train_augment``: None / True / "default"
    (DETR's augmentation), False / "none" (the eval resize), or a callable replacing DETR's
    geometric step (see ``vispe.data.det_transforms``); the val split is never augmented.
    ``seed``: the shapes generator's seed (COCO: no effect). ``download``: COCO is never
    downloaded (True is refused with where to get it); shapes is generated on first use.
    """
    info_fn, build_fn = _get(name)
    _checks.choice("split", split, coco_mod.SPLITS)
    _check_root(root)
    if not isinstance(download, bool):
        raise ValueError(f"download={download!r}: expected True or False")
    info = info_fn(**kwargs)  # checks the options first
    img_size, max_size = _sizes(img_size, max_size, info)
    return build_fn(split, root=root, img_size=img_size, max_size=max_size,
                    train_augment=_check_augment(train_augment, split), seed=seed, download=download, **kwargs)


def collate_detection(batch, size_divisibility: int = 1):
    """``[(image (C, h_i, w_i), target), ...]`` -> ``(images (B, C, H, W), mask (B, H, W), targets)``.

    Images are padded with zeros at the bottom and right to the batch's largest height and width,
    each rounded up to a multiple of ``size_divisibility``; ``mask`` is True on every padded pixel,
    the divisibility padding included; ``targets`` is the list of target dicts, unchanged.
    """
    _checks.positive_int("size_divisibility", size_divisibility)
    if not batch:
        raise ValueError("batch=[]: expected at least one (image, target) pair")
    images = [img for img, _ in batch]
    if any(not isinstance(x, torch.Tensor) or x.dim() != 3 or x.shape[0] != images[0].shape[0] for x in images):
        shapes = [tuple(x.shape) if isinstance(x, torch.Tensor) else type(x).__name__ for x in images]
        raise ValueError(f"batch images have shapes {shapes}: expected tensors (C, h, w) with one C")
    d = size_divisibility
    H = -(-max(x.shape[1] for x in images) // d) * d
    W = -(-max(x.shape[2] for x in images) // d) * d
    out = torch.stack([nnf.pad(x, (0, W - x.shape[2], 0, H - x.shape[1])) for x in images])  # (B, C, H, W)
    mask = torch.ones(len(images), H, W, dtype=torch.bool)  # (B, H, W) True = padding
    for m, x in zip(mask, images):
        m[: x.shape[1], : x.shape[2]] = False
    return out, mask, [t for _, t in batch]
